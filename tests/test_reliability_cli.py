"""The `ort-flash` CLI under bad input, run as a user runs it (a child process): corrupt,
truncated, empty and non-ONNX files, bad arguments and a broken custom-op library give one
error line and a non-zero exit code, never a traceback or a crash; `rewrite` writes its output
atomically (a failed run leaves no file, not even a partial one, keeps an existing output
intact) and never touches its input."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ort_flash.demo import demo_model_path

DEMO = Path(demo_model_path("cpu"))


def cli(*args, env=None, code=None, timeout=180):
    """Runs `python -m ort_flash.cli ARGS` (or `code`, a script) in a child process."""
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "ort_flash.cli"]
    return subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def assert_user_error(proc, *fragments, rc=2):
    err = proc.stderr
    assert proc.returncode == rc, f"exit code {proc.returncode}\n{proc.stdout[-2000:]}\n{err[-3000:]}"
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    for f in fragments:
        assert f in errors[0], errors[0]


def _tiny_model() -> bytes:
    """A valid one-node model (nothing to fuse): rewrite reads, rewrites and writes it quickly."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model.SerializeToString()


def _external_data_missing(folder: Path) -> Path:
    w = onnx.numpy_helper.from_array(np.ones(64, np.float32), "w")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    path = folder / "external.onnx"
    onnx.save_model(model, path, save_as_external_data=True, location="external.bin",
                    size_threshold=0)
    (folder / "external.bin").unlink()
    return path


BAD_FILES = {
    "empty": b"",
    "text": b"this is not an onnx model\n",
    "json": b'{"graph": {"node": []}}\n',
    "png_header": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
    "random_bytes": np.random.default_rng(0).bytes(4096),
    "zeros": bytes(1024),
    "truncated_300_bytes": "head",
    "truncated_half": "half",
    "gzipped_model": "gzip",
    "tensor_proto": onnx.numpy_helper.from_array(np.ones(3, np.float32), "t").SerializeToString(),
    "external_data_missing": "external",
    "invalid_graph": "invalid",  # parses, but a node reads a tensor nothing produces
    "directory": "dir",
    "missing": "missing",
}


def make_bad_file(name: str, folder: Path) -> Path:
    """BAD_FILES[name] as folder/model.onnx (folder is created; it holds nothing else)."""
    content = BAD_FILES[name]
    demo = DEMO.read_bytes()
    path = folder / "model.onnx"
    folder.mkdir(parents=True)
    if content == "head":
        content = demo[:300]
    elif content == "half":
        content = demo[: len(demo) // 2]
    elif content == "gzip":
        content = gzip.compress(demo)
    if content == "external":
        return _external_data_missing(path.parent)
    if content == "invalid":
        graph = helper.make_graph([helper.make_node("Softmax", ["nowhere"], ["y"], axis=-1)], "g",
                                  [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
                                  [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])])
        content = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()
    if content == "dir":
        path.mkdir()
    elif content != "missing":
        path.write_bytes(content)
    return path


def _snapshot(folder: Path) -> dict:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.iterdir())}


IN_PROCESS_CHILD = """
import contextlib, io, json, sys
from ort_flash.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse's usage errors
            rc = e.code
    results.append([rc, err.getvalue()])
print(json.dumps(results))
"""


def cli_many(argvs) -> list:
    """[(exit code, stderr)] of main(argv) for each argv, all in one child process (the CLI's
    import takes seconds). An exception escaping main() -- what would print a traceback --
    fails the child and the test."""
    proc = cli(json.dumps([[str(a) for a in argv] for argv in argvs]), code=IN_PROCESS_CHILD)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_every_command_on_every_bad_file(tmp_path):
    # rewrite the bad file; verify it as the original and as the rewritten model.
    ins = {name: make_bad_file(name, tmp_path / name / "in") for name in BAD_FILES}
    outs = {name: tmp_path / name / "out" for name in BAD_FILES}
    for folder in outs.values():
        folder.mkdir(parents=True)
    before = {name: _snapshot(path.parent) for name, path in ins.items()}
    argvs = []
    for name, path in ins.items():
        argvs += [["rewrite", path, "-o", outs[name] / "m.flash.onnx", "--report", outs[name] / "r.json"],
                  ["verify", path, DEMO], ["verify", DEMO, path]]
    for argv, (rc, err) in zip(argvs, cli_many(argvs)):
        assert rc == 2 and err.count("\n") == 1 and err.startswith("ort-flash: error: "), (argv, rc, err)
        assert "Traceback" not in err
    for name in BAD_FILES:
        assert list(outs[name].iterdir()) == [], f"{name}: a failed rewrite left files behind"
        assert _snapshot(ins[name].parent) == before[name], f"{name}: the input folder changed"


@pytest.mark.parametrize("name", ["truncated_half", "external_data_missing"])
def test_console_entry_point_prints_one_line(name, tmp_path):
    # The same through `python -m ort_flash.cli`, the console script's code path.
    path = make_bad_file(name, tmp_path / "in")
    assert_user_error(cli("rewrite", path, "-o", tmp_path / "out.onnx"), path.name)
    assert_user_error(cli("verify", DEMO, path), path.name)


def test_verify_model_onnxruntime_cannot_load(tmp_path):
    # Valid protobuf, invalid graph: ONNX Runtime's refusal becomes one error line.
    graph = helper.make_graph([helper.make_node("Softmax", ["missing"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    path = tmp_path / "broken.onnx"
    path.write_bytes(model.SerializeToString())
    assert_user_error(cli("verify", path, path), "onnxruntime")


def test_bad_arguments():
    argvs = [["demo", "--seq-lens", "0"], ["demo", "--seq-lens", "-3"], ["demo", "--repeat", "-1"],
             ["demo", "--seq-lens", "abc"], ["demo", "--provider", "tpu"],
             ["verify", "--batch", "0", "a.onnx", "b.onnx"], ["verify", "--seq-len", "-1", "a.onnx", "b.onnx"],
             ["verify", "a.onnx"], ["rewrite", "in.onnx"], ["nonsense"], []]
    for argv, (rc, err) in zip(argvs, cli_many(argvs)):
        errors = [line for line in err.splitlines() if "error:" in line]
        assert rc == 2 and len(errors) == 1 and "Traceback" not in err, (argv, rc, err)


def _broken_library(kind: str, folder: Path) -> Path:
    import ort_flash

    lib = Path(ort_flash.library_path()).read_bytes()
    path = folder / "libort_flash.so"
    path.write_bytes({"truncated": lib[:4096], "text": b"not a library\n"}.get(kind, b""))
    if kind == "missing":
        path.unlink()
    return path


@pytest.mark.parametrize("kind", ["truncated", "text", "missing"])
def test_demo_and_verify_with_a_broken_library(kind, tmp_path):
    # ORT_FLASH_LIBRARY at a bad file: one error line, never a crash. (A truncated shared
    # library would fault the process with SIGBUS inside dlopen; ort_flash refuses it first.)
    env = {"ORT_FLASH_LIBRARY": str(_broken_library(kind, tmp_path))}
    assert_user_error(cli("verify", DEMO, DEMO, env=env), "libort_flash.so")
    if kind == "truncated":
        assert_user_error(cli("demo", "--provider", "cpu", "--seq-lens", "16", "--repeat", "1", env=env),
                          "truncated")


def test_info_with_a_broken_library(tmp_path):
    proc = cli("info", env={"ORT_FLASH_LIBRARY": str(_broken_library("truncated", tmp_path))})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


# ---- atomic output ---------------------------------------------------------------------------

def test_rewrite_keeps_an_existing_output_when_it_fails(tmp_path):
    out = tmp_path / "model.flash.onnx"
    out.write_bytes(b"previous output")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(DEMO.read_bytes()[:1000])
    assert_user_error(cli("rewrite", bad, "-o", out))
    assert out.read_bytes() == b"previous output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx", "model.flash.onnx"]


FAILING_WRITE = """
import os, signal, sys
import onnx
def failing_save(model, path, *args, **kwargs):
    with open(path, "wb") as f:  # half a model, then the failure
        f.write(model.SerializeToString()[:1000])
    if {kill}:
        os.kill(os.getpid(), signal.SIGKILL)
    raise OSError(28, "No space left on device")
onnx.save_model = failing_save
from ort_flash.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("kill", [False, True], ids=["disk_full", "killed"])
def test_rewrite_never_leaves_a_partial_output(tmp_path, kill):
    # The model write fails half way (disk full) or the process is killed half way: the output
    # path keeps its previous content, the input is untouched.
    model = tmp_path / "model.onnx"
    model.write_bytes(_tiny_model())
    out = tmp_path / "model.flash.onnx"
    out.write_bytes(b"previous output")
    before = (model.stat().st_mtime_ns, model.read_bytes())
    proc = cli("rewrite", model, "-o", out, code=textwrap.dedent(FAILING_WRITE.format(kill=kill)))
    if kill:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert_user_error(proc, "No space left on device")
        leftovers = sorted(p.name for p in tmp_path.iterdir())
        assert leftovers == ["model.flash.onnx", "model.onnx"], leftovers
    assert out.read_bytes() == b"previous output"
    assert (model.stat().st_mtime_ns, model.read_bytes()) == before


def test_rewrite_success_leaves_only_the_output(tmp_path):
    model = tmp_path / "model.onnx"
    model.write_bytes(_tiny_model())
    before = (model.stat().st_mtime_ns, model.read_bytes())
    out = tmp_path / "model.flash.onnx"
    proc = cli("rewrite", model, "-o", out)
    assert proc.returncode == 3, proc.stderr  # written, but nothing fused (test_cli_honesty.py)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.flash.onnx", "model.onnx"]
    assert (model.stat().st_mtime_ns, model.read_bytes()) == before
    onnx.checker.check_model(onnx.load(out))
