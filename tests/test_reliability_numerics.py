"""Numerics at the edges, as docs/guarantees.md promises them: fp16 scores that overflow fp16,
-inf and finfo.min masks, fully masked batches, NaN in the inputs. The same tests run on the
CPU and (marked gpu) the CUDA execution provider.

Outputs are poisoned with a finite value (not NaN) before each run, so a NaN in a result is one
the op wrote.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from _onnx_models import flash_attention_model
from _session_runs import POISON, run_bound, session
from cases import DTYPES, FLOORS
from ort_flash.reference import attention_lowp, attention_reference, error_bound

PROVIDERS = [
    "CPUExecutionProvider",
    pytest.param("CUDAExecutionProvider", marks=pytest.mark.gpu),
]


def run(provider, feeds, out_dtype, y_shape, lse=True, **attrs):
    outputs = {"Y": out_dtype} | ({"softmax_lse": np.float32} if lse else {})
    specs = {"Y": (y_shape, out_dtype)}
    if lse:
        b, hq, sq = feeds["Q"].shape[:3]
        specs["softmax_lse"] = ((b, hq, sq), np.float32)
    sess = session(flash_attention_model(feeds, outputs, **attrs), providers=[provider])
    out = run_bound(sess, feeds, specs)
    assert not (out["Y"].astype(np.float32) == POISON).all(axis=-1).any(), "rows of Y not written"
    return out


def ref_kwargs(feeds, **attrs):
    keys = ("attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")
    return {k: feeds[k] for k in keys if k in feeds} | attrs


def assert_contract(out, feeds, dtype_name, low=None, lse_abs_slack=0.0, y_slack=0.0, **attrs):
    """Y and lse within the error contract of tests/cases.py against the float64 reference.

    `lse_abs_slack` widens the lse check by an absolute amount: the rounding bound of the fp32
    dot products themselves, for inputs so large that two correct fp32 summation orders (ours
    and numpy's) differ by more than 2x."""
    q, k, v = feeds["Q"], feeds["K"], feeds["V"]
    ref_y, _, _, ref_lse = attention_reference(q, k, v, **ref_kwargs(feeds, **attrs))
    low_y, _, _, low_lse = low or attention_lowp(q, k, v, **ref_kwargs(feeds, **attrs))
    floor_y, floor_lse = FLOORS[dtype_name]
    y = out["Y"].astype(np.float64)
    assert np.isfinite(y).all()
    err = float(np.max(np.abs(y - ref_y)))
    bound = error_bound(ref_y, low_y, floor_y) + y_slack
    assert err <= bound, (err, bound)
    lse = out["softmax_lse"].astype(np.float64)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)) and not np.isnan(lse).any()
    fin = np.isfinite(ref_lse)
    denom = np.maximum(1, np.abs(ref_lse[fin]))
    rel = np.abs(lse[fin] - ref_lse[fin]) / denom
    low_rel = np.abs(low_lse[fin] - ref_lse[fin]) / denom
    slack = (lse_abs_slack[fin] if np.ndim(lse_abs_slack) else lse_abs_slack) / denom
    assert np.all(rel <= 2 * low_rel.max(initial=0) + floor_lse + slack), (
        rel.max(initial=0), low_rel.max(initial=0))


def randn(rng, shape, dtype, std=1.0):
    return (std * rng.standard_normal(shape, dtype=np.float32)).astype(dtype)


# ---- scores beyond fp16's range --------------------------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "causal_mask"])
def test_fp16_scores_that_overflow_fp16(provider, masked):
    # |q|, |k| ~ 300 with D = 64: scores reach ~1e6, far past fp16's 65504. The op keeps them in
    # fp32, so the result is finite and as accurate as a plain fp32 computation; the plain fp16
    # computation overflows.
    # Q and K are multiples of 4 within +-300 (exact in fp16), so every product and every partial
    # sum of a score is an integer below 2^24: exact in fp32 in any summation order, and the op
    # and the references see the same scores.
    rng = np.random.default_rng()
    f16 = np.float16

    def big(shape):
        return (4 * np.round(np.clip(rng.standard_normal(shape) * 150, -300, 300) / 4)).astype(f16)

    feeds = {"Q": big((2, 4, 33, 64)), "K": big((2, 4, 71, 64)), "V": randn(rng, (2, 4, 71, 64), f16)}
    # Query 0 and key 0 all +300: their score, 64 * 300^2 = 5.8e6, overflows fp16 whatever the
    # random draw, and key 0 stays visible (causal from the bottom right; the mask keeps it).
    feeds["Q"][:, :, 0, :] = 300
    feeds["K"][:, :, 0, :] = 300
    attrs = {}
    if masked:
        feeds["attn_mask"] = np.where(rng.random((2, 1, 33, 71)) < 0.2, -np.inf, 0).astype(f16)
        feeds["attn_mask"][..., 0] = 0
        attrs = {"is_causal": 1}
    ref_attrs = {"is_causal": bool(attrs.get("is_causal"))}
    q, k, v = feeds["Q"], feeds["K"], feeds["V"]
    with np.errstate(all="ignore"):
        low16 = attention_lowp(q, k, v, **ref_kwargs(feeds, **ref_attrs))
    assert not np.isfinite(low16[0].astype(np.float32)).all(), "the fp16 computation should overflow"
    f32 = {n: a.astype(np.float32) for n, a in feeds.items()}
    low32 = attention_lowp(f32["Q"], f32["K"], f32["V"], **ref_kwargs(f32, **ref_attrs))
    out = run(provider, feeds, f16, (2, 4, 33, 64), **attrs)
    # The op's own error: fp32 arithmetic (as low32) plus the fp16 rounding of Y. Scores here
    # are sums of 64 products of ~1e5 each; any fp32 summation order is within the standard dot
    # product bound gamma_D * sum|q||k| (gamma_D = D * 2^-24) of the exact score, so two correct
    # orders can differ by twice that: that bound (times the scale) is the lse slack.
    d = q.shape[-1]
    qa, ka = np.abs(q.astype(np.float64)), np.abs(k.astype(np.float64))
    cond = (qa @ ka.swapaxes(-1, -2)).max(axis=-1) / np.sqrt(d)  # (B, H, Sq)
    slack = 2 * d * 2.0 ** -24 * cond
    low = (low32[0].astype(f16), None, None, low32[3])
    # low32 keeps the probabilities in fp32; the op rounds them to fp16 for the P.V product (as
    # FlashAttention does), worth up to one fp16 ulp of the largest output.
    ulp = float(np.spacing(np.abs(low32[0]).max().astype(f16)))
    assert_contract(out, feeds, "float16", low=low, lse_abs_slack=slack, y_slack=ulp, **ref_attrs)


# ---- -inf and finfo.min masks, fully masked batches --------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("how", ["bool", "neginf", "finfo", "nonpad"])
def test_fully_masked_batch(provider, dtype, how):
    # Batch 1 attends nothing at all; batch 0 attends some keys per row. A fully masked row
    # gives Y = 0 and lse = -inf; with a finfo.min mask nothing is masked in the ONNX sense
    # (finfo.min is a finite bias) and the result is the reference's, never NaN.
    rng = np.random.default_rng()
    dt = DTYPES[dtype]
    b, h, sq, skv, d = 2, 3, 21, 45, 32
    feeds = {"Q": randn(rng, (b, h, sq, d), dt), "K": randn(rng, (b, h, skv, d), dt),
             "V": randn(rng, (b, h, skv, d), dt)}
    keep = rng.random((b, 1, sq, skv)) < 0.5
    keep[0, :, :, 0] = True
    keep[1] = False
    if how == "bool":
        feeds["attn_mask"] = keep
    elif how == "neginf":
        feeds["attn_mask"] = np.where(keep, 0.0, -np.inf).astype(dt)
    elif how == "finfo":
        feeds["attn_mask"] = np.where(keep, 0.0, float(ml_dtypes.finfo(dt).min)).astype(dt)
    else:
        feeds["nonpad_kv_seqlen"] = np.array([skv, 0], np.int64)
    out = run(provider, feeds, dt, (b, h, sq, d))
    assert_contract(out, feeds, dtype)
    if how != "finfo":
        assert not out["Y"][1].astype(np.float32).any(), "a fully masked batch must give 0"
        assert np.isneginf(out["softmax_lse"][1]).all()


# ---- NaN in the inputs -----------------------------------------------------------------------

def _nan_case(rng, dtype, b=1, h=2, sq=6, skv=70, d=16):
    dt = DTYPES[dtype]
    return {"Q": randn(rng, (b, h, sq, d), dt), "K": randn(rng, (b, h, skv, d), dt),
            "V": randn(rng, (b, h, skv, d), dt)}


def _rows_nan(out):
    """(rows whose Y is NaN somewhere, rows whose lse is NaN), each (B, H, Sq)."""
    y = out["Y"].astype(np.float32)
    return np.isnan(y).any(-1), np.isnan(out["softmax_lse"])


def _sanitized_reference(feeds, **attrs):
    clean = {n: np.nan_to_num(a.astype(np.float32)).astype(a.dtype) if a.dtype.kind == "f" or
             a.dtype == ml_dtypes.bfloat16 else a for n, a in feeds.items()}
    return attention_reference(clean["Q"], clean["K"], clean["V"], **ref_kwargs(clean, **attrs))


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_in_q_row_makes_that_row_nan(provider, dtype):
    rng = np.random.default_rng()
    feeds = _nan_case(rng, dtype)
    feeds["Q"][0, 1, 2, 5] = np.nan
    out = run(provider, feeds, DTYPES[dtype], feeds["Q"].shape)
    y_nan, lse_nan = _rows_nan(out)
    want = np.zeros_like(y_nan)
    want[0, 1, 2] = True
    assert np.array_equal(y_nan, want) and np.array_equal(lse_nan, want)
    assert np.isnan(out["Y"][0, 1, 2].astype(np.float32)).all()


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("key", [3, 64, 69], ids=["key3", "key64", "last_key"])
def test_nan_in_k_row_reaches_every_row_that_attends_it(provider, dtype, key):
    # Causal with Sq = Skv = 70 and no past: row i attends keys j <= i. Rows attending the
    # NaN key are NaN (Y and lse), the others equal the reference computed without the NaN.
    # Row 64 sees key 64 alone in its 64-key block: a block whose only scores are NaN must
    # not pass for a fully masked one.
    rng = np.random.default_rng()
    feeds = _nan_case(rng, dtype, sq=70)
    feeds["K"][0, 0, key, 3] = np.nan
    out = run(provider, feeds, DTYPES[dtype], feeds["Q"].shape, is_causal=1)
    y_nan, lse_nan = _rows_nan(out)
    attends = np.zeros_like(y_nan)
    attends[0, 0, key:] = True  # row i attends key j iff j <= i
    assert np.array_equal(y_nan, attends) and np.array_equal(lse_nan, attends)
    ref_y = _sanitized_reference(feeds, is_causal=True)[0]
    y = out["Y"].astype(np.float64)
    ok = ~attends
    assert np.abs(y[ok] - ref_y[ok]).max() <= 2e-2


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_in_v_reaches_that_column_of_attending_rows(provider, dtype):
    rng = np.random.default_rng()
    feeds = _nan_case(rng, dtype)
    feeds["V"][0, 1, 40, 7] = np.nan
    out = run(provider, feeds, DTYPES[dtype], feeds["Q"].shape)
    y = out["Y"].astype(np.float32)
    want = np.zeros(y.shape, bool)
    want[0, 1, :, 7] = True  # every row attends key 40; only column 7 of V is NaN
    assert np.array_equal(np.isnan(y), want)
    assert not np.isnan(out["softmax_lse"]).any()


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_in_additive_mask_reaches_that_row_only(provider, dtype):
    rng = np.random.default_rng()
    feeds = _nan_case(rng, dtype)
    mask = randn(rng, (6, 70), DTYPES[dtype])
    mask[4, 10] = np.nan
    feeds["attn_mask"] = mask
    out = run(provider, feeds, DTYPES[dtype], feeds["Q"].shape)
    y_nan, lse_nan = _rows_nan(out)
    want = np.zeros_like(y_nan)
    want[:, :, 4] = True
    assert np.array_equal(y_nan, want) and np.array_equal(lse_nan, want)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_past_the_key_length_never_reaches_the_output(provider, dtype):
    # A padded KV cache: K and V hold NaN past each batch's nonpad_kv_seqlen (garbage in the
    # padding); no row attends those keys, so every output is finite and equals the reference.
    rng = np.random.default_rng()
    feeds = _nan_case(rng, dtype, b=3, sq=5, skv=90)
    lens = np.array([90, 37, 64], np.int64)
    for bi, n in enumerate(lens):
        feeds["K"][bi, :, n:] = np.nan
        feeds["V"][bi, :, n:] = np.nan
    feeds["nonpad_kv_seqlen"] = lens
    out = run(provider, feeds, DTYPES[dtype], feeds["Q"].shape, is_causal=1)
    assert np.isfinite(out["Y"].astype(np.float32)).all()
    ref_y, _, _, ref_lse = _sanitized_reference(feeds, is_causal=True)
    assert np.abs(out["Y"].astype(np.float64) - ref_y).max() <= 2e-2
    assert np.abs(out["softmax_lse"] - ref_lse).max() <= 1e-2


@pytest.mark.parametrize("provider", PROVIDERS)
def test_nan_q_in_a_fully_masked_row_gives_zero(provider):
    # A row that attends nothing never reads its query: Y = 0, lse = -inf.
    rng = np.random.default_rng()
    feeds = _nan_case(rng, "float32")
    feeds["Q"][0, 0, 3] = np.nan
    mask = np.ones((6, 70), bool)
    mask[3] = False
    feeds["attn_mask"] = mask
    out = run(provider, feeds, np.float32, feeds["Q"].shape)
    assert (out["Y"][0, 0, 3] == 0).all() and np.isneginf(out["softmax_lse"][0, 0, 3])
    assert np.isfinite(out["Y"]).all()
