"""ort_flash.reference_gqa against ONNX Runtime's own CPU GroupQueryAttention (onnxruntime 1.31).

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
}


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
    for name in ("local_window_size", "softcap", "scale", "smooth_softmax", "causal"):
        if name in extra:
            attrs[name] = extra[name]
    shared = m is not None and not extra.get("separate")
    return feeds, attrs, shared


def _reference(fn, feeds, attrs, shared):
    args = [feeds.get(n) for n in ("query", "key", "value", "past_key", "past_value", "seqlens_k",
                                   "total_sequence_length", "cos_cache", "sin_cache")]
    extra = {n: feeds[n] for n in ("position_ids", "attention_bias", "head_sink") if n in feeds}
    return fn(*args, **attrs, **extra, share_buffer=shared)


def _written(spec, present_shape):
    """(B, 1, L, 1) bool: the present rows this call writes (rule 6 of reference_gqa)."""
    b, _, _, _, _, phase, lengths, s, _, _ = spec
    past = np.zeros(b, int) if phase.startswith("prompt") else np.asarray(lengths) - s
    rows = np.arange(present_shape[2])
    return ((rows >= past[:, None]) & (rows < past[:, None] + s))[:, None, :, None]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", sorted(CASES))
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
