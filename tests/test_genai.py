"""ONNX Runtime GenAI folders: GenAI's model builder output for five LLM families (LLaMA, Qwen2,
Mistral and Gemma 2 with their window-sized and full KV caches, Phi-3) generates through
onnxruntime_genai, and ``ort-flash rewrite FOLDER -o OUT`` writes a folder whose every
GroupQueryAttention is ort_flash's, that loads libort_flash.so through genai_config.json and
generates the same 32 greedy tokens with the same logits at every step (float32 rounding), one
prompt and a batch of two of different lengths.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("onnxruntime_genai", reason="onnxruntime_genai (onnxruntime-genai) is not installed")

from _genai import generate_greedy, write_identity  # noqa: E402
from lab.models.genai_family import EXTRA, FAMILIES, WINDOWED_KV, build  # noqa: E402
from ort_flash import genai  # noqa: E402
from ort_flash._library import LIBRARY_NAME  # noqa: E402

pytestmark = pytest.mark.slow  # seven builder runs (about 20-40 s each) on a cold cache

STEPS = 32
# Longer than the sliding windows (lab.models.genai_family.WINDOW) before generation starts.
PROMPT = "the red cat runs under the big green tree near the river and sees a small bird"
SHORT = "one old dog"


# gpt-oss and the builder's other decoders (EXTRA) stay out of this CPU sweep to spare CI's time
# (their builds and GenAI runs); test_genai_fidelity.py checks them, gpt-oss through GenAI's
# generator too.
@pytest.fixture(scope="module", params=sorted(set(FAMILIES) - {"gptoss"} - set(EXTRA)))
def family_folder(request):
    return request.param, build(request.param)


@pytest.fixture(scope="module")
def flash_folder(family_folder, tmp_path_factory):
    """``ort-flash rewrite`` of the family's folder: every GroupQueryAttention swapped."""
    import onnx

    from ort_flash import cli

    family, folder = family_folder
    work = tmp_path_factory.mktemp(f"{family}-flash")
    out, report = work / "model", work / "report.json"
    assert cli.main(["rewrite", str(folder), "-o", str(out), "--report", str(report)]) == 0
    layers = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["num_hidden_layers"]
    counts = json.loads(report.read_text())["counts"]
    assert counts["group_query_attention"] == layers, counts
    decoder = onnx.load(str(out / genai.open_folder(out).decoder.name), load_external_data=False)
    ops = {(n.domain, n.op_type) for n in decoder.graph.node}
    assert ("ort_flash", "GroupQueryAttention") in ops and ("com.microsoft", "GroupQueryAttention") not in ops
    return out


@pytest.fixture(scope="module")
def identity_folder(family_folder, tmp_path_factory):
    family, folder = family_folder
    out = tmp_path_factory.mktemp(f"{family}-identity") / "model"
    source = genai.open_folder(folder)
    return genai.write_folder(folder, out, write_identity(source.decoder))


def test_original_generates(family_folder):
    _, folder = family_folder
    tokens, logits = generate_greedy(folder, [PROMPT], STEPS)
    assert tokens.shape == (1, STEPS) and logits.shape[:2] == (STEPS, 1)
    np.testing.assert_array_equal(tokens[0], logits[:, 0].argmax(-1))  # greedy: each step's argmax


# The rewritten decoder sums attention in another order than ONNX Runtime's op: float32 rounding.
ATOL, RTOL = 1e-4, 1e-4


def test_rewritten_folder_generates_the_same(family_folder, flash_folder):
    _, folder = family_folder
    tokens, logits = generate_greedy(folder, [PROMPT], STEPS)
    flash_tokens, flash_logits = generate_greedy(flash_folder, [PROMPT], STEPS)
    np.testing.assert_array_equal(flash_tokens, tokens)
    np.testing.assert_allclose(flash_logits, logits, rtol=RTOL, atol=ATOL)


def test_identity_folder_generates_the_same(family_folder, identity_folder):
    """The folder plumbing alone (the decoder written back unchanged): bit for bit."""
    _, folder = family_folder
    tokens, logits = generate_greedy(folder, [PROMPT], STEPS)
    same_tokens, same_logits = generate_greedy(identity_folder, [PROMPT], STEPS)
    np.testing.assert_array_equal(same_tokens, tokens)
    np.testing.assert_allclose(same_logits, logits, rtol=0, atol=1e-5)


def test_batch_of_two_lengths(family_folder, flash_folder):
    """Two prompts of different lengths in one batch (GenAI pads the short one): each row
    generates what the prompt alone does, and the written folder gives the same batch."""
    family, folder = family_folder
    try:
        tokens, logits = generate_greedy(folder, [PROMPT, SHORT], STEPS)
    except RuntimeError as e:
        # ORT 1.31/1.32's GroupQueryAttention with sliding_window_cache=1 refuses the padded row
        # ("seqlens_k[1] = 2 is too small for sequence_length 17"); the -fullkv builds run it.
        if family in WINDOWED_KV and "seqlens_k" in str(e):
            pytest.xfail(f"GenAI cannot run a padded batch through a window-sized KV cache: {e}")
        raise
    assert tokens.shape == (2, STEPS)
    for row, prompt in enumerate([PROMPT, SHORT]):
        alone_tokens, alone_logits = generate_greedy(folder, [prompt], STEPS)
        np.testing.assert_array_equal(tokens[row], alone_tokens[0])
        np.testing.assert_allclose(logits[:, row], alone_logits[:, 0], rtol=0, atol=1e-5)
    flash_tokens, flash_logits = generate_greedy(flash_folder, [PROMPT, SHORT], STEPS)
    np.testing.assert_array_equal(flash_tokens, tokens)
    np.testing.assert_allclose(flash_logits, logits, rtol=RTOL, atol=ATOL)


def test_written_folder_loads_the_library(flash_folder, tmp_path):
    """genai_config.json names the copy of libort_flash.so in the folder, GenAI maps it into the
    process, and a missing or broken copy fails the model's load with the library's name."""
    config = json.loads((flash_folder / "genai_config.json").read_text())
    assert config["model"]["decoder"]["session_options"]["custom_ops_library"] == LIBRARY_NAME
    assert (flash_folder / LIBRARY_NAME).is_file()
    assert _mapped_after_load(flash_folder) == str((flash_folder / LIBRARY_NAME).resolve())

    broken = tmp_path / "broken"
    shutil.copytree(flash_folder, broken)
    (broken / LIBRARY_NAME).write_bytes(b"not a library")
    assert LIBRARY_NAME in _load_error(broken)
    (broken / LIBRARY_NAME).unlink()
    assert LIBRARY_NAME in _load_error(broken)


def test_library_must_lie_in_the_folder(flash_folder, tmp_path):
    """Why write_folder copies the library: GenAI (0.18.0) takes a custom_ops_library only from
    the model folder, an EP's library folder or the working directory, after resolving links,
    so neither an absolute path to the installed library nor a link to it loads."""
    import ort_flash

    absolute = tmp_path / "absolute"
    shutil.copytree(flash_folder, absolute)
    config = json.loads((absolute / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["custom_ops_library"] = ort_flash.library_path()
    (absolute / "genai_config.json").write_text(json.dumps(config))
    linked = tmp_path / "linked"
    shutil.copytree(flash_folder, linked)
    (linked / LIBRARY_NAME).unlink()
    (linked / LIBRARY_NAME).symlink_to(ort_flash.library_path())
    for folder in (absolute, linked):
        run = _load_in_child(folder, cwd=tmp_path)
        assert run.returncode != 0 and "not within an allowed directory" in run.stderr


def _mapped_after_load(folder) -> str:
    """In a fresh process: load the GenAI model, then the path of the mapped libort_flash.so."""
    run = _load_in_child(folder, then=f"""
        maps = open("/proc/self/maps").read().split("\\n")
        print(next((l.split()[-1] for l in maps if l.endswith("{LIBRARY_NAME}")), ""))""")
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def _load_in_child(folder, cwd=None, then: str = "") -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import onnxruntime_genai as og
        model = og.Model({str(folder)!r})""") + textwrap.dedent(then)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd)


def _load_error(folder) -> str:
    """The error of loading the GenAI model, in a fresh process (in this one the library may
    already be loaded, by the rewrite's own load check)."""
    run = _load_in_child(folder)
    assert run.returncode != 0, f"{folder} loaded"
    return run.stderr
