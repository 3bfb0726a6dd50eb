"""ort_flash.reference_gqa against ONNX Runtime's own CPU GroupQueryAttention (onnxruntime 1.31).

The cases with fused Q/K norms (extra qk_norm) are the exception: ONNX Runtime computes those on
CUDA and WebGPU only and its CPU op refuses them (checked below), so rule 5a is checked here by
itself and against ONNX Runtime's CUDA op by tests/test_gqa_cuda.py.

Each case builds a one-node model, runs it on fresh random data (the past buffers random too, so
every position ORT leaves alone is recognisable) and checks the output by the package's error
contract and the presents position by position: rows the call writes within rounding, every
other row exactly as the reference says (the past's values, or zero).
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from _gqa_models import run_gqa
from cases import FLOORS
from ort_flash.reference import error_bound
from ort_flash.reference_gqa import gqa_lowp, gqa_reference

DTYPES = {"float32": np.float32, "float16": np.float16}

# name: (B, Hq, Hkv, D, rotary half-dim (0 = no rotary), phase, lengths T_b, S, buffer M, extra)
# phase: "prompt" (no past), "prompt_buf" (prompt into a max-length buffer), "decode" / "cont"
# (a past of P_b = T_b - S tokens); the buffer is shared unless extra["separate"].
CASES = {
    "prompt": (1, 6, 2, 64, 32, 'prompt', [33], 33, None, {}),
    "prompt_packed_partial_rotary": (1, 8, 1, 80, 16, "prompt", [7], 7, None, dict(packed=True)),
    "prompt_buf_padded_batch": (2, 6, 2, 64, 16, "prompt_buf", [33, 20], 33, 70, dict(packed=True)),
    "prompt_buf_padded_separate": (2, 4, 4, 80, 40, "prompt_buf", [7, 3], 7, 64, dict(separate=True)),
    "prompt_buf_one_row": (1, 6, 2, 64, 32, "prompt_buf", [45], 45, 96, {}),
    "prompt_buf_one_row_d128": (1, 4, 2, 128, 64, "prompt_buf", [77], 77, 130, dict(packed=True)),
    "prompt_buf_full_rotary_d128": (3, 8, 2, 128, 64, "prompt_buf", [300, 211, 7], 300, 320, dict(packed=True)),
    "prompt_no_rotary_d40": (2, 6, 2, 40, 0, "prompt", [33, 9], 33, None, {}),
    "prompt_interleaved": (1, 4, 4, 64, 24, "prompt", [33], 33, None, dict(interleaved=1)),
    "prompt_window": (1, 6, 2, 64, 32, "prompt", [33], 33, None, dict(local_window_size=5)),
    "prompt_window_padded": (2, 6, 2, 64, 32, "prompt_buf", [33, 12], 33, 40, dict(local_window_size=8)),
    "prompt_softcap_scale": (1, 8, 1, 64, 32, "prompt", [33], 33, None, dict(softcap=2.5, scale=0.4)),
    "prompt_smooth_softmax": (1, 6, 2, 64, 32, "prompt", [17], 17, None, dict(smooth_softmax=1)),
    "decode_head_sink_and_smooth": (2, 6, 2, 64, 0, "decode", [9, 30], 1, 32, dict(
        smooth_softmax=1, head_sink=True)),
    "prompt_head_sink": (2, 6, 3, 64, 32, "prompt", [23, 11], 23, None, dict(head_sink=True)),
    "prompt_head_sink_bias": (2, 6, 2, 64, 32, "prompt", [17, 17], 17, None,
                              dict(head_sink=True, attention_bias=True)),
    "prompt_bidirectional_padded": (2, 6, 2, 64, 32, "prompt", [17, 10], 17, None, dict(causal=0)),
    "decode_bidirectional": (2, 4, 1, 64, 0, "decode", [30, 12], 1, 32, dict(causal=0)),
    "prompt_position_ids": (2, 4, 2, 64, 32, "prompt", [7, 7], 7, None, dict(position_ids=True)),
    "decode_shared": (3, 6, 2, 64, 32, "decode", [1, 40, 64], 1, 64, dict(packed=True)),
    "decode_shared_window_softcap": (2, 8, 1, 80, 16, "decode", [50, 9], 1, 130, dict(
        local_window_size=16, softcap=30.0, interleaved=1)),
    "decode_separate_short_past": (2, 4, 4, 64, 32, "decode", [20, 13], 1, 19, dict(separate=True)),
    "decode_position_ids": (2, 6, 2, 64, 32, "decode", [20, 13], 1, 64, dict(position_ids=True)),
    "decode_long_cache": (1, 8, 1, 64, 32, "decode", [3001], 1, 3072, {}),
    "cont_shared": (1, 6, 2, 64, 32, "cont", [40], 7, 64, dict(packed=True)),
    "cont_separate_window": (1, 8, 1, 80, 16, "cont", [70], 33, 37, dict(separate=True, local_window_size=20)),
    "cont_no_rotary": (1, 4, 4, 64, 0, "cont", [100], 33, 130, {}),
    # Q/K norms before the rotary (reference_gqa rule 5a)
    "prompt_qk_norm_padded": (2, 6, 2, 64, 32, "prompt", [17, 9], 17, None, dict(qk_norm=True)),
    "decode_qk_norm_no_rotary": (2, 4, 2, 64, 0, "decode", [20, 7], 1, 32, dict(qk_norm=True, packed=True)),
    "cont_qk_norm_partial_rotary": (1, 8, 2, 80, 16, "cont", [40], 7, 64, dict(qk_norm=True, qk_norm_epsilon=1e-3)),
}
# ONNX Runtime's CPU op refuses fused Q/K norms (its schema: CUDA and WebGPU only).
ORT_CPU_CASES = {n: c for n, c in CASES.items() if not c[9].get("qk_norm")}


def _inputs(rng, dtype, spec):
    """Feeds, attributes and whether the buffer is shared, for one CASES entry."""
    b, hq, hkv, d, half, phase, lengths, s, m, extra = spec
    rnd = lambda *shape: rng.standard_normal(shape).astype(dtype)  # noqa: E731
    lengths = np.asarray(lengths)
    total = s if phase.startswith("prompt") else int(lengths.max())
    feeds = {}
    if extra.get("packed"):
        feeds["query"] = rnd(b, s, (hq + 2 * hkv) * d)
    else:
        feeds.update(query=rnd(b, s, hq * d), key=rnd(b, s, hkv * d), value=rnd(b, s, hkv * d))
    if m is not None:
        feeds.update(past_key=rnd(b, hkv, m, d), past_value=rnd(b, hkv, m, d))
    feeds["seqlens_k"] = (lengths - 1).astype(np.int32)
    feeds["total_sequence_length"] = np.array(total, np.int32)
    attrs = dict(num_heads=hq, kv_num_heads=hkv)
    if half:
        angles = np.arange(max(total, m or 0) + 8)[:, None] / 10000.0 ** (np.arange(half) / half)
        feeds.update(cos_cache=np.cos(angles).astype(dtype), sin_cache=np.sin(angles).astype(dtype))
        attrs.update(do_rotary=1, rotary_interleaved=extra.get("interleaved", 0))
    if extra.get("position_ids"):
        past = 0 if phase.startswith("prompt") else lengths - s
        start = rng.integers(0, 5, size=(b, 1)) + np.reshape(past, (-1, 1))
        feeds["position_ids"] = (start + np.arange(s)).astype(np.int64)
    if extra.get("attention_bias"):
        feeds["attention_bias"] = rnd(b, 1, s, total)
    if extra.get("head_sink"):
        feeds["head_sink"] = rnd(hq)
    if extra.get("qk_norm"):
        feeds["q_norm_weight"] = (1 + 0.25 * rng.standard_normal(d)).astype(dtype)
        feeds["k_norm_weight"] = (1 + 0.25 * rng.standard_normal(d)).astype(dtype)
    for name in ("local_window_size", "softcap", "scale", "smooth_softmax", "causal", "qk_norm_epsilon"):
        if name in extra:
            attrs[name] = extra[name]
    shared = m is not None and not extra.get("separate")
    return feeds, attrs, shared


def _reference(fn, feeds, attrs, shared):
    args = [feeds.get(n) for n in ("query", "key", "value", "past_key", "past_value", "seqlens_k",
                                   "total_sequence_length", "cos_cache", "sin_cache")]
    extra = {n: feeds[n] for n in ("position_ids", "attention_bias", "head_sink", "q_norm_weight", "k_norm_weight")
             if n in feeds}
    return fn(*args, **attrs, **extra, share_buffer=shared)


def _written(spec, present_shape):
    """(B, 1, L, 1) bool: the present rows this call writes (rule 6 of reference_gqa)."""
    b, _, _, _, _, phase, lengths, s, _, _ = spec
    past = np.zeros(b, int) if phase.startswith("prompt") else np.asarray(lengths) - s
    rows = np.arange(present_shape[2])
    return ((rows >= past[:, None]) & (rows < past[:, None] + s))[:, None, :, None]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", sorted(ORT_CPU_CASES))
def test_gqa_reference_matches_onnxruntime(name, dtype):
    spec = CASES[name]
    seed = secrets.randbits(64)
    ctx = f"{name} {dtype} seed={seed}"
    feeds, attrs, shared = _inputs(np.random.default_rng(seed), DTYPES[dtype], spec)
    out, pk, pv = run_gqa({n: a.copy() for n, a in feeds.items()}, shared=shared, **attrs)
    ref, ref_pk, ref_pv = _reference(gqa_reference, feeds, attrs, shared)
    low = _reference(gqa_lowp, feeds, attrs, shared)

    err = np.abs(out.astype(np.float64) - ref).max()
    bound = error_bound(ref, low, FLOORS[dtype][0])
    assert err <= bound, f"{ctx}: max |output - ref| = {err:.3g} > {bound:.3g}"

    check_presents(ctx, spec, dtype, (pk, pv), (ref_pk, ref_pv))


ULP = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23}


def check_presents(ctx, spec, dtype, presents, references):
    """The presents of a CASES call against the reference's: every row the call does not write
    exactly, the new V rows exactly, the new K rows within two roundings of the rotated K."""
    (pk, pv), (ref_pk, ref_pv) = presents, references
    assert pk.shape == ref_pk.shape and pv.shape == ref_pv.shape, ctx
    written = np.broadcast_to(_written(spec, pk.shape), pk.shape)
    assert np.array_equal(pk[~written], ref_pk[~written]), f"{ctx}: present_key off the written rows"
    assert np.array_equal(pv[~written], ref_pv[~written]), f"{ctx}: present_value off the written rows"
    assert np.array_equal(pv[written], ref_pv[written]), f"{ctx}: present_value's new rows"
    k_err = np.abs(pk[written].astype(np.float64) - ref_pk[written])
    assert np.all(k_err <= 2 * ULP[dtype] * np.abs(ref_pk[written]) + 1e-6), f"{ctx}: present_key's new rows"


# Calls ORT 1.31.1's CPU op refuses; the reference refuses them too (names: (spec, the change)).
REFUSED = {
    "rotary_d40": (CASES["prompt_no_rotary_d40"], dict(half=8)),
    "total_between_past_and_past_plus_new": (CASES["decode_separate_short_past"], dict(total=25)),
    "continuation_batch_2": ((2, 4, 4, 64, 0, "cont", [20, 20], 7, 32, {}), {}),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_gqa_reference_refuses_what_onnxruntime_refuses(name):
    spec, change = REFUSED[name]
    spec = list(spec)
    if "half" in change:
        spec[4] = change["half"]
    feeds, attrs, shared = _inputs(np.random.default_rng(0), np.float32, tuple(spec))
    if "total" in change:
        feeds["total_sequence_length"] = np.array(change["total"], np.int32)
    with pytest.raises(Exception, match="GroupQueryAttention"):
        run_gqa(feeds, shared=shared, **attrs)
    with pytest.raises(ValueError):
        _reference(gqa_reference, feeds, attrs, shared)


def test_onnxruntime_cpu_refuses_qk_norm():
    """Why the Q/K norm cases are not checked against ONNX Runtime's CPU op: it refuses them."""
    feeds, attrs, shared = _inputs(np.random.default_rng(0), np.float32, CASES["prompt_qk_norm_padded"])
    with pytest.raises(Exception, match="(?i)norm"):
        run_gqa(feeds, shared=shared, **attrs)


def test_qk_norm_rule():
    """Rule 5a by itself: each head row of Q and of the new K comes out with a root mean square of
    1 before its weight (so w = 1 gives unit-RMS rows, and the weight scales each dim), the norm
    precedes the rotary, and the rows land in present_key normed."""
    from ort_flash.reference_gqa import gqa_problem, rms_norm_heads

    rng = np.random.default_rng(5)
    x = 3.0 * rng.standard_normal((2, 4, 5, 16))
    unit = rms_norm_heads(x, np.ones(16), 0.0)
    np.testing.assert_allclose(np.sqrt(np.mean(unit ** 2, axis=-1)), 1.0, rtol=1e-12)
    w = rng.standard_normal(16)
    np.testing.assert_allclose(rms_norm_heads(x, w, 0.0), unit * w, rtol=1e-12)
    with pytest.raises(ValueError):
        rms_norm_heads(x, np.ones(8), 0.0)
    feeds, attrs, shared = _inputs(rng, np.float32, CASES["prompt_qk_norm_padded"])
    p = _reference(gqa_problem, feeds, attrs, shared)
    plain = dict(feeds)
    del plain["q_norm_weight"], plain["k_norm_weight"]
    q_norm = {**plain, "query": feeds["query"]}
    p0 = _reference(gqa_problem, q_norm, attrs, shared)
    assert not np.allclose(p.q, p0.q) and not np.allclose(p.present_key, p0.present_key)
    # No rotary: the problem's Q is exactly the normed query.
    no_rot = {k: v for k, v in feeds.items() if k not in ("cos_cache", "sin_cache")}
    attrs_nr = {k: v for k, v in attrs.items() if k not in ("do_rotary", "rotary_interleaved")}
    q = _reference(gqa_problem, no_rot, attrs_nr, shared).q
    hq, d = attrs["num_heads"], feeds["q_norm_weight"].shape[0]
    heads = feeds["query"].astype(np.float64).reshape(2, 17, hq, d).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(q, rms_norm_heads(heads, feeds["q_norm_weight"], 1e-6), rtol=1e-12)
    with pytest.raises(ValueError, match="together"):
        _reference(gqa_problem, {**plain, "q_norm_weight": feeds["q_norm_weight"]}, attrs, shared)
