"""ort_flash.FlashAttention on CPUExecutionProvider against ort_flash.reference."""

import ml_dtypes
import numpy as np
import pytest

from _onnx_models import flash_attention_model, run_model
from cases import CASES, DTYPES, case_id, run_case

PROVIDERS = ["CPUExecutionProvider"]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_case(case):
    run_case(case, PROVIDERS[0])


# Output stores round to nearest, ties to even. With equal scores over two keys the output is
# (v0 + v1) / 2 exactly in fp32, a tie between two neighbours in the output dtype.
TIES = {  # dtype: [(v0, v1, expected), ...] with ulp(1) = 2^-10 (fp16) or 2^-7 (bf16)
    "float16": [(1.0, 1 + 2**-10, 1.0), (1 + 2**-10, 1 + 2**-9, 1 + 2**-9),
                (-1.0, -1 - 2**-10, -1.0)],
    "bfloat16": [(1.0, 1 + 2**-7, 1.0), (1 + 2**-7, 1 + 2**-6, 1 + 2**-6),
                 (-1.0, -1 - 2**-7, -1.0)],
}


@pytest.mark.parametrize("dtype", TIES)
def test_output_rounds_to_nearest_even(dtype):
    ties = TIES[dtype]
    dt = DTYPES[dtype]
    q = np.zeros((1, 1, 1, 8), dt)
    k = np.ones((1, 1, 2, 8), dt)
    v = np.array([[[t[0] for t in ties], [t[1] for t in ties]]], np.float32)[None].astype(dt)
    feeds = {"Q": q, "K": k, "V": v}
    model = flash_attention_model(feeds, {"Y": dt})
    y = run_model(model, feeds, {"Y": ((1, 1, 1, len(ties)), dt)}, PROVIDERS)["Y"]
    np.testing.assert_array_equal(y.astype(np.float32)[0, 0, 0], [t[2] for t in ties])


@pytest.mark.parametrize("precision", ["ieee", "tf32x3", "tf32"])
def test_fp32_precision_is_ignored_on_cpu(precision):
    rng = np.random.default_rng()
    feeds = {n: rng.standard_normal(s, dtype=np.float32)
             for n, s in (("Q", (1, 2, 9, 16)), ("K", (1, 2, 11, 16)), ("V", (1, 2, 11, 16)))}
    specs = {"Y": ((1, 2, 9, 16), np.float32)}
    base = run_model(flash_attention_model(feeds, {"Y": np.float32}), feeds, specs, PROVIDERS)
    other = run_model(flash_attention_model(feeds, {"Y": np.float32}, fp32_precision=precision),
                      feeds, specs, PROVIDERS)
    np.testing.assert_array_equal(base["Y"], other["Y"])


def test_bfloat16_inputs_travel_exactly():
    # The runner's bfloat16 path (uint16 buffers tagged BFLOAT16): one attended key per query
    # (window 0, 0) returns V's rows bit for bit.
    rng = np.random.default_rng()
    shape = (1, 2, 5, 8)
    q, k, v = (rng.standard_normal(shape, dtype=np.float32).astype(ml_dtypes.bfloat16)
               for _ in range(3))
    feeds = {"Q": q, "K": k, "V": v}
    model = flash_attention_model(feeds, {"Y": ml_dtypes.bfloat16},
                                  left_window_size=0, right_window_size=0)
    y = run_model(model, feeds, {"Y": (shape, ml_dtypes.bfloat16)}, PROVIDERS)["Y"]
    np.testing.assert_array_equal(y.view(np.uint16), v.view(np.uint16))
