"""Reliability on CUDAExecutionProvider (the GPU machine): CUDA graphs, device memory over
10 000 runs, two sessions on one device, a second CUDA context in the process, a device other
than 0. Every result is compared bitwise with a plain CUDA session's (the kernels are
deterministic, tests/test_reliability_determinism.py)."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

from _onnx_models import flash_attention_model
from _session_runs import run_bound, session
from cases import make_inputs

pytestmark = pytest.mark.gpu

DTYPES = {"float32": np.float32, "float16": np.float16}
# Cases for the graph and memory tests; "past_scratch" has a cache but no present outputs, so
# the op takes a scratch buffer from ORT's allocator inside every run.
CASES = {
    "causal_gqa_mask": (dict(b=2, hq=8, hkv=2, sq=77, skv=150, d=64, causal=True,
                             mask=("additive", "b1qk")), ("Y", "softmax_lse")),
    "past_present": (dict(b=2, hq=4, hkv=4, sq=1, skv=1, past=200, d=128, causal=True),
                     ("Y", "present_key", "present_value")),
    "past_scratch": (dict(b=2, hq=4, hkv=2, sq=5, skv=5, past=60, d=64, causal=True), ("Y",)),
    "nonpad_window": (dict(b=3, hq=4, hkv=4, sq=33, skv=90, d=96, nonpad=True, window=(20, 0)),
                      ("Y", "softmax_lse")),
    # Decode against a static cache: B x Hkv 64, so two KV splits merged in the split kernel,
    # whose arrival counters are per stream and must be zero again after every launch.
    "decode_split": (dict(b=16, hq=16, hkv=4, sq=1, skv=6000, d=128, causal=True, nonpad=True),
                     ("Y", "softmax_lse")),
}


def _case(name, dtype, seed=0):
    spec, wanted = CASES[name]
    spec = dict(spec, dtype=dtype)
    feeds, attrs, _ = make_inputs(spec, np.random.default_rng(seed))
    dt = DTYPES[dtype]
    b, hq, hkv, sq, d = spec["b"], spec["hq"], spec["hkv"], spec["sq"], spec["d"]
    total = spec.get("past", 0) + spec["skv"]
    shapes = {"Y": ((b, hq, sq, d), dt), "present_key": ((b, hkv, total, d), dt),
              "present_value": ((b, hkv, total, d), dt), "softmax_lse": ((b, hq, sq), np.float32)}
    specs = {n: shapes[n] for n in wanted}
    model = flash_attention_model(feeds, {n: s[1] for n, s in specs.items()}, **attrs)
    return model, specs, lambda s: make_inputs(spec, np.random.default_rng(s))[0]


def cuda(device_id=0, **options):
    return [("CUDAExecutionProvider", {"device_id": str(device_id), **{k: str(v) for k, v in options.items()}})]


class DeviceBinding:
    """Inputs and outputs resident on the GPU, bound once (what CUDA graphs need)."""

    def __init__(self, sess, feeds, specs, device_id=0):
        import onnxruntime as ort

        self.sess, self.binding = sess, sess.io_binding()
        self.inputs = {n: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a), "cuda", device_id)
                       for n, a in feeds.items()}
        self.outputs = {n: ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dt, "cuda", device_id)
                        for n, (shape, dt) in specs.items()}
        for n, v in self.inputs.items():
            self.binding.bind_ortvalue_input(n, v)
        for n, v in self.outputs.items():
            self.binding.bind_ortvalue_output(n, v)

    def run(self, feeds=None):
        for n, a in (feeds or {}).items():
            self.inputs[n].update_inplace(np.ascontiguousarray(a))
        self.sess.run_with_iobinding(self.binding)
        return {n: v.numpy() for n, v in self.outputs.items()}


def _assert_bitwise(got, want, what):
    for n in want:
        assert np.array_equal(got[n].view(np.uint8), want[n].view(np.uint8)), f"{what}: {n} differs"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", CASES)
def test_cuda_graph_capture_and_replay(name, dtype):
    model, specs, feeds_for = _case(name, dtype)
    plain = session(model, providers=cuda())
    graph = session(model, providers=cuda(enable_cuda_graph=1))
    bound = DeviceBinding(graph, feeds_for(0), specs)
    for step in range(6):  # ORT runs a few times, captures, then replays the graph
        feeds = feeds_for(step)
        got = bound.run(feeds)
        _assert_bitwise(got, run_bound(plain, feeds, specs), f"graph run {step}")


def _device_memory_used(device_id=0):
    """Bytes in use on the device (whole device), or None when no way to ask is importable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_id)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # noqa: BLE001 - not installed, or no NVML: try torch
        pass
    try:
        import torch

        free, total = torch.cuda.mem_get_info(device_id)
        return int(total - free)
    except Exception:  # noqa: BLE001
        return None


@pytest.mark.parametrize("name", ["causal_gqa_mask", "past_scratch"])
def test_no_device_memory_growth_over_10000_runs(name):
    if _device_memory_used() is None:
        pytest.skip("neither nvidia-ml-py (pynvml) nor torch with CUDA is importable to read device memory")
    model, specs, feeds_for = _case(name, "float16")
    bound = DeviceBinding(session(model, providers=cuda()), feeds_for(0), specs)
    for _ in range(200):
        bound.sess.run_with_iobinding(bound.binding)
    before = _device_memory_used()
    for _ in range(10_000):
        bound.sess.run_with_iobinding(bound.binding)
    bound.binding.synchronize_outputs()
    growth = _device_memory_used() - before
    assert growth <= 4 << 20, f"device memory grew by {growth / 2**20:.1f} MiB over 10 000 runs"


@pytest.mark.parametrize("name", ["causal_gqa_mask", "decode_split"])
def test_two_sessions_on_device_0(name):
    """Two sessions, four threads running them at once: ONNX Runtime gives concurrent runs their
    own streams, so decode's per-stream split counters must keep every result exact."""
    model, specs, feeds_for = _case(name, "float16")
    a = session(model, providers=cuda(0))
    b = session(model, providers=cuda(0))
    feeds = {s: feeds_for(s) for s in range(4)}
    want = {s: run_bound(a, feeds[s], specs) for s in feeds}
    for s in feeds:
        _assert_bitwise(run_bound(b, feeds[s], specs), want[s], "second session")
    errors = []

    def loop(sess, offset):
        try:
            for i in range(40):
                s = (i + offset) % len(feeds)
                _assert_bitwise(run_bound(sess, feeds[s], specs), want[s], f"concurrent run {i}")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=loop, args=(sess, k)) for k, sess in enumerate((a, b, a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _driver():
    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    return cu


def _create_context(cu, device=0):
    dev = ctypes.c_int()
    assert cu.cuDeviceGet(ctypes.byref(dev), device) == 0
    ctx = ctypes.c_void_p()
    if hasattr(cu, "cuCtxCreate_v2"):
        rc = cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
    else:  # CUDA 13 drivers: cuCtxCreate_v4(ctx, params, flags, dev)
        rc = cu.cuCtxCreate_v4(ctypes.byref(ctx), None, 0, dev)
    assert rc == 0, f"cuCtxCreate failed: {rc}"
    return ctx  # current on the calling thread


def test_second_cuda_context_does_not_break_the_first_session():
    model, specs, feeds_for = _case("past_present", "float16")
    feeds = feeds_for(1)
    first = session(model, providers=cuda())
    want = run_bound(first, feeds, specs)
    cu = _driver()
    ctx = _create_context(cu)  # now current on this thread, not the primary context
    try:
        buf = ctypes.c_uint64()
        assert cu.cuMemAlloc_v2(ctypes.byref(buf), 1 << 20) == 0  # the context is in use
        _assert_bitwise(run_bound(first, feeds, specs), want, "with a second context current")
        late = session(model, providers=cuda())  # created while the other context is current
        _assert_bitwise(run_bound(late, feeds, specs), want, "session created under it")
        errors = []

        def other_thread():
            try:
                assert cu.cuCtxSetCurrent(ctx) == 0
                _assert_bitwise(run_bound(first, feeds, specs), want, "thread with the second context")
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        if errors:
            raise errors[0]
        assert cu.cuMemFree_v2(buf) == 0
    finally:
        assert cu.cuCtxDestroy_v2(ctx) == 0
    _assert_bitwise(run_bound(first, feeds, specs), want, "after the second context is destroyed")


def test_device_other_than_0_loads_its_own_kernels():
    cu = _driver()
    count = ctypes.c_int()
    assert cu.cuDeviceGetCount(ctypes.byref(count)) == 0
    if count.value < 2:
        pytest.skip(f"needs two GPUs, this machine has {count.value}")
    model, specs, feeds_for = _case("causal_gqa_mask", "float16")
    feeds = feeds_for(2)
    want = run_bound(session(model, providers=cuda(0)), feeds, specs)
    on_1 = session(model, providers=cuda(1))
    _assert_bitwise(run_bound(on_1, feeds, specs), want, "device 1")
    bound = DeviceBinding(on_1, feeds, specs, device_id=1)
    _assert_bitwise(bound.run(), want, "device 1, inputs resident on device 1")
