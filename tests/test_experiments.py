"""The measurement scripts in lab/experiments/ stay runnable: each one's imports (its sibling scripts
and the kernels in aot/) resolve from any working folder and its argument parser answers --help.
They time kernels on a GPU, so CI, which has none, checks only this much of them (their floor and
equal-work kernels run under Triton's interpreter in test_kernel_interpreter.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("tune", "tune_decode", "levers", "decode_floor", "decode_flat", "gluon_attn", "merged_variants",
           "ws_profile", "tile_schedule", "genai_case", "fp8_error", "e2e_kernels", "ab_tma", "ab_grids",
           "profile_model", "bench_big_models", "fp8_kernel_bench", "gqa_append")

# One interpreter for all five (torch and triton load once); each script runs as __main__ with
# --help, which must end in exit status 0 after its module-level imports ran.
_RUN_ALL = """
import runpy, sys
for path in sys.argv[1:]:
    sys.argv = [path, "--help"]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        assert e.code in (0, None), (path, e.code)
    else:
        raise AssertionError(path + " did not exit on --help")
    print("ok", path)
"""


def test_experiment_scripts_import_and_answer_help(tmp_path):
    pytest.importorskip("torch", reason="the experiments time torch tensors")
    pytest.importorskip("triton", reason="the experiments JIT-compile Triton kernels")
    paths = [str(ROOT / "lab" / "experiments" / f"{name}.py") for name in SCRIPTS]
    assert all(Path(p).is_file() for p in paths), paths
    # Run from an unrelated folder so only the scripts' own sys.path set-up can find aot/.
    proc = subprocess.run([sys.executable, "-c", _RUN_ALL, *paths], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("ok ") == len(SCRIPTS), proc.stdout


def test_aot_holds_only_what_the_build_compiles():
    """aot/ is the product: the kernels, the variant table and the build. Measurement scripts
    live in lab/experiments/."""
    names = {p.name for p in (ROOT / "aot").glob("*.py")}
    assert not names & {f"{s}.py" for s in SCRIPTS + ("gluon_sass", "merged_pairs")}, names
    assert {"build.py", "variants.py", "flash_fwd.py", "flash_decode.py"} <= names


def test_gqa_append_kernel_compiles_for_sm90():
    """lab/experiments/gqa_append.py's kernel (the one-partition kernel with APPEND_KV) compiles
    for sm_90 as the build would, without spills and in the shipped kernel's shared memory, so that
    the GPU run times what its tile allows (two CTAs an SM at d128)."""
    pytest.importorskip("triton.experimental.gluon", reason="the kernel is Gluon")
    sys.path.insert(0, str(ROOT / "lab" / "experiments"))
    import gqa_append
    rows = {(r["kernel"], r["dtype"], r["head_dim"]): r for r in gqa_append.sass(["fp16"], [64, 128])}
    for d in (64, 128):
        shipped, append = rows[("shipped", "fp16", d)], rows[("append", "fp16", d)]
        assert append["stack"] == 0 and append["shared"] == shipped["shared"], (shipped, append)
        regs = -(-append["registers"] // 8) * 8  # allocated a warp at a time, in units of 8 a thread
        assert 2 * regs * 32 * append["num_warps"] <= 65536, append  # two CTAs in an SM's register file


def test_fp8_error_emulation_orders_the_schemes():
    """lab/experiments/fp8_error.py: the fp16 emulation sits at fp16's rounding of the float64
    reference, a Hadamard rotation leaves Q·Kᵀ unchanged, and on outlier inputs per-tensor e4m3
    is the worst scheme and block scales with the rotation beat it."""
    sys.path.insert(0, str(ROOT / "lab" / "experiments"))
    import fp8_error as f

    rng = np.random.default_rng(0)
    m = f.hadamard(64, rng)
    assert np.allclose(m @ m.T, np.eye(64))
    q, k, v = (f.outlier_inputs(rng, (256, 64)) for _ in range(3))
    assert np.allclose((q @ m) @ (k @ m).T, q @ k.T)
    want = f.reference(q, k, v, causal=True)
    err = {s: f.rmse(f.emulate(q, k, v, s, True, np.random.default_rng(1)), want) for s in f.SCHEMES}
    assert err["fp16"] < 1e-3, err
    assert err["fp8-tensor"] == max(err.values()) and err["fp8-block-hadamard"] < err["fp8-tensor"], err
