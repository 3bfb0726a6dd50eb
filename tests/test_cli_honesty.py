"""The `ort-flash` CLI says what happened, in its own terms, run as a user runs it (a child
process): a source checkout that shadows the installed package is named as such with what to do;
`verify --provider cuda` fails when the fused op did not run on CUDA; the rewrite report names the
CLI flags and fits 100 columns; verify states its pass rule; an unwritable output fails before the
work, naming the path; a model with nothing fused warns and exits 3 (nothing written with
--require-fusion); ONNX Runtime's optimizer is translated into the `--ort-fusions` flag."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

import ort_flash
from ort_flash.cli import common, verify_command
from ort_flash._cuda_device import cuda_device_arch
from ort_flash.rewriter.report import FusedSubgraph, RewriteReport, UnfusedSoftmax

from test_reliability_cli import DEMO, _tiny_model, assert_user_error, cli

WIDTH = 100


def _last_error(proc, *fragments, rc=2) -> str:
    """The CLI's own error line (the last line on stderr; ONNX Runtime may log before it)."""
    assert proc.returncode == rc, f"exit code {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("ort-flash: error: "), proc.stderr
    for f in fragments:
        assert f in line, line
    return line


# ---- (1) a source checkout that shadows the installed package -----------------------------------

def _checkout_copy(folder: Path) -> Path:
    """The package's sources, as a checkout holds them before any build: no compiled files."""
    src = Path(ort_flash.__file__).resolve().parent
    shutil.copytree(src, folder / "ort_flash", ignore=shutil.ignore_patterns("*.so", "__pycache__", "data"))
    (folder / "pyproject.toml").write_text("[project]\nname = 'ort-flash'\n")
    return folder


def _run_without_site(args, cwd: Path, pythonpath: str):
    # -S: no site hooks (an editable install's import redirect among them), so that, as after a
    # plain `pip install .`, the current folder's ort_flash comes first on sys.path.
    env = {k: v for k, v in os.environ.items() if k not in ("ORT_FLASH_LIBRARY", "PYTHONPATH")}
    env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)


def test_source_tree_shadowing_the_install_says_so(tmp_path):
    installed = Path(ort_flash.library_path()).resolve().parent  # .../site-packages/ort_flash
    checkout = _checkout_copy(tmp_path / "checkout")
    proc = _run_without_site(["-c", "import ort_flash; print(ort_flash.library_path())"], checkout,
                             str(installed.parent))
    assert proc.returncode == 1 and "FileNotFoundError" in proc.stderr, proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    for fragment in (str(checkout / "ort_flash"), "shadows the installed package", str(installed),
                     "run from another folder", "pip install -e ."):
        assert fragment in message, message
    assert "reinstall" not in message, message  # the old, wrong advice
    # `info` through the CLI: one error line with the same advice, no traceback.
    proc = _run_without_site(["-m", "ort_flash.cli", "info"], checkout, str(installed.parent))
    assert_user_error(proc, "shadows the installed package", "pip install -e .")


def test_source_tree_without_any_install_says_how_to_build(tmp_path):
    checkout = _checkout_copy(tmp_path / "checkout")
    proc = _run_without_site(["-c", "import ort_flash; ort_flash.library_path()"], checkout, "")
    message = proc.stderr.strip().splitlines()[-1]
    assert "holds no compiled libort_flash.so" in message and "pip install -e ." in message, message


# ---- (3) verify --provider cuda ---------------------------------------------------------------

@pytest.mark.skipif(cuda_device_arch() is not None, reason="a GPU is here: the GPU suite verifies on CUDA")
def test_verify_cuda_without_cuda_fails():
    proc = cli("verify", DEMO, DEMO, "--provider", "cuda")
    _last_error(proc, "verify --provider cuda", "nothing was verified on CUDA")
    assert "PASS" not in proc.stdout


def test_verify_cuda_fails_when_the_fused_op_ran_elsewhere(monkeypatch, tmp_path):
    # A CUDA session whose FlashAttention nodes ONNX Runtime's profiler places on the CPU (a
    # build without kernels for this GPU): the check demo --provider cuda makes, in verify.
    import argparse

    import ort_flash.timing

    model = tmp_path / "m.flash.onnx"
    model.write_bytes(DEMO.read_bytes())
    args = argparse.Namespace(original=str(DEMO), rewritten=str(model), seq_len=8, batch=1, past_len=None)
    result = argparse.Namespace(rewritten_providers=["CUDAExecutionProvider", "CPUExecutionProvider"], seed=0)
    placed = {("FlashAttention", "CPUExecutionProvider"): 2, ("MatMul", "CUDAExecutionProvider"): 9}
    monkeypatch.setattr(ort_flash.timing, "node_placements", lambda *a, **k: placed)
    why = verify_command._fused_op_off_cuda(args, result)
    assert "CPUExecutionProvider x2" in why and "ort-flash info" in why, why
    placed = {("FlashAttention", "CUDAExecutionProvider"): 2}
    assert verify_command._fused_op_off_cuda(args, result) == ""
    result.rewritten_providers = ["CPUExecutionProvider"]
    assert "could not create a CUDA session" in verify_command._fused_op_off_cuda(args, result)


# ---- (5) the rewrite report -------------------------------------------------------------------

def test_rewrite_report_names_the_cli_flag_and_fits_100_columns(tmp_path):
    proc = cli("rewrite", DEMO, "-o", tmp_path / "out.onnx")
    assert proc.returncode == 0, proc.stderr
    wide = [line for line in proc.stdout.splitlines() if len(line) > WIDTH]
    assert not wide, wide
    assert "--fast-padded-rows" in proc.stdout, proc.stdout
    assert "(exact_masked_rows=True)" not in proc.stdout


def test_report_table_wraps_long_cells_and_keeps_them_whole():
    long_node = "/model/decoder/layers.11/self_attn/" + "very_long_segment/" * 4 + "FlashAttention"
    fused = FusedSubgraph(rule="matmul_softmax_attention", variant="", fused_node=long_node,
                          nodes=["a"] * 7, heads=32, head_dim=128, causal=True,
                          mask="additive (batch,1,sequence_length,past_sequence_length + 1)", scale=0.088,
                          kv_heads=8)
    report = RewriteReport(counts={"matmul_softmax_attention": 1}, fused=[fused],
                           unfused=[UnfusedSoftmax(node="/x/Softmax", reason="word " * 60)],
                           shape_inference="symbolic",
                           declined={long_node: {"causal_mask": "differs (exact_masked_rows=True)"}})
    text = report.format_table()
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    # Each wrapped cell reads back whole: the node's column, joined over its lines.
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  /model/"))
    width = len(lines[start - 1].split("  ")[1])  # the dashes under "node"
    cell = ""
    for line in lines[start:]:
        piece = line[2:2 + width].rstrip()
        if not line.startswith("  ") or not piece:  # the next table, or the row's end
            break
        cell += piece
    assert cell == long_node, (cell, text)
    assert "--fast-padded-rows" in text


# ---- (6) verify states its rule ---------------------------------------------------------------

def test_verify_states_its_pass_rule():
    proc = cli("verify", DEMO, DEMO)
    assert proc.returncode == 0, proc.stderr
    assert "atol + rtol * |original|" in proc.stdout, proc.stdout
    assert "graph optimizations off" in proc.stdout, proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= WIDTH, proc.stdout


# ---- (7) unwritable outputs, nothing fused, ORT's optimizer messages ----------------------------

def test_unwritable_output_fails_before_the_work_naming_the_path(tmp_path):
    # /proc takes no new files, for root too.
    target = "/proc/ort_flash_out.onnx"
    proc = cli("rewrite", DEMO, "-o", target)
    assert_user_error(proc, target, "cannot write there")
    assert "fused attention" not in proc.stdout and ".tmp" not in proc.stderr
    proc = cli("rewrite", DEMO, "-o", tmp_path / "ok.onnx", "--report", "/proc/ort_flash_r.json")
    assert_user_error(proc, "/proc/ort_flash_r.json")
    assert not (tmp_path / "ok.onnx").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_read_only_folder_fails_before_the_work(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        proc = cli("rewrite", DEMO, "-o", folder / "out.onnx")
        assert_user_error(proc, str(folder / "out.onnx"), "cannot write there")
        assert "fused attention" not in proc.stdout
    finally:
        folder.chmod(0o700)


def test_nothing_fused_warns_and_exits_3(tmp_path):
    model = tmp_path / "relu.onnx"
    model.write_bytes(_tiny_model())
    out = tmp_path / "out.onnx"
    proc = cli("rewrite", model, "-o", out)
    assert proc.returncode == common.EXIT_NOTHING_FUSED == 3, proc.stderr
    assert "warning: no attention was fused" in proc.stderr and "Traceback" not in proc.stderr
    onnx.checker.check_model(onnx.load(out))  # still written: the same graph
    out.unlink()
    proc = cli("rewrite", model, "-o", out, "--require-fusion")
    assert proc.returncode == 3 and "--require-fusion" in proc.stderr, proc.stderr
    assert not out.exists()


def test_ort_fusions_messages_speak_of_the_ort_fusions_flag(tmp_path):
    proc = cli("rewrite", DEMO, "-o", tmp_path / "out.onnx", "--ort-fusions", "gpt2")
    assert proc.returncode == 0, proc.stderr
    assert "--model_type" not in proc.stderr + proc.stdout, proc.stderr
    assert "--ort-fusions gpt2" in proc.stderr, proc.stderr


@pytest.mark.skipif(cuda_device_arch() is not None, reason="a GPU is here: CUDA is the right default")
def test_default_session_on_a_machine_without_gpu_is_quiet_cpu():
    # onnxruntime-gpu lists CUDAExecutionProvider without a GPU too; asked for it, ONNX Runtime
    # logs a page of library errors before falling back. The default leaves CUDA out there.
    code = "import ort_flash, sys; print(ort_flash.InferenceSession(sys.argv[1]).get_providers())"
    proc = cli(DEMO, code=code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['CPUExecutionProvider']", proc.stdout
    assert "CUDAExecutionProvider" not in proc.stderr, proc.stderr
