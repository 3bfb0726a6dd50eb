"""Where a GroupQueryAttention first prompt spends its time on CUDA: ort_flash's op and ONNX
Runtime's on the gqa suite's inputs (packed QKV, rotary, one max-length cache bound as past and
present), each session run `--runs` times under torch's profiler (CUPTI sees every kernel of the
process, ONNX Runtime's and the driver-launched cubins alike); prints each kernel's mean device
time per call and each op's total per call. GPU machine only (onnxruntime-gpu, torch).

    python3 lab/experiments/gqa_profile.py --d 64 --seqlens 128 2048 16384 [--out prof.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ort_flash  # noqa: E402
from ort_flash.bench.gqa_graphs import gqa_model  # noqa: E402
from ort_flash.bench.gqa_peers import attrs, rotary_tables  # noqa: E402

TOKENS, HQ, HKV, HEADROOM = 16384, 32, 8, 256


def inputs(b: int, n: int, d: int) -> dict:
    """Device tensors for a first prompt of n tokens at batch b (the gqa suite's shapes, its rotary
    tables and node attributes: ort_flash/bench/gqa_peers.py)."""
    dev, f16 = "cuda", torch.float16
    m = n + HEADROOM
    cos, sin = (torch.from_numpy(t).to(dev, f16) for t in rotary_tables(m, d))
    return {"query": torch.randn(b, n, (HQ + 2 * HKV) * d, device=dev, dtype=f16),
            "past_key": torch.zeros(b, HKV, m, d, device=dev, dtype=f16),
            "past_value": torch.zeros(b, HKV, m, d, device=dev, dtype=f16),
            "seqlens_k": torch.full((b,), n - 1, device=dev, dtype=torch.int32),
            "total_sequence_length": torch.tensor(n, dtype=torch.int32),
            "cos_cache": cos, "sin_cache": sin}


def bound(domain: str, feeds: dict, d: int, out: torch.Tensor):
    import onnxruntime as ort

    shapes = {k: np.empty(tuple(v.shape), dtype=np.float16 if v.dtype == torch.float16 else np.int32)
              for k, v in feeds.items()}
    model = gqa_model(shapes, domain, **attrs(dict(hq=HQ, hkv=HKV, d=d)))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if domain == "ort_flash":
        ort_flash.session_options(so)
    sess = ort.InferenceSession(model, so, providers=[("CUDAExecutionProvider",
                                                       {"user_compute_stream": str(torch.cuda.current_stream().cuda_stream)})])
    io = sess.io_binding()
    for k, v in feeds.items():
        where = "cpu" if k == "total_sequence_length" else "cuda"
        io.bind_input(k, where, 0, np.float16 if v.dtype == torch.float16 else np.int32, list(v.shape), v.data_ptr())
    io.bind_output("output", "cuda", 0, np.float16, list(out.shape), out.data_ptr())
    for name, k in (("present_key", "past_key"), ("present_value", "past_value")):
        io.bind_output(name, "cuda", 0, np.float16, list(feeds[k].shape), feeds[k].data_ptr())
    return lambda: sess.run_with_iobinding(io)


def profile(run, runs: int) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    for _ in range(5):
        run()
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(runs):
            run()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name[:90]] += e.device_time / runs  # us per call
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[128, 2048, 16384])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for d in args.d:
        for n in args.seqlens:
            b = max(1, TOKENS // n)
            feeds = inputs(b, n, d)
            out = torch.empty(b, n, HQ * d, device="cuda", dtype=torch.float16)
            for domain in ("ort_flash", "com.microsoft"):
                kernels = profile(bound(domain, feeds, d, out), args.runs)
                total = sum(kernels.values())
                print(f"d{d} {b}x{n} {domain}: {total:.1f} us per call")
                for name, us in kernels.items():
                    print(f"    {us:9.1f} us  {name}")
                rows.append(dict(d=d, batch=b, seqlen=n, domain=domain, total_us=total, kernels=kernels))
    if args.out:
        Path(args.out).write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
