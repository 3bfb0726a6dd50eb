"""Per-op-type GPU kernel time of a model in ONNX Runtime (from its profiler), and the fused
op's kernel alone against torch SDPA, to see where time goes.

    python lab/experiments/profile_model.py [--batch 8] [--seq 2048]
"""
from __future__ import annotations

import argparse
import collections
import json
import os

import numpy as np


def profile(model_bytes, feeds, so, providers, runs=20):
    import onnxruntime as ort

    from ort_flash.timing import SessionTimer
    so.enable_profiling = True
    sess = ort.InferenceSession(model_bytes, so, providers=providers)
    timer = SessionTimer(sess, [feeds], "cuda")
    for i in range(runs):
        timer.run_once(i)
    path = sess.end_profiling()
    events = json.load(open(path))
    os.unlink(path)
    per_op = collections.Counter()
    for e in events:
        a = e.get("args", {})
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            per_op[(a.get("op_name"), a.get("provider"))] += e["dur"] / runs
    return per_op


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    args = ap.parse_args()
    import onnx
    import onnxruntime as ort

    import ort_flash
    from ort_flash.demo import demo_model_path
    from ort_flash.verify import make_inputs

    ort.preload_dlls()
    original = onnx.load(demo_model_path("cuda"))
    rewritten = ort_flash.rewrite(original).model
    feeds = make_inputs(original, batch=args.batch, seq_len=args.seq, seed=0)
    prov = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    for name, model, so in (("original", original, ort.SessionOptions()),
                            ("rewritten", rewritten, ort_flash.session_options())):
        per_op = profile(model.SerializeToString(), feeds, so, prov)
        total = sum(per_op.values())
        print(f"{name}: {total:.1f} us of node time per run")
        for (op, p), us in per_op.most_common(12):
            print(f"   {op:24s} {p:24s} {us:9.1f} us")

    import torch
    import triton.testing

    from ort_flash import _C
    b, h, s, d = args.batch, 2, args.seq, 64
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
    mask = torch.randn(b, 1, s, s, device="cuda", dtype=torch.float16)
    y = torch.empty_like(q)
    for with_mask in (False, True):
        p = _C.FlashParams()
        p.dtype = _C.DType.float16
        p.q, p.k, p.v, p.y = q.data_ptr(), k.data_ptr(), v.data_ptr(), y.data_ptr()
        p.batch, p.hq, p.hkv, p.sq, p.skv, p.d, p.dv = b, h, h, s, s, d, d
        p.q_stride = p.k_stride = p.v_stride = p.y_stride = list(q.stride()[:3])
        p.scale = 0.125
        if with_mask:
            p.mask, p.mask_kind, p.mask_len = mask.data_ptr(), _C.MaskKind.add, s
            p.mask_stride = [mask.stride(0), 0, mask.stride(2), 1]
        stream = torch.cuda.current_stream().cuda_stream
        ms = triton.testing.do_bench(lambda: _C.run_cuda(p, stream), warmup=50, rep=200, return_mode="median")
        flops = 4 * b * h * s * s * d
        print(f"ort_flash kernel B{b} H{h} S{s} d{d} mask={with_mask}: {ms*1e3:.1f} us, {flops/ms/1e9:.0f} TFLOP/s, variant {_C.variant_for(p)}")
        am = mask if with_mask else None
        ms2 = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=am), warmup=50, rep=200, return_mode="median")
        print(f"torch SDPA same shape mask={with_mask}: {ms2*1e3:.1f} us, {flops/ms2/1e9:.0f} TFLOP/s")
    b, h, s, d = 4, 16, 4096, 128
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
    y = torch.empty_like(q)
    p = _C.FlashParams()
    p.dtype = _C.DType.float16
    p.q, p.k, p.v, p.y = q.data_ptr(), k.data_ptr(), v.data_ptr(), y.data_ptr()
    p.batch, p.hq, p.hkv, p.sq, p.skv, p.d, p.dv = b, h, h, s, s, d, d
    p.q_stride = p.k_stride = p.v_stride = p.y_stride = list(q.stride()[:3])
    p.scale = d ** -0.5
    stream = torch.cuda.current_stream().cuda_stream
    flops = 4 * b * h * s * s * d
    for causal in (False, True):
        p.causal = causal
        ms = triton.testing.do_bench(lambda: _C.run_cuda(p, stream), warmup=50, rep=200, return_mode="median")
        ms2 = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal), warmup=50, rep=200, return_mode="median")
        f = flops / (2 if causal else 1)
        print(f"B{b} H{h} S{s} d{d} causal={causal}: ort_flash {f/ms/1e9:.0f} TFLOP/s, torch SDPA {f/ms2/1e9:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
