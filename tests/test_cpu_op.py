"""ort_flash.FlashAttention on CPUExecutionProvider against ort_flash.reference."""

import ml_dtypes
import numpy as np
import pytest

from _onnx_models import flash_attention_model, run_model
from cases import CASES, DTYPES, FLOORS, case_id, run_case
from ort_flash.reference import attention_lowp, attention_reference, error_bound

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
    # 37 output columns: the vector stores (16 / 8 / 4 lanes by ISA build) and the scalar tail.
    ties = (TIES[dtype] * 13)[:37]
    dt = DTYPES[dtype]
    q = np.zeros((1, 1, 1, 8), dt)
    k = np.ones((1, 1, 2, 8), dt)
    v = np.array([[[t[0] for t in ties], [t[1] for t in ties]]], np.float32)[None].astype(dt)
    feeds = {"Q": q, "K": k, "V": v}
    model = flash_attention_model(feeds, {"Y": dt})
    y = run_model(model, feeds, {"Y": ((1, 1, 1, len(ties)), dt)}, PROVIDERS)["Y"]
    np.testing.assert_array_equal(y.astype(np.float32)[0, 0, 0], [t[2] for t in ties])


@pytest.mark.parametrize("precision", ["ieee", "tf32"])
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


# ---- masks whose rows are key intervals ------------------------------------------------------
# The CPU op reads such a row's mask once per call and then treats it like a positional range
# (cpu_isa::MaskRow); rows that are not intervals keep the element-by-element path. These masks
# mix both kinds in one tile: causal rows with left or right padding, a fully masked row, a row
# of one key, a row with a hole, and (additive) a row of finite biases only.
MASK_KINDS = ["bool", "neginf", "finfo"]
MASK_SHAPES = {"b1qk": (2, 1), "bhqk": (2, 4), "b11k": (2, 1)}


def interval_mask(kind: str, dims: str, hq: int, s: int, dtype):
    b, h = MASK_SHAPES[dims][0], hq if dims == "bhqk" else 1
    sq = 1 if dims == "b11k" else s
    keep = np.broadcast_to(np.tril(np.ones((s, s), bool))[-sq:], (b, h, sq, s)).copy()
    keep[0, ..., :3] = False                # left padding
    keep[-1, ..., s - 70:] = False          # right padding past a key block
    if sq > 1:
        keep[:, :, 1] = False               # a row that attends nothing
        keep[:, :, 9] = False
        keep[:, :, 9, 6] = True             # one key
        keep[:, :, s // 2, s // 4] = False  # a hole: not an interval
        keep[:, -1, s - 2, 100:] = True     # past the causal limit: clipped by nothing
    if kind == "bool":
        return keep
    low = -np.inf if kind == "neginf" else float(ml_dtypes.finfo(dtype).min)
    mask = np.where(keep, 0.0, low)
    if sq > 1 and kind == "finfo":
        mask[:, :, 1] = low                 # only biases: a softmax over them, not zeros
    return mask.astype(dtype)


def check_contract(feeds, dtype, out, **attrs):
    q, k, v = feeds["Q"], feeds["K"], feeds["V"]
    kw = dict(attn_mask=feeds.get("attn_mask"), **attrs)
    ref_y, _, _, ref_lse = attention_reference(q, k, v, **kw)
    low_y, _, _, low_lse = attention_lowp(q, k, v, **kw)
    floor_y, floor_lse = FLOORS[dtype]
    y = out["Y"].astype(np.float64)
    assert np.isfinite(y).all()
    err = float(np.abs(y - ref_y).max())
    assert err <= error_bound(ref_y, low_y, floor_y), (err, error_bound(ref_y, low_y, floor_y))
    lse = out["softmax_lse"].astype(np.float64)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    assert not np.any(y[np.isneginf(ref_lse)]), "a row that attends nothing must give 0"
    fin = np.isfinite(ref_lse)
    rel = lambda x: np.abs(x[fin] - ref_lse[fin]) / np.maximum(1, np.abs(ref_lse[fin]))  # noqa: E731
    assert rel(lse).max() <= 2 * rel(low_lse.astype(np.float64)).max() + floor_lse


def run_interval_mask_case(dtype: str, kind: str, dims: str, causal: bool, seed=None):
    rng = np.random.default_rng(seed)
    dt = DTYPES[dtype]
    b, hq, hkv, s, d = MASK_SHAPES[dims][0], 4, 2, 203, 64
    feeds = {n: rng.standard_normal((b, hkv if n != "Q" else hq, s, d), dtype=np.float32).astype(dt)
             for n in ("Q", "K", "V")}
    feeds["attn_mask"] = interval_mask(kind, dims, hq, s, dt)
    specs = {"Y": ((b, hq, s, d), dt), "softmax_lse": ((b, hq, s), np.float32)}
    model = flash_attention_model(feeds, {"Y": dt, "softmax_lse": np.float32}, is_causal=int(causal))
    out = run_model(model, feeds, specs, PROVIDERS)
    check_contract(feeds, dtype, out, is_causal=causal)


@pytest.mark.parametrize("dims", list(MASK_SHAPES))
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_interval_masks(dtype, kind, dims):
    run_interval_mask_case(dtype, kind, dims, causal=False)


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_interval_masks_with_causal(kind):
    run_interval_mask_case("float32", kind, "bhqk", causal=True)


def test_lse_check_admits_only_the_documented_mask_clamp():
    """The op tests' LSE check (tests/cases.py) admits, for a row whose every visible key carries a
    bf16/fp32 finfo.min fill, the value the CUDA masked cubins' documented -1e38 clamp gives
    (docs/guarantees.md), and nothing else: another value of that row, and any other row off by
    as much, still fail."""
    from cases import _clamped_lse, _lse_err

    fill = float(ml_dtypes.finfo(ml_dtypes.bfloat16).min)
    ref = np.array([fill + 2.5, 1.25], np.float64)
    case = {"mask": ("finfo", "qk"), "dtype": "bfloat16"}
    alt = _clamped_lse(ref, case)
    clamped = np.array([-1.0e38 + 2.5, 1.25], np.float32)
    assert _lse_err(clamped, ref) > 0.5  # what the bare check said on the GPU: 0.705
    assert _lse_err(clamped, ref, alt) < 1e-6
    assert _lse_err(np.array([-2.0e38, 1.25], np.float32), ref, alt) > 0.4
    assert _lse_err(np.array([-1.0e38 + 2.5, 1.5], np.float32), ref, alt) > 0.1
    assert _clamped_lse(ref, {"mask": ("finfo", "qk"), "dtype": "float16"}) is None  # -65504: no clamp
    assert _clamped_lse(ref, {"mask": ("additive", "qk"), "dtype": "bfloat16"}) is None
