"""ort_flash's GroupQueryAttention on the CPU execution provider against the float64 reference of
ONNX Runtime's op (ort_flash.reference_gqa, itself checked against ONNX Runtime 1.31.1's CPU op in
test_reference_gqa) and against ONNX Runtime's op in the same one-node model.

The cases are test_reference_gqa's, less the features ort_flash's op refuses (attention sinks,
smooth softmax, an attention bias: test_gqa_op_refuses). The output is NaN-poisoned before the
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
from test_reference_gqa import CASES, _inputs, _reference, _written

UNSUPPORTED = {"smooth_softmax", "head_sink", "attention_bias"}
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
    spec = SUPPORTED[name]
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

    assert pk.shape == ref_pk.shape and pv.shape == ref_pv.shape, ctx
    written = np.broadcast_to(_written(spec, pk.shape), pk.shape)
    assert np.array_equal(pk[~written], ref_pk[~written]), f"{ctx}: present_key off the written rows"
    assert np.array_equal(pv[~written], ref_pv[~written]), f"{ctx}: present_value off the written rows"
    assert np.array_equal(pv[written], ref_pv[written]), f"{ctx}: present_value's new rows"
    ulp = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23}[dtype]
    k_err = np.abs(pk[written].astype(np.float64) - ref_pk[written])
    assert np.all(k_err <= 2 * ulp * np.abs(ref_pk[written]) + 1e-6), f"{ctx}: present_key's new rows"


@pytest.mark.parametrize("name", ["decode_shared", "prompt_buf_padded_batch", "cont_separate_window"])
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
    "prompt_smooth_softmax": "smooth_softmax",
    "decode_head_sink_and_smooth": "attention sinks",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_gqa_op_refuses(name, library):
    feeds, attrs, shared = _inputs(np.random.default_rng(0), np.float32, CASES[name])
    with pytest.raises(Exception, match=f"GroupQueryAttention node .*{REFUSED[name]}"):
        run_gqa(feeds, shared=shared, library=library, **attrs)
