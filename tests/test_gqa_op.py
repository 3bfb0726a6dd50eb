"""ort_flash's GroupQueryAttention on the CPU execution provider against the float64 reference of
ONNX Runtime's op (ort_flash.reference_gqa, itself checked against ONNX Runtime 1.31.1's CPU op in
test_reference_gqa) and against ONNX Runtime's op in the same one-node model.

The cases are test_reference_gqa's, less the feature ort_flash's op refuses (an attention bias:
test_gqa_op_refuses); tests/test_gqa_cuda.py runs the same cases, attention sinks (head_sink,
smooth_softmax=1) included, on the CUDA EP. The output is NaN-poisoned before the
run and checked by the package's error contract; the presents position by position: the rows the
call writes within one rounding of the rotated K (V exactly), every other row exactly as ONNX
Runtime's op leaves it (the past's values in a shared buffer, zero in a separate one).
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest
from ml_dtypes import bfloat16

from _gqa_models import run_gqa
from cases import FLOORS
from ort_flash.reference import error_bound
from ort_flash.reference_gqa import gqa_lowp, gqa_reference
from test_reference_gqa import CASES, _inputs, _reference, check_presents

UNSUPPORTED = {"attention_bias"}
SUPPORTED = {n: c for n, c in CASES.items() if not UNSUPPORTED & set(c[9])}
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": bfloat16}


@pytest.fixture(scope="module")
def library():
    import ort_flash

    try:
        return ort_flash.library_path()
    except FileNotFoundError as e:
        pytest.skip(f"the ort_flash library is not built: {e}")


def _padding_rows(spec, shape):
    """(B, S, 1) bool: the right-padding query rows of a first prompt (s >= T_b)."""
    b, _, _, _, _, phase, lengths, s, _, _ = spec
    if not phase.startswith("prompt"):
        return np.zeros((b, s, 1), bool)
    return (np.arange(s)[None, :] >= np.asarray(lengths)[:, None])[:, :, None]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_gqa_op_matches_reference(name, dtype, library):
    check_gqa_case(name, dtype, lambda feeds, shared, attrs: run_gqa(
        feeds, shared=shared, library=library, threads=2, **attrs))


def check_gqa_case(name, dtype, run):
    """Case `name` in `dtype` through `run(feeds, shared, attrs) -> (output, present_key,
    present_value)` against the reference (tests/test_gqa_cuda.py runs it on the CUDA EP)."""
    spec = CASES[name]
    seed = secrets.randbits(64)
    ctx = f"{name} {dtype} seed={seed}"
    feeds, attrs, shared = _inputs(np.random.default_rng(seed), DTYPES[dtype], spec)
    out, pk, pv = run({n: a.copy() for n, a in feeds.items()}, shared, attrs)
    ref, ref_pk, ref_pv = _reference(gqa_reference, feeds, attrs, shared)
    low = _reference(gqa_lowp, feeds, attrs, shared)
    check = np.ones(out.shape, bool)
    if dtype != "float32" and "local_window_size" in spec[9]:
        # ONNX Runtime's fp16 op moves a windowed padding row of a first prompt to the last real
        # token (reference_gqa rule 10); ort_flash keeps the float32 rule for every type. Those
        # rows feed no real token.
        check &= ~_padding_rows(spec, out.shape)
    assert not np.isnan(out[check]).any(), f"{ctx}: output elements left unwritten"
    err = np.abs(out.astype(np.float64) - ref)[check].max()
    bound = error_bound(ref[check], low[check], FLOORS[dtype][0])
    assert err <= bound, f"{ctx}: max |output - ref| = {err:.3g} > {bound:.3g}"

    check_presents(ctx, spec, dtype, (pk, pv), (ref_pk, ref_pv))


@pytest.mark.parametrize("name", ["decode_shared", "prompt_buf_padded_batch", "cont_separate_window",
                                  "prompt_smooth_softmax", "decode_head_sink_and_smooth", "prompt_head_sink"])
def test_gqa_op_agrees_with_onnxruntime(name, library):
    """Both ops on the same float32 call: outputs within float32 rounding, presents equal."""
    feeds, attrs, shared = _inputs(np.random.default_rng(secrets.randbits(64)), np.float32, SUPPORTED[name])
    ours = run_gqa({n: a.copy() for n, a in feeds.items()}, shared=shared, library=library, **attrs)
    theirs = run_gqa({n: a.copy() for n, a in feeds.items()}, shared=shared, **attrs)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-4, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-6, atol=1e-6, err_msg=name)
    np.testing.assert_array_equal(ours[2], theirs[2], err_msg=name)


# What ort_flash's op refuses, by the node, the input or attribute and the reason.
REFUSED = {
    "prompt_head_sink_bias": "attention bias",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_gqa_op_refuses(name, library):
    feeds, attrs, shared = _inputs(np.random.default_rng(0), np.float32, CASES[name])
    with pytest.raises(Exception, match=f"GroupQueryAttention node .*{REFUSED[name]}"):
        run_gqa(feeds, shared=shared, library=library, **attrs)


def _kept(total: int, capacity: int, window: int) -> int:
    """Rows a windowed cache keeps after ``total`` tokens (ONNX Runtime's sliding_window_cache)."""
    g = capacity - window + 1
    return total if total <= capacity else total - g * -(-(total - capacity) // g)


# (B, capacity C, window W, steps: new tokens per call; the first call is the prompt)
WINDOWED = {
    "prompt_then_decode_past_compaction": (1, 8, 4, [5] + [1] * 12),
    "prompt_longer_than_cache": (1, 8, 4, [12, 1, 1]),
    "chunked_continuation": (1, 10, 4, [6, 3, 5, 1, 7]),
    "window_equals_capacity": (2, 6, 6, [6] + [1] * 8),
    "batch_of_three_decode": (3, 9, 5, [4] + [1] * 9),
}


@pytest.mark.parametrize("name", sorted(WINDOWED))
def test_gqa_op_windowed_cache_matches_onnxruntime(name, library):
    """A GenAI-style windowed KV cache (sliding_window_cache=1, as the builder writes for Mistral
    and Gemma 2): a chain of calls on each op's own shared buffer, ours against ONNX Runtime's,
    outputs within float32 rounding, the kept rows [0, L(T)) of the cache alike."""
    b, cap, window, steps = WINDOWED[name]
    hq, hkv, d, half = 4, 2, 32, 8
    rng = np.random.default_rng(secrets.randbits(64))
    angles = np.arange(64)[:, None] / 10000.0 ** (np.arange(half) / half)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    attrs = dict(num_heads=hq, kv_num_heads=hkv, do_rotary=1, local_window_size=window, sliding_window_cache=1)
    caches = {who: [rng.standard_normal((b, hkv, cap, d)).astype(np.float32)] * 2 for who in ("ours", "ort")}
    total = 0
    for step, s in enumerate(steps):
        total += s
        feeds = dict(query=rng.standard_normal((b, s, (hq + 2 * hkv) * d)).astype(np.float32),
                     seqlens_k=np.full(b, total - 1, np.int32),
                     total_sequence_length=np.array(total, np.int32), cos_cache=cos, sin_cache=sin)
        results = {}
        for who, lib in (("ours", library), ("ort", None)):
            past_key, past_value = caches[who]
            out, pk, pv = run_gqa({**feeds, "past_key": past_key, "past_value": past_value}, shared=True,
                                  library=lib, **attrs)
            caches[who] = [pk, pv]
            results[who] = out
        kept = _kept(total, cap, window)
        ctx = f"{name} step {step} (T={total}, kept {kept})"
        np.testing.assert_allclose(results["ours"], results["ort"], rtol=1e-4, atol=1e-5, err_msg=ctx)
        for i in range(2):
            np.testing.assert_allclose(caches["ours"][i][:, :, :kept], caches["ort"][i][:, :, :kept],
                                       rtol=1e-6, atol=1e-6, err_msg=ctx)


def test_bfloat16_read_back_is_exact():
    """tests/test_gqa_cuda.py reads bfloat16 outputs back through a one-node Cast session
    (ONNX Runtime's Python API has no numpy bfloat16): checked here on the CPU EP, bit for bit
    over random values, signed zeros, infinities and subnormals, on an odd shape."""
    import onnx
    import onnxruntime as ort

    from test_gqa_cuda import read_bfloat16

    rng = np.random.default_rng()
    a = (rng.standard_normal((3, 5, 7)) * 10.0 ** rng.integers(-40, 38, (3, 5, 7))).astype(bfloat16)
    a.flat[:5] = np.array([0.0, -0.0, np.inf, -np.inf, 1e-40], dtype=np.float32).astype(bfloat16)
    value = ort.OrtValue.ortvalue_from_shape_and_type(list(a.shape), onnx.TensorProto.BFLOAT16, "cpu", 0)
    value.update_inplace(a.view(np.uint16))
    out = read_bfloat16(value, "CPUExecutionProvider")
    assert out.dtype == bfloat16 and out.shape == a.shape
    np.testing.assert_array_equal(out.view(np.uint16), a.view(np.uint16))
