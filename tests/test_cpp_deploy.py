"""Framework-free deployment: examples/cpp (ONNX Runtime C++ API + libort_flash.so, no Python at
run time) builds with CMake, runs the rewritten demo model on CPU and prints what Python gets."""

from __future__ import annotations

import importlib.resources
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

import ort_flash

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "cpp"
BATCH, SEQ = 2, 12


def _ort_include_dir() -> Path | None:
    """ONNX Runtime's C++ headers, looked for where the main build (cmake/OrtHeaders.cmake) looks."""
    candidates = []
    root = os.environ.get("ORT_FLASH_ORT_ROOT")
    if root:
        r = Path(root)
        candidates += [r / "include", r / "include" / "onnxruntime",
                       r / "include" / "onnxruntime" / "core" / "session", r]
    if os.environ.get("ORT_FLASH_CACHE_DIR"):
        cache = Path(os.environ["ORT_FLASH_CACHE_DIR"])
    elif os.environ.get("XDG_CACHE_HOME"):
        cache = Path(os.environ["XDG_CACHE_HOME"]) / "ort_flash"
    else:
        cache = Path.home() / ".cache" / "ort_flash"
    candidates += [cache / "onnxruntime-headers-api29", REPO / ".orth"]
    return next((c for c in candidates if (c / "onnxruntime_cxx_api.h").is_file()), None)


def _ort_library() -> Path | None:
    """The shared libonnxruntime that the installed onnxruntime package ships."""
    import onnxruntime

    capi = Path(onnxruntime.__file__).resolve().parent / "capi"
    libs = sorted(capi.glob("libonnxruntime.so*"))
    return libs[0] if libs else None


def _cxx_compiler() -> str | None:
    return os.environ.get("CXX") or next(
        (c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)


@pytest.fixture(scope="module")
def ort_flash_run(tmp_path_factory) -> Path:
    """examples/cpp built once per module; skips with the reason when a prerequisite is missing."""
    if not shutil.which("cmake"):
        pytest.skip("cmake not found on PATH (needed to build examples/cpp)")
    if not _cxx_compiler():
        pytest.skip("no C++ compiler found (c++, g++, clang++ or $CXX)")
    include = _ort_include_dir()
    if include is None:
        pytest.skip("ONNX Runtime C++ headers not found: set ORT_FLASH_ORT_ROOT, or build ort_flash "
                    "once (it caches them in ~/.cache/ort_flash/onnxruntime-headers-api29)")
    library = _ort_library()
    if library is None:
        pytest.skip("the installed onnxruntime package ships no libonnxruntime.so*")
    build = tmp_path_factory.mktemp("cpp_build")
    configure = ["cmake", "-S", str(EXAMPLE), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DORT_INCLUDE_DIR={include}", f"-DORT_LIBRARY={library}"]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    for cmd in (configure, ["cmake", "--build", str(build), "--parallel", "2"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    exe = build / "ort_flash_run"
    assert exe.is_file()
    return exe


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory) -> Path:
    demo = str(importlib.resources.files("ort_flash").joinpath("data", "gpt2_tiny.onnx"))
    result = ort_flash.rewrite(demo)
    assert any(n.op_type == "FlashAttention" for n in result.model.graph.node)
    path = tmp_path_factory.mktemp("model") / "gpt2_tiny.flash.onnx"
    onnx.save(result.model, str(path))
    return path


def _run(exe: Path, *args: str) -> subprocess.CompletedProcess:
    # No Python at run time: a clean environment, no PYTHONPATH, no LD_LIBRARY_PATH.
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60, env=env)


def _parse_outputs(stdout: str) -> dict:
    """{name: (dtype, shape, first values, sum)} from ort_flash_run's report."""
    pattern = re.compile(r"^output (\S+) (\S+) \[([\d, ]*)\]\n  first:([^\n]*)\n  sum: (\S+)$", re.M)
    return {m[1]: (m[2], [int(d) for d in m[3].split(",") if d.strip()],
                   np.array(m[4].split(), dtype=np.float64), float(m[5]))
            for m in pattern.finditer(stdout)}


def check_like_python(stdout: str, model: Path) -> None:
    """ort_flash_run's report for `model` at (BATCH, SEQ) matches ort_flash.InferenceSession's run."""
    got = _parse_outputs(stdout)
    # The inputs ort_flash_run makes: token ids (i*7+3) % 100 over the flat index, mask of ones.
    ids = ((np.arange(BATCH * SEQ) * 7 + 3) % 100).reshape(BATCH, SEQ).astype(np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones((BATCH, SEQ), np.int64)}
    sess = ort_flash.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    assert sorted(got) == sorted(names), stdout
    for name, ref in zip(names, sess.run(None, feeds)):
        dtype, shape, first, total = got[name]
        assert dtype == "float32" == str(ref.dtype)
        assert shape == list(ref.shape) == [BATCH, SEQ, 512]
        ref = ref.astype(np.float64)
        scale = float(np.abs(ref).max())
        np.testing.assert_allclose(first, ref.ravel()[:8], rtol=1e-3, atol=1e-3 * scale)
        ref_sum = float(ref.sum())
        # Relative 1e-3 of the sum, floored by the size of the terms (a sum near 0 cancels).
        tol = 1e-3 * max(abs(ref_sum), 1e-3 * float(np.abs(ref).sum()))
        assert abs(total - ref_sum) <= tol, (name, total, ref_sum)


def test_cpp_runs_rewritten_model_like_python(ort_flash_run, rewritten):
    proc = _run(ort_flash_run, str(rewritten), ort_flash.library_path(),
                "--batch", str(BATCH), "--seq", str(SEQ))
    assert proc.returncode == 0, f"ort_flash_run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    check_like_python(proc.stdout, rewritten)


def test_cpp_reports_ort_errors_without_crashing(ort_flash_run, rewritten, tmp_path):
    missing = _run(ort_flash_run, str(tmp_path / "missing.onnx"), ort_flash.library_path())
    assert missing.returncode == 1 and "onnxruntime error" in missing.stderr, missing.stderr
    bad_lib = _run(ort_flash_run, str(rewritten), str(tmp_path / "no_such_lib.so"))
    assert bad_lib.returncode == 1 and "no_such_lib.so" in bad_lib.stderr, bad_lib.stderr
    usage = _run(ort_flash_run, str(rewritten))
    assert usage.returncode == 2 and "usage:" in usage.stderr
