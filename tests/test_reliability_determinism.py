"""Determinism: the same inputs give bitwise identical outputs run after run, session after
session (CPU; the CUDA kernels on one GPU, marked gpu). Neither kernel uses atomics or a
split over keys whose reduction order could vary between runs."""

from __future__ import annotations

import numpy as np
import pytest

from _onnx_models import flash_attention_model
from _session_runs import run_bound, session
from cases import DTYPES, make_inputs

RUNS = 20


def _case(dtype):
    spec = dict(dtype=dtype, b=2, hq=8, hkv=2, sq=97, skv=203, d=64, causal=True,
                mask=("additive", "b1qk"), past=31, window=(80, -1))
    feeds, attrs, _ = make_inputs(spec, np.random.default_rng())
    dt = DTYPES[dtype]
    outputs = {"Y": dt, "present_key": dt, "present_value": dt, "softmax_lse": np.float32}
    model = flash_attention_model(feeds, outputs, **attrs)
    specs = {"Y": ((2, 8, 97, 64), dt), "present_key": ((2, 2, 234, 64), dt),
             "present_value": ((2, 2, 234, 64), dt), "softmax_lse": ((2, 8, 97), np.float32)}
    return model, feeds, specs


def _bits(out):
    return {n: a.view(np.uint8).copy() for n, a in out.items()}


@pytest.mark.parametrize("provider", [
    "CPUExecutionProvider",
    pytest.param("CUDAExecutionProvider", marks=pytest.mark.gpu),
])
@pytest.mark.parametrize("dtype", DTYPES)
def test_bitwise_identical_run_after_run(provider, dtype):
    model, feeds, specs = _case(dtype)
    sess = session(model, providers=[provider])
    first = _bits(run_bound(sess, feeds, specs))
    for i in range(RUNS):
        again = _bits(run_bound(sess, feeds, specs))
        for name in first:
            assert np.array_equal(again[name], first[name]), f"run {i + 1}: {name} changed"
    other = _bits(run_bound(session(model, providers=[provider]), feeds, specs))
    for name in first:
        assert np.array_equal(other[name], first[name]), f"a second session: {name} differs"
