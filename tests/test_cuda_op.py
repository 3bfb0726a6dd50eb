"""The op contract on CUDAExecutionProvider: the shared case table (tests/cases.py) through ONNX
Runtime, and the bundled demo model in a CUDA session against the unfused original."""
from __future__ import annotations

import pytest

from cases import CASES, case_id, run_case

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_case_on_cuda(case):
    run_case(case, "CUDAExecutionProvider")


def test_demo_model_verifies_on_cuda():
    import onnx

    from ort_flash.demo import demo_model_path
    from ort_flash.rewriter import rewrite
    from ort_flash.verify import verify

    original = onnx.load(demo_model_path("cuda"))
    result = rewrite(original)
    assert result.report.total_fused == 2
    check = verify(original, result.model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
                   batch=2, seq_len=300)
    print(check.format_table())
    assert check.passed
    assert check.rewritten_providers[0] == "CUDAExecutionProvider"


def test_fused_op_runs_on_cuda_provider():
    """ONNX Runtime's profiler shows where each node ran: every FlashAttention on CUDA."""
    import onnx

    import ort_flash
    from ort_flash.demo import demo_model_path
    from ort_flash.rewriter import rewrite
    from ort_flash.timing import node_placements
    from ort_flash.verify import make_inputs

    original = onnx.load(demo_model_path("cuda"))
    model = rewrite(original).model.SerializeToString()
    placed = node_placements(model, make_inputs(original, batch=1, seq_len=77, seed=1),
                             ["CUDAExecutionProvider", "CPUExecutionProvider"], ort_flash.session_options())
    fa = {prov: n for (op, prov), n in placed.items() if op == "FlashAttention"}
    assert fa == {"CUDAExecutionProvider": 2}, placed


def _tf32_attention(q, k, v):
    """Attention (B, H, S, D) as TF32 dots compute it, in float64 otherwise: the dot operands
    (Q, K; the unnormalized probabilities and V) keep 10 mantissa bits, the low 13 bits dropped
    (the tensor cores read fp32 operands that way, truncating rather than rounding)."""
    import numpy as np

    def tf32(x):
        return (np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)

    s = tf32(q) @ tf32(k).swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return (tf32(p) @ tf32(v)) / p.sum(-1, keepdims=True)


@pytest.mark.parametrize("shape", [dict(sq=113, skv=203, d=64), dict(sq=1, skv=1500, d=128)],
                         ids=["prefill", "decode"])
def test_fp32_tf32_opt_in_on_cuda(shape):
    """fp32 stays IEEE-accurate by default; fp32_precision="tf32" (the rewriter's opt-in) runs the
    TF32 cubins: a different result, within the error of 10-bit-mantissa inputs: the larger of
    fp16's and that of truncated TF32 operands (_tf32_attention; fp16's alone was a bound the
    truncation exceeded once: seed 2311126310, 0.00254 against 0.00211)."""
    import secrets

    import numpy as np

    from _onnx_models import flash_attention_model, run_model
    from ort_flash.reference import attention_lowp, attention_reference, error_bound

    seed = secrets.randbits(32)
    rng = np.random.default_rng(seed)
    sq, skv, d = shape["sq"], shape["skv"], shape["d"]
    feeds = {n: rng.standard_normal(s, dtype=np.float32)
             for n, s in (("Q", (2, 4, sq, d)), ("K", (2, 4, skv, d)), ("V", (2, 4, skv, d)))}
    specs = {"Y": ((2, 4, sq, d), np.float32)}
    prov = ["CUDAExecutionProvider"]
    ieee = run_model(flash_attention_model(feeds, {"Y": np.float32}), feeds, specs, prov)["Y"]
    tf32 = run_model(flash_attention_model(feeds, {"Y": np.float32}, fp32_precision="tf32"),
                     feeds, specs, prov)["Y"]
    ref = attention_reference(feeds["Q"], feeds["K"], feeds["V"])[0]
    half = attention_lowp(*(feeds[n].astype(np.float16) for n in "QKV"))[0].astype(np.float64)
    err_ieee = float(np.abs(ieee - ref).max())
    err_tf32 = float(np.abs(tf32 - ref).max())
    ctx = f"seed={seed} {shape}"
    assert err_ieee <= 1e-5, f"{ctx}: IEEE fp32 error {err_ieee:.3g}"
    bound = max(error_bound(ref, half, 1e-3), error_bound(ref, _tf32_attention(*(feeds[n] for n in "QKV")), 1e-3))
    assert err_tf32 <= bound, f"{ctx}: TF32 error {err_tf32:.3g} > {bound:.3g}"
    if shape["sq"] > 16:  # the decode kernel uses IEEE dots for fp32 always (memory-bound anyway)
        assert not np.array_equal(ieee, tf32), f"{ctx}: the TF32 opt-in gave IEEE results"
    else:
        np.testing.assert_array_equal(ieee, tf32)


def _fp8_lse_error(q, k, v, causal):
    """The largest |lse error| over the rows of every (batch, head) of tests/test_fp8_kernel.py's
    float64 emulation of the FP8 kernels (e4m3 roundings only; the build's 128-row blocks)
    against exact scores."""
    import numpy as np

    import test_fp8_kernel as kernel_test
    from ort_flash.reference import attention_reference

    from aot import variants

    group = q.shape[1] // k.shape[1]
    bm, bn = variants.FP8_TILES[q.shape[-1]][:2]
    worst = 0.0
    for i in range(q.shape[0]):
        for h in range(q.shape[1]):
            qh, kh, vh = (x.astype(np.float64) for x in (q[i, h], k[i, h // group], v[i, h // group]))
            _, lse8 = kernel_test.emulate(qh, kh, vh, causal, bm, bn)
            exact = attention_reference(qh[None, None], kh[None, None], vh[None, None], is_causal=causal)[3]
            worst = max(worst, float(np.abs(lse8 - exact[0, 0]).max()))
    return worst


# (B, Hq, Hkv, N, D, causal) of the FP8 checks: odd lengths, GQA and MHA, both head sizes.
FP8_SHAPES = [(2, 8, 2, 1000, 128, True), (1, 4, 4, 777, 64, False), (3, 6, 1, 515, 128, False),
              (1, 8, 8, 2049, 64, True)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", FP8_SHAPES, ids=lambda s: "B{}-H{}x{}-N{}-d{}{}".format(*s[:5], "-causal" if s[5] else ""))
def test_fp8_prefill_on_cuda(shape, dtype):
    """attention_precision="fp8" on an sm_90 GPU: the FP8 path runs (its error against the float64
    reference is FP8's, several times the fp16/bf16 path's) and stays within the bound the
    interpreter check of the same kernels sets on FlashAttention-3's outlier inputs (N(0, 1),
    0.1 % N(0, 10)): RMSE 2.5e-2; every output written (NaN-poisoned first). Its log-sum-exp
    error is that of the scheme: within 1.1x (+ 0.02) the largest error of test_fp8_kernel.py's
    float64 emulation of the same kernels on the same inputs (_fp8_lse_error), which grows with
    the number of rows (one outlier product dominates a short causal row's scores). A decode call
    of the same node (a past) declines and equals the dtype path exactly."""
    import secrets

    import ml_dtypes
    import numpy as np
    import torch

    from _onnx_models import flash_attention_model, run_model
    from ort_flash.reference import attention_reference

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the FP8 path runs on sm_90 only")
    b, hq, hkv, n, d, causal = shape
    seed = secrets.randbits(32)
    rng = np.random.default_rng(seed)
    np_dtype = np.float16 if dtype == "float16" else ml_dtypes.bfloat16

    def outliers(s):
        x = rng.standard_normal(s)
        hit = rng.random(s) < 1e-3
        return np.where(hit, 10 * rng.standard_normal(s), x).astype(np_dtype)

    feeds = {"Q": outliers((b, hq, n, d)), "K": outliers((b, hkv, n, d)), "V": outliers((b, hkv, n, d))}
    specs = {"Y": ((b, hq, n, d), np_dtype), "softmax_lse": ((b, hq, n), np.float32)}
    outs = {"Y": np_dtype, "softmax_lse": np.float32}
    prov = ["CUDAExecutionProvider"]
    attrs = dict(is_causal=int(causal))
    base = run_model(flash_attention_model(feeds, outs, **attrs), feeds, specs, prov)
    fp8 = run_model(flash_attention_model(feeds, outs, attention_precision="fp8", **attrs), feeds, specs, prov)
    ref, _, _, ref_lse = attention_reference(*(feeds[k].astype(np.float64) for k in "QKV"), is_causal=causal)
    ctx = f"seed={seed} {shape} {dtype}"
    y8 = fp8["Y"].astype(np.float64)
    assert not np.isnan(y8).any() and not np.isnan(fp8["softmax_lse"]).any(), f"{ctx}: unwritten output"
    rmse8 = float(np.sqrt(np.mean((y8 - ref) ** 2)))
    rmse16 = float(np.sqrt(np.mean((base["Y"].astype(np.float64) - ref) ** 2)))
    lse_err = float(np.abs(fp8["softmax_lse"] - ref_lse).max())
    print(f"{ctx}: RMSE fp8 {rmse8:.3e}, {dtype} {rmse16:.3e}; lse error {lse_err:.3f}")
    assert rmse8 <= 2.5e-2, f"{ctx}: FP8 RMSE {rmse8:.3g}"
    assert rmse8 > 1.5 * rmse16, f"{ctx}: the FP8 path did not run (RMSE {rmse8:.3g} against {rmse16:.3g})"
    lse_emulated = _fp8_lse_error(feeds["Q"], feeds["K"], feeds["V"], causal)
    assert lse_err <= 1.1 * lse_emulated + 0.02, \
        f"{ctx}: FP8 log-sum-exp error {lse_err:.3g}, the scheme's emulated {lse_emulated:.3g}"

    # A past makes it a decode call: the FP8 path declines, the dtype path runs.
    past = {"past_key": outliers((b, hkv, 64, d)), "past_value": outliers((b, hkv, 64, d))}
    step = {"Q": feeds["Q"][:, :, :3], "K": feeds["K"][:, :, :3], "V": feeds["V"][:, :, :3], **past}
    sspec = {"Y": ((b, hq, 3, d), np_dtype)}
    plain = run_model(flash_attention_model(step, {"Y": np_dtype}, **attrs), step, sspec, prov)["Y"]
    asked = run_model(flash_attention_model(step, {"Y": np_dtype}, attention_precision="fp8", **attrs),
                      step, sspec, prov)["Y"]
    np.testing.assert_array_equal(asked.astype(np.float32), plain.astype(np.float32))
