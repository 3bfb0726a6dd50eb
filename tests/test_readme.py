"""Every snippet in the README runs, as written, so that it cannot rot: each `ort-flash ...` line
of its shell blocks through the CLI on the bundled demo model (copied to model.onnx in a scratch
folder, the lines run in order), the Python block against the same model, and the C++ block
compiled, linked against the onnxruntime wheel's library and run where a compiler and ONNX
Runtime's headers are found. The two quick-start commands are not run here: they set up a venv;
test_ci_script.py checks that there are two and that CI runs the test one; CI runs the deploy
block's commands (test_ci_script.py checks that it does)."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ort_flash
from ort_flash.demo import demo_model_path

from test_cpp_deploy import _cxx_compiler, _ort_include_dir, _ort_library

ROOT = Path(__file__).resolve().parents[1]
RUNNERS = ("sh", "python", "cpp", "text", "sh genai", "python genai", "sh optimum", "python optimum", "sh deploy")


def readme_blocks() -> list[tuple[str, str, str]]:
    """(section, language, text) of every fenced block, in order."""
    blocks, section = [], ""
    lines = (ROOT / "README.md").read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        if line.startswith("```"):
            lang, body = line[3:].strip(), []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append((section, lang, "\n".join(body) + "\n"))
        i += 1
    return blocks


def _blocks(lang: str) -> list[str]:
    return [text for section, language, text in readme_blocks()
            if language == lang and section != "Quick start"]


@pytest.fixture
def workdir(tmp_path) -> Path:
    """A scratch folder holding model.onnx, the bundled demo model (the shell block writes it
    again with `ort-flash demo --export`)."""
    shutil.copy(demo_model_path("cpu"), tmp_path / "model.onnx")
    return tmp_path


def test_readme_is_a_guide_without_history():
    """At most 250 lines, and no commit hash, issue number or link out of the repository: the runs
    behind its figures are named by date and machine, their history lives in docs/perf-notes.md."""
    import re

    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250, len(text.splitlines())
    assert not re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text)
    assert not re.findall(r"(?<![\w&])#\d{2,3}\b", text) and "../" not in text


def test_every_block_is_run_by_a_test():
    for section, lang, text in readme_blocks():
        if section == "Quick start":
            assert lang == "", "test_ci_script.py reads the quick start's blocks without a language"
            continue
        assert lang in RUNNERS, f"a ```{lang} block in {section!r} that no test runs"
        if lang == "text":  # the data-flow picture: no commands in it
            assert "──►" in text, text
    assert _blocks("sh") and len(_blocks("python")) == 1 and len(_blocks("cpp")) == 1


# Each line as main(argv) in one child process (the CLI's imports take seconds).
_RUN_LINES = """
import contextlib, io, json, shlex, sys
from ort_flash.cli import main
results = []
for line in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            rc = main(shlex.split(line, comments=True)[1:])
        except SystemExit as e:
            rc = e.code
    results.append([line, rc, out.getvalue()[-3000:]])
print(json.dumps(results))
"""


def test_readme_shell_lines_run(workdir):
    (workdir / "model.onnx").unlink()  # the first line writes it
    lines = []
    for text in _blocks("sh"):
        for line in text.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            assert shlex.split(line, comments=True)[0] == "ort-flash", f"not an ort-flash line: {line}"
            lines.append(line)
    proc = subprocess.run([sys.executable, "-c", _RUN_LINES, json.dumps(lines)], cwd=workdir,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for line, rc, out in json.loads(proc.stdout.splitlines()[-1]):
        assert rc == 0, f"{line}\nexit {rc}\n{out}\n{proc.stderr[-3000:]}"
    for name in ("model.flash.onnx", "report.json", "model.fp16.onnx", "bench.json"):
        assert (workdir / name).is_file(), name


def test_readme_python_block_runs(workdir):
    (code,) = _blocks("python")
    proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "fused attention subgraphs: 2" in proc.stdout, proc.stdout
    assert (workdir / "model.flash.onnx").is_file()


def test_readme_cpp_block_builds_and_runs(workdir):
    compiler, include, library = _cxx_compiler(), _ort_include_dir(), _ort_library()
    if not (compiler and include and library):
        pytest.skip("needs a C++ compiler, ONNX Runtime's headers (a build of ort_flash caches "
                    "them) and the onnxruntime wheel's libonnxruntime.so")
    (code,) = _blocks("cpp")
    (workdir / "main.cc").write_text(code)
    # The wheel ships libonnxruntime.so.1.x.y; the program asks for its SONAME.
    libdir = workdir / "lib"
    libdir.mkdir()
    soname = re.match(r"(libonnxruntime\.so\.\d+)", library.name).group(1)
    os.symlink(library, libdir / soname)
    build = subprocess.run([compiler, "-std=c++17", f"-I{include}", "main.cc", "-o", "main",
                            str(libdir / soname), f"-Wl,-rpath,{libdir}"],
                           cwd=workdir, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-4000:]
    shutil.copy(ort_flash.library_path(), workdir / "libort_flash.so")
    rewritten = ort_flash.rewrite(str(workdir / "model.onnx")).model
    (workdir / "model.flash.onnx").write_bytes(rewritten.SerializeToString())
    run = subprocess.run(["./main"], cwd=workdir, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.slow
def test_readme_genai_blocks_run(tmp_path):
    """The GenAI user's three steps as the README writes them, on a tiny random LLaMA folder:
    GenAI's builder, ``ort-flash rewrite`` of its folder, generation through onnxruntime_genai."""
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime_genai (onnxruntime-genai) is not installed")
    sys.path.insert(0, str(ROOT))
    from lab.models.genai_family import save_hf_folder

    save_hf_folder("llama", tmp_path / "llama-hf")
    (commands,) = [t for s, lang, t in readme_blocks() if lang == "sh genai"]
    (code,) = [t for s, lang, t in readme_blocks() if lang == "python genai"]
    for line in (ln for ln in commands.splitlines() if ln.strip()):
        argv = shlex.split(line)
        if argv[0] == "python":
            argv = [sys.executable, *argv[1:], "-c", str(tmp_path / "builder-cache")]
        else:
            assert argv[0] == "ort-flash", line
            argv = [sys.executable, "-m", "ort_flash.cli", *argv[1:]]
        run = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, f"{line}\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
        if argv[2:3] == ["rewrite"] or "rewrite" in argv:
            assert "group_query_attention: 2" in run.stdout, run.stdout
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip(), "no text generated"


# Stands in for the installed package inside the pinned Optimum environment (which has Optimum
# and ONNX Runtime but not this build of ort_flash): session_options() as the package's.
_SESSION_OPTIONS_SHIM = """
import onnxruntime as ort

def session_options(so=None):
    so = ort.SessionOptions() if so is None else so
    so.register_custom_ops_library({library!r})
    return so
"""

_TOKENIZER = """
import sys
import tokenizers
from transformers import PreTrainedTokenizerFast
words = ["the", "red", "cat", "runs", "a", "dog"] + [f"w{i}" for i in range(90)]
vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(words)}}
tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<unk>",
                        model_input_names=["input_ids", "attention_mask"]).save_pretrained(sys.argv[1])
"""


@pytest.mark.slow
def test_readme_optimum_blocks_run(tmp_path):
    """The Optimum user's steps as the README writes them, on the tiny GPT-2 with past that the
    Optimum family exports (a word-level tokenizer saved into its folder): rewrite and verify of
    the folder, then the Python block in the pinned Optimum environment, ort_flash's
    session_options() standing in by a shim that registers this build's library."""
    sys.path.insert(0, str(ROOT))
    from lab.models.optimum_family import OptimumSpec, export, venv_python

    spec = OptimumSpec("gpt2", "text-generation-with-past")
    shutil.copytree(export(spec, "model").parent, tmp_path / "gpt2-onnx")
    python = str(venv_python())
    made = subprocess.run([python, "-c", _TOKENIZER, str(tmp_path / "gpt2-onnx")], capture_output=True, text=True,
                          timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    (commands,) = [t for s, lang, t in readme_blocks() if lang == "sh optimum"]
    (code,) = [t for s, lang, t in readme_blocks() if lang == "python optimum"]
    for line in (ln for ln in commands.splitlines() if ln.strip()):
        argv = shlex.split(line)
        assert argv[0] == "ort-flash", line
        run = subprocess.run([sys.executable, "-m", "ort_flash.cli", *argv[1:]], cwd=tmp_path,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, f"{line}\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    shim = tmp_path / "shim" / "ort_flash"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(_SESSION_OPTIONS_SHIM.format(library=ort_flash.library_path()))
    env = dict(os.environ, PYTHONPATH=str(shim.parent))
    run = subprocess.run([python, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().startswith("the red cat"), run.stdout
