"""ort_flash's GroupQueryAttention on the CUDA execution provider (cpp/gqa_launch.cc: the prepare
kernels of aot/gqa_prepare.py, then the attention kernels, and with attention sinks the rescale of
aot/sink_rescale.py) against the float64 reference, case for case as tests/test_gqa_op.py checks
the CPU op; attention sinks in each form (head_sink, smooth_softmax=1, both); a windowed KV cache
(sliding_window_cache=1) over chains of calls against the CPU op; and seqlens_k values
the op cannot use (device data, never read on the host) giving zero rows and leaving the cache
alone. GPU only."""

from __future__ import annotations

import functools
import secrets

import numpy as np
import onnx
import pytest
from ml_dtypes import bfloat16

from _gqa_models import OUTPUT_NAMES, gqa_model, output_shapes
from cases import FLOORS
from ort_flash.reference import error_bound
from ort_flash.reference_gqa import gqa_lowp, gqa_reference
from _gqa_models import run_gqa
from test_gqa_op import DTYPES, SUPPORTED, WINDOWED, _kept, check_gqa_case
from test_reference_gqa import _inputs, _reference

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def library():
    import ort_flash

    return ort_flash.library_path()


def _device(array: np.ndarray):
    """A CUDA OrtValue holding `array`."""
    import onnxruntime as ort

    if array.dtype == bfloat16:
        v = ort.OrtValue.ortvalue_from_shape_and_type(list(array.shape), onnx.TensorProto.BFLOAT16, "cuda", 0)
        v.update_inplace(array.view(np.uint16))
        return v
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), "cuda", 0)


@functools.lru_cache(maxsize=None)
def _cast_to_float32(provider: str):
    """A one-node session on `provider` casting a bfloat16 tensor of any shape to float32."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, None)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], "read", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    return ort.InferenceSession(model.SerializeToString(), providers=[provider])


def read_bfloat16(value, provider: str = "CUDAExecutionProvider") -> np.ndarray:
    """A bfloat16 OrtValue's contents on the host. ONNX Runtime's Python API has no numpy type for
    bfloat16 (`OrtValue.numpy()` refuses it), so a one-node session casts it to float32 where it
    lies (exact: float32 holds every bfloat16) and returns that on the host."""
    sess = _cast_to_float32(provider)
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", value)
    binding.bind_output("y", "cpu")
    sess.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0].astype(bfloat16)


def _host(value, dtype) -> np.ndarray:
    return read_bfloat16(value) if dtype == bfloat16 else value.numpy()


def run_gqa_cuda(feeds, shared, attrs, library):
    """(output, present_key, present_value) of ort_flash's op on the CUDA EP, the inputs on the GPU
    (total_sequence_length on the host), the outputs NaN-filled device buffers, a shared present
    bound to the past's own buffer (as ONNX Runtime GenAI binds it)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.register_custom_ops_library(library)
    sess = ort.InferenceSession(gqa_model(feeds, "ort_flash", **attrs), opts,
                                providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    out_shape, present_shape = output_shapes(feeds, attrs)
    dtype = feeds["query"].dtype
    values = {n: ort.OrtValue.ortvalue_from_numpy(a) if n == "total_sequence_length" else _device(a)
              for n, a in feeds.items()}
    outputs = {"output": _device(np.full(out_shape, np.nan, dtype))}
    for name, past_name in (("present_key", "past_key"), ("present_value", "past_value")):
        outputs[name] = values[past_name] if shared else _device(np.full(present_shape, np.nan, dtype))
    binding = sess.io_binding()
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    for name in OUTPUT_NAMES:
        binding.bind_ortvalue_output(name, outputs[name])
    sess.run_with_iobinding(binding)
    return tuple(_host(outputs[n], dtype) for n in OUTPUT_NAMES)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_gqa_cuda_matches_reference(name, dtype, library):
    check_gqa_case(name, dtype, lambda feeds, shared, attrs: run_gqa_cuda(feeds, shared, attrs, library))


@pytest.mark.parametrize("shared", [True, False])
def test_gqa_cuda_impossible_seqlens(shared, library):
    """A decode step whose seqlens_k holds values no call can have (negative, past the total):
    those rows output 0 and their cache rows are not written; the valid row is computed."""
    feeds, attrs, _ = _inputs(np.random.default_rng(0), np.float16, SUPPORTED["decode_shared"])
    b = feeds["query"].shape[0]
    if b < 2:
        pytest.skip("the case needs two batch rows")
    seqlens = feeds["seqlens_k"].copy()
    seqlens[0] = -5
    seqlens[1] = 1 << 30
    feeds["seqlens_k"] = seqlens
    before = feeds["past_key"].copy()
    out, pk, _ = run_gqa_cuda({n: a.copy() for n, a in feeds.items()}, shared, attrs, library)
    assert not np.isnan(out).any()
    assert (out[:2] == 0).all()
    if shared:
        assert np.array_equal(pk[:2], before[:2])
    else:
        assert (pk[:2] == 0).all()


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", ["prompt_head_sink", "decode_head_sink_and_smooth"])
def test_gqa_cuda_computes_attention_sinks(name, dtype, library):
    """Attention sinks on CUDA (the attention's log-sum-exp, then the rescale), each form on the
    same inputs: head_sink alone and smooth_softmax=1 alone within the error contract of their
    float64 references, which the call without sinks is not (the sinks are computed, not dropped);
    both given, head_sink wins, as in ONNX Runtime's op: the same output as head_sink alone."""
    spec = SUPPORTED[name]
    seed = secrets.randbits(64)
    feeds, attrs, shared = _inputs(np.random.default_rng(seed), DTYPES[dtype], spec)
    plain_feeds = {n: a for n, a in feeds.items() if n != "head_sink"}
    plain_attrs = {k: v for k, v in attrs.items() if k != "smooth_softmax"}
    forms = {"both": (feeds, dict(plain_attrs, smooth_softmax=1)), "head_sink": (feeds, plain_attrs),
             "smooth_softmax": (plain_feeds, dict(plain_attrs, smooth_softmax=1)), "none": (plain_feeds, plain_attrs)}
    out = {what: run_gqa_cuda({n: a.copy() for n, a in f.items()}, shared, a, library)[0].astype(np.float64)
           for what, (f, a) in forms.items()}
    ctx = f"{name} {dtype} seed={seed}"
    np.testing.assert_array_equal(out["both"], out["head_sink"], err_msg=f"{ctx}: head_sink must win")
    for what in ("head_sink", "smooth_softmax"):
        f, a = forms[what]
        ref = _reference(gqa_reference, f, a, shared)[0]
        bound = error_bound(ref, _reference(gqa_lowp, f, a, shared), FLOORS[dtype][0])
        err = np.abs(out[what] - ref).max()
        assert err <= bound, f"{ctx} {what}: max |output - ref| = {err:.3g} > {bound:.3g}"
        assert np.abs(out["none"] - ref).max() > bound, f"{ctx} {what}: the sinks change nothing"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("name", sorted(WINDOWED))
def test_gqa_cuda_windowed_cache_matches_cpu_op(name, shared, dtype, library):
    """A windowed KV cache on CUDA (each row's resident rows and new tokens staged, the attention
    over the stage, the compaction into present; within the capacity, and for a decode step past it
    after the shift of each row's kept rows, over present; with ORT_FLASH_WINDOW_SHIFT=0 that step
    staged too): the chains of calls of test_gqa_op's windowed
    cases (prompts longer than the cache, compactions, chunked continuations, a batch of three),
    each op on its own buffers, the CUDA op against the CPU op (checked against ONNX Runtime's
    there): every output within twice the dtype's rounding of the CPU op's, the kept rows [0, L(T))
    of the cache within one rounding, a separate present's other rows zero."""
    b, cap, window, steps = WINDOWED[name]
    hq, hkv, d, half = 4, 2, 64, 32
    dt = DTYPES[dtype]
    seed = secrets.randbits(64)
    rng = np.random.default_rng(seed)
    angles = np.arange(128)[:, None] / 10000.0 ** (np.arange(half) / half)
    cos, sin = np.cos(angles).astype(dt), np.sin(angles).astype(dt)
    attrs = dict(num_heads=hq, kv_num_heads=hkv, do_rotary=1, local_window_size=window, sliding_window_cache=1)
    start = [rng.standard_normal((b, hkv, cap, d)).astype(dt) for _ in range(2)]
    caches = {"cuda": list(start), "cpu": list(start)}
    eps = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    total = 0
    for step, s in enumerate(steps):
        total += s
        feeds = dict(query=rng.standard_normal((b, s, (hq + 2 * hkv) * d)).astype(dt),
                     seqlens_k=np.full(b, total - 1, np.int32),
                     total_sequence_length=np.array(total, np.int32), cos_cache=cos, sin_cache=sin)
        results = {}
        for who in ("cuda", "cpu"):
            call = {**feeds, "past_key": caches[who][0].copy(), "past_value": caches[who][1].copy()}
            if who == "cuda":
                out, pk, pv = run_gqa_cuda(call, shared, attrs, library)
            else:
                out, pk, pv = run_gqa(call, shared=True, library=library, **attrs)
            caches[who] = [pk, pv]
            results[who] = out.astype(np.float64)
        kept = _kept(total, cap, window)
        ctx = f"{name} {dtype} shared={shared} step {step} (T={total}, kept {kept}) seed={seed}"
        assert not np.isnan(results["cuda"]).any(), ctx
        np.testing.assert_allclose(results["cuda"], results["cpu"], rtol=2 * eps, atol=2 * eps, err_msg=ctx)
        for i in range(2):
            got, want = (caches[w][i].astype(np.float64) for w in ("cuda", "cpu"))
            np.testing.assert_allclose(got[:, :, :kept], want[:, :, :kept], rtol=eps, atol=eps, err_msg=ctx)
            if not shared:
                assert (got[:, :, kept:] == 0).all(), f"{ctx}: a separate present's rows past L(T) must be zero"
            caches["cuda"][i] = caches["cuda"][i].copy()
            caches["cuda"][i][:, :, kept:] = caches["cpu"][i][:, :, kept:]  # the same past for the next call
