"""The CPU kernel under each ISA build this machine runs (baseline, AVX2, AVX-512).

The kernel's tile code is compiled once per ISA and dispatched at first use; the environment
variable ORT_FLASH_CPU_ISA forces one. The choice is made once per process, so each ISA runs
a representative subset of ``cases.py`` in a subprocess of its own, through ONNX Runtime's CPU
execution provider, against the reference contract of ``cases.check_case``.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ISAS = ("baseline", "avx2", "avx512")

# Names from cases._BASE (every dtype) and cases._LARGE: the tile paths (full and edge blocks,
# row tails, GQA packing, decode), masks, softcap, windows, padding, NaN-free empty rows.
SUBSET = [
    "plain", "causal", "causal_sq_gt_skv", "gqa_causal", "mqa_decode_past", "3d_past",
    "d_ne_dv", "tiny_dims", "d256", "bool_mask_hqk_causal", "add_mask_1hqk_gqa",
    "hf_mask_b11k_causal", "short_bool_mask_nonpad", "nonpad_causal", "window", "window_00",
    "window_causal_past", "softcap_mask_causal", "sharp_softmax", "masked_rows_neginf",
    "masked_rows_bool", "sq1_nonpad_causal", "empty_kv", "large_1023x1024",
    "large_1023x1024_causal",
]
# test_cpu_op's masks of key intervals (dtype, kind, dims, causal): the folded rows and the
# element-by-element rows of one tile, the vector mask scan and conversions of each build.
MASK_SUBSET = [
    ("float32", "finfo", "b1qk", False), ("float16", "neginf", "bhqk", True),
    ("bfloat16", "bool", "b11k", False), ("float32", "bool", "bhqk", True),
]

_WORKER = """
import json, sys
sys.path.insert(0, {tests!r})
import ort_flash._C as C
from cases import CASES, case_id, run_case
from test_cpu_op import TIES, run_interval_mask_case, test_output_rounds_to_nearest_even
names = set(json.loads(sys.argv[1]))
picked = [c for c in CASES if c["name"] in names]
assert {{c["name"] for c in picked}} == names, "unknown case names"
for case in picked:
    run_case(case, "CPUExecutionProvider")
ran = [case_id(c) for c in picked]
for args in json.loads(sys.argv[2]):
    run_interval_mask_case(*args)
    ran.append("interval_mask-" + "-".join(map(str, args)))
for dtype in TIES:  # the vector fp16 / bf16 stores of this build round ties to even
    test_output_rounds_to_nearest_even(dtype)
    ran.append("rounds_to_nearest_even-" + dtype)
print(json.dumps({{"isa": C.cpu_isa(), "ran": ran}}))
"""


def _run(code: str, isa: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, ORT_FLASH_CPU_ISA=isa)
    return subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=TESTS,
                          capture_output=True, text=True, timeout=timeout)


@functools.lru_cache(maxsize=None)
def _isa_status(isa: str) -> str | None:
    """None when this machine runs the `isa` build, else why not."""
    proc = _run("import ort_flash._C as C; print(C.cpu_isa())", isa, timeout=120)
    if proc.returncode == 0:
        got = proc.stdout.strip()
        assert got == isa, f"ORT_FLASH_CPU_ISA={isa} selected {got!r}"
        return None
    if "lacks" in proc.stderr or "no x86 ISA variants" in proc.stderr:
        return proc.stderr.strip().splitlines()[-1]
    raise AssertionError(f"probing ORT_FLASH_CPU_ISA={isa} failed:\n{proc.stderr[-2000:]}")


@pytest.mark.parametrize("isa", ISAS)
def test_cases_under_isa(isa):
    reason = _isa_status(isa)
    if reason is not None:
        pytest.skip(reason)
    proc = _run(_WORKER.format(tests=TESTS), isa, json.dumps(SUBSET), json.dumps(MASK_SUBSET))
    assert proc.returncode == 0, f"ORT_FLASH_CPU_ISA={isa}:\n{proc.stderr[-4000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["isa"] == isa
    assert len(result["ran"]) >= len(SUBSET) + len(MASK_SUBSET) + 2


def test_default_is_the_widest_supported():
    supported = [isa for isa in ISAS if _isa_status(isa) is None]
    proc = _run("import ort_flash._C as C; print(C.cpu_isa())", "", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == supported[-1]


def test_unknown_isa_is_an_error_in_the_op():
    # The op library reads the variable itself: a bad value fails the run with the reason.
    code = ("import sys; sys.path.insert(0, {tests!r})\n"
            "from cases import run_case\n"
            "try:\n"
            "    run_case(dict(name='bad_isa', dtype='float32'), 'CPUExecutionProvider')\n"
            "except Exception as e:\n"
            "    print('ERROR', e)\n").format(tests=TESTS)
    proc = _run(code, "sse9")
    assert proc.returncode == 0, proc.stderr
    assert "ERROR" in proc.stdout and "ORT_FLASH_CPU_ISA=sse9" in proc.stdout, proc.stdout


def test_cpu_bench_names_the_machine_and_the_isa_that_ran():
    # `ort-flash bench --suite cpu` records the CPU and the kernel build; a forced ISA shows.
    isa = "avx2" if _isa_status("avx2") is None else "baseline"
    code = ("import json\n"
            "from ort_flash.bench import cpu_suite\n"
            "cfg = dict(dtype='float32', batch=1, heads=2, d=16, seqlen=64, causal=False)\n"
            "rows = cpu_suite.run_worker({'mode': 'timing', 'peers': ['ort_flash'], 'config': cfg,\n"
            "                             'target_s': 0.05, 'sets': 1})\n"
            "print(json.dumps({'machine': cpu_suite.machine(), 'row': rows['ort_flash']}))\n")
    proc = _run(code, isa)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    m = out["machine"]
    assert m["kernel_isa"] == isa and m["isa_forced"] == isa
    assert out["row"]["status"] == "ok" and out["row"]["isa"] == isa
    with open("/proc/cpuinfo") as f:
        model = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    assert m["cpu"] == model and m["cores"] == os.cpu_count()
    assert ("avx2" in m["isa_flags"]) == (_isa_status("avx2") is None)
