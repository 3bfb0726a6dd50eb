"""The op's attention_precision attribute where no FP8 kernel runs (the CPU execution provider):
"fp8" computes exactly what the node computes without it, and the process says so on standard
error once, however many nodes, sessions and runs ask (FlashAttention and GroupQueryAttention
alike); a value other than "model" or "fp8" fails at session creation naming the node (the
FlashAttention rows are in tests/test_bad_input.py). On sm_90 the FP8 path itself is checked by
tests/test_cuda_op.py::test_fp8_prefill_on_cuda and its launches by tests/test_launch_abi.py."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent

NOTICE = ("ort_flash: attention_precision=fp8: attention runs in {dtype} on the CPU execution provider, not FP8: "
          "the FP8 path runs on sm_90 GPUs (H100, H200)")

# In a child (a fresh process, so that no earlier test has given the notice): two FlashAttention
# sessions (float16) and one GroupQueryAttention session, each with the attribute, each run twice,
# and the same models without it; prints whether each output equals its plain twin.
_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from _onnx_models import flash_attention_model, run_model
    from _gqa_models import run_gqa
    from test_reference_gqa import CASES, _inputs
    import ort_flash

    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((2, 3, 37, 64)).astype(np.float16) for n in "QKV"}
    spec = {"Y": ((2, 3, 37, 64), np.float16)}
    same = []
    plain = run_model(flash_attention_model(feeds, {"Y": np.float16}, is_causal=1), feeds, spec, ["CPUExecutionProvider"])
    for _ in range(2):
        model = flash_attention_model(feeds, {"Y": np.float16}, is_causal=1, attention_precision="fp8")
        for _ in range(2):
            got = run_model(model, feeds, spec, ["CPUExecutionProvider"])
            same.append(bool(np.array_equal(got["Y"], plain["Y"])))
    gq, attrs, shared = _inputs(np.random.default_rng(1), np.float16, CASES["prompt_buf_one_row"])
    lib = ort_flash.library_path()
    want = run_gqa(gq, shared=shared, library=lib, **attrs)
    for _ in range(2):
        got = run_gqa(gq, shared=shared, library=lib, attention_precision="fp8", **attrs)
        same.append(all(bool(np.array_equal(a, b, equal_nan=True)) for a, b in zip(got, want)))
    print(json.dumps(same))
""")


def test_fp8_on_the_cpu_runs_in_the_dtype_and_says_so_once():
    pytest.importorskip("onnxruntime")
    import ort_flash

    try:
        ort_flash.library_path()
    except FileNotFoundError as e:
        pytest.skip(f"the ort_flash library is not built: {e}")
    r = subprocess.run([sys.executable, "-c", _CHILD, str(HERE)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    same = json.loads(r.stdout.strip().splitlines()[-1])
    assert same == [True] * 6, same
    notices = [line for line in r.stderr.splitlines() if line.startswith("ort_flash: ")]
    assert notices == [NOTICE.format(dtype="float16")], r.stderr[-2000:]


def test_gqa_attention_precision_value_refused():
    """GroupQueryAttention refuses an attention_precision it does not know, naming the node."""
    ort = pytest.importorskip("onnxruntime")
    import ort_flash
    from _gqa_models import gqa_model
    from test_reference_gqa import CASES, _inputs

    try:
        lib = ort_flash.library_path()
    except FileNotFoundError as e:
        pytest.skip(f"the ort_flash library is not built: {e}")
    feeds, attrs, _ = _inputs(np.random.default_rng(0), np.float16, CASES["prompt"])
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(lib)
    with pytest.raises(Exception) as e:
        ort.InferenceSession(gqa_model(feeds, "ort_flash", attention_precision="e4m3", **attrs), opts,
                             providers=["CPUExecutionProvider"])
    msg = str(e.value)
    assert "GroupQueryAttention node" in msg and "attention_precision is 'e4m3'; expected 'model' or 'fp8'" in msg, msg
