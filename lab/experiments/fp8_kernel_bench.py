"""The FP8 (e4m3) attention path on an H100 (Triton JIT, torch tensors): speed beside cuDNN fp16, and
error on FlashAttention-3's outlier inputs.

Shapes as the op suite's: batch x seqlen = 16k tokens, hidden 2048 (heads = 2048 / D), D 64 and
128, seqlen 2k, 4k, 8k, 16k, causal and not. Timed with triton.testing.do_bench (median over its
repetitions after its warm-up; fresh random inputs per shape):

- fp8 prep+attn: aot/fp8_prepare.py's two kernels (statistics, quantization) and
  aot/flash_fwd_fp8.py, the whole FP8 path from fp16 Q, K, V to the fp16 output;
- fp8 attn: the attention kernel alone, over buffers prepared once;
- sdpa fp16: torch's scaled_dot_product_attention on the cuDNN backend, fp16.

TFLOP/s count 4 B H N^2 D flops, half of them under causal; the ratios are over cuDNN's figure.

Error (`--rmse-heads` heads of batch 0 per shape, inputs N(0, 1) with 0.1 % N(0, 10)): the RMSE
against a float64 reference computed on the GPU, for fp16 SDPA, for plain FP8 emulated in torch
(one scale per tensor, max |x| / 448, for Q, K and V; P = exp(s - rowmax) as e4m3(P * 448) / 448;
fp32 products and sums), and for this kernel path.

    python lab/experiments/fp8_kernel_bench.py [--head-dims 64 128] [--seqlens 2048 4096 8192 16384]
        [--tile 128:128,128,8,3] [--rmse-heads 2] [--json fp8-bench.json]

Needs CUDA and an sm_90 GPU (FP8 wgmma); without them it says so in one line and exits 1.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1])]

TOKENS, HIDDEN = 16384, 2048
E4M3_MAX = 448.0


def need_cuda() -> str | None:
    """Why this machine cannot run the benchmark, or None."""
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as e:
        return f"needs torch and triton installed ({e})"
    if not torch.cuda.is_available():
        return "needs an NVIDIA GPU with CUDA (torch.cuda.is_available() is False)"
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        return f"needs an sm_90 GPU (H100 / H200) for FP8 wgmma; this one is sm_{cap[0]}{cap[1]}"
    return None


def outlier_inputs(shape, device, gen):
    import torch

    x = torch.randn(shape, device=device, generator=gen)
    hit = torch.rand(shape, device=device, generator=gen) < 1e-3
    return torch.where(hit, 10.0 * torch.randn(shape, device=device, generator=gen), x)


class Fp8Path:
    """The FP8 path's buffers for one shape and its three launches (Triton JIT)."""

    def __init__(self, b, h, n, d, causal, tile, device="cuda"):
        import torch

        from aot.fp8_prepare import buffer_specs, padded_len, stats_splits

        self.b, self.h, self.n, self.d, self.causal = b, h, n, d, causal
        self.bm, self.bn, self.warps, self.stages = tile
        sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 2
        self.splits = stats_splits(b, h, n, self.bn, sms)  # multi-head: Hkv = Hq = h
        self.grid_q = padded_len(n, self.bm, self.bn) // min(self.bm, self.bn)
        dtypes = {"fp32": torch.float32, "fp8e4nv": torch.float8_e4m3fn}
        self.bufs = {name: torch.empty(shape, dtype=dtypes[dt], device=device)
                     for name, (shape, dt) in buffer_specs(b, h, h, n, d, self.bm, self.bn, self.splits).items()}
        self.lse = torch.empty((b, h, n), device=device)

    def prepare(self, q, k, v):
        from aot.fp8_prepare import fp8_quantize, fp8_stats

        f = self.bufs
        fp8_stats[(self.splits, self.b * self.h)](
            k, v, f["Part"], self.h, self.n, self.splits, *k.stride()[:3], *v.stride()[:3],
            BLOCK_N=self.bn, HEAD_DIM=self.d, num_warps=4)
        fp8_quantize[(self.grid_q, self.b * self.h, 2)](
            q, k, v, f["Part"], f["Q8"], f["K8"], f["V8t"], f["ScaleQ"], f["ScaleK"], f["ScaleV"], f["QBias"],
            self.h, 1, self.n, self.splits, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            BLOCK_M=self.bm, BLOCK_N=self.bn, HEAD_DIM=self.d, num_warps=8)

    def attend(self, y, store_lse=False):
        from aot.flash_fwd_fp8 import flash_fwd_fp8

        f = self.bufs
        flash_fwd_fp8[(triton_cdiv(self.n, self.bm), self.b * self.h)](
            f["Q8"], f["K8"], f["V8t"], f["ScaleQ"], f["ScaleK"], f["ScaleV"], f["QBias"], y, self.lse,
            1 / math.sqrt(self.d), self.h, 1, self.n, int(store_lse), *y.stride()[:3],
            BLOCK_M=self.bm, BLOCK_N=self.bn, HEAD_DIM=self.d, CAUSAL=self.causal,
            num_warps=self.warps, num_stages=self.stages)

    def __call__(self, q, k, v, y):
        self.prepare(q, k, v)
        self.attend(y)


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def sdpa(q, k, v, causal):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def attention_rows(q, k, v, causal, rows=2048, quant_p=None):
    """softmax(q kᵀ / sqrt(d)) v for one head (n, d), in q's dtype, query rows a chunk at a time
    (an n x n score matrix at 16k would not fit in float64). quant_p: P = exp(s - rowmax) passed
    through it before P·V (the sum that normalizes stays unquantized)."""
    import torch

    n, d = q.shape
    out = torch.empty_like(q)
    for r0 in range(0, n, rows):
        s = q[r0:r0 + rows] @ k.T / math.sqrt(d)
        if causal:
            i = torch.arange(r0, min(r0 + rows, n), device=q.device)[:, None]
            s = s.masked_fill(torch.arange(n, device=q.device)[None, :] > i, float("-inf"))
        p = torch.exp(s - s.amax(1, keepdim=True))
        pq = quant_p(p) if quant_p else p
        out[r0:r0 + rows] = (pq @ v) / p.sum(1, keepdim=True)
    return out


def per_tensor_fp8(x, amax):
    """x through e4m3 with one scale (amax / 448, amax the whole tensor's max |x|), dequantized (fp32)."""
    import torch

    scale = max(float(amax), 1e-30) / E4M3_MAX
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale


def rmse_figures(b, h, n, d, causal, tile, heads, gen, device="cuda", reference_sdpa=None) -> dict:
    """RMSE of each path against float64 on the outlier inputs, over `heads` heads of batch 0."""
    import torch

    q, k, v = (outlier_inputs((b, h, n, d), device, gen).half() for _ in range(3))
    y = torch.empty_like(q)
    path = Fp8Path(b, h, n, d, causal, tile, device)
    path(q, k, v, y)
    ys = (reference_sdpa or sdpa)(q, k, v, causal)
    amax = [x.abs().amax() for x in (q, k, v)]
    err = {"sdpa_fp16": 0.0, "fp8_per_tensor_emulated": 0.0, "fp8_kernel": 0.0}
    for j in range(heads):
        q64, k64, v64 = (x[0, j].double() for x in (q, k, v))
        ref = attention_rows(q64, k64, v64, causal)
        plain = attention_rows(*(per_tensor_fp8(x[0, j], a) for x, a in zip((q, k, v), amax)), causal,
                               quant_p=lambda p: (p * E4M3_MAX).to(torch.float8_e4m3fn).float() / E4M3_MAX)
        for key, out in (("sdpa_fp16", ys[0, j]), ("fp8_per_tensor_emulated", plain), ("fp8_kernel", y[0, j])):
            err[key] += float(((out.double() - ref) ** 2).mean()) / heads
    if not torch.isfinite(y).all():
        raise RuntimeError(f"FP8 kernel output not finite at B{b} H{h} N{n} D{d} causal={causal}")
    return {key: math.sqrt(e) for key, e in err.items()}


def bench_shape(d, n, causal, tile, rmse_heads, gen) -> dict:
    import torch
    from triton.testing import do_bench

    b, h = max(1, TOKENS // n), HIDDEN // d
    q, k, v = (torch.randn((b, h, n, d), device="cuda", generator=gen, dtype=torch.float16) for _ in range(3))
    y = torch.empty_like(q)
    path = Fp8Path(b, h, n, d, causal, tile)
    flops = 4 * b * h * n * n * d / (2 if causal else 1)
    ms = {"fp8_prep_attn": do_bench(lambda: path(q, k, v, y), return_mode="median")}
    path.prepare(q, k, v)
    ms["fp8_attn"] = do_bench(lambda: path.attend(y), return_mode="median")
    ms["fp8_prep"] = do_bench(lambda: path.prepare(q, k, v), return_mode="median")
    ms["sdpa_fp16"] = do_bench(lambda: sdpa(q, k, v, causal), return_mode="median")
    tflops = {key: flops / (t * 1e-3) / 1e12 for key, t in ms.items() if key != "fp8_prep"}
    row = dict(d=d, seqlen=n, batch=b, heads=h, causal=causal, tile=list(tile), ms=ms, tflops=tflops,
               ratio_vs_sdpa={key: tflops[key] / tflops["sdpa_fp16"] for key in ("fp8_prep_attn", "fp8_attn")})
    if rmse_heads:
        row["rmse"] = rmse_figures(b, h, n, d, causal, tile, rmse_heads, gen)
    return row


def parse_tiles(specs) -> dict:
    from aot.variants import FP8_TILES

    tiles = dict(FP8_TILES)
    for spec in specs or []:
        d, rest = spec.split(":")
        tiles[int(d)] = tuple(int(x) for x in rest.split(","))
    return tiles


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--tile", action="append", metavar="D:BM,BN,WARPS,STAGES",
                    help="the attention's tile for a head dim (default aot/variants.FP8_TILES)")
    ap.add_argument("--rmse-heads", type=int, default=2, help="heads per shape for the RMSE (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, metavar="PATH")
    args = ap.parse_args(argv)
    why = need_cuda()
    if why:
        print(f"fp8_kernel_bench.py: {why}", file=sys.stderr)
        return 1
    import torch
    import triton

    tiles = parse_tiles(args.tile)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    rows = []
    head = (f"{'D':>4} {'N':>6} {'BxH':>6} {'causal':>6} | {'fp8 prep+attn':>13} {'fp8 attn':>9} {'sdpa fp16':>9}"
            f" | {'x sdpa':>6} {'x (attn)':>8} | {'rmse sdpa':>9} {'fp8 tensor':>10} {'fp8 kernel':>10}")
    print(f"{torch.cuda.get_device_name()}, Triton {triton.__version__}, torch {torch.__version__}; TFLOP/s")
    print(head)
    for d in args.head_dims:
        for n in args.seqlens:
            for causal in causals:
                r = bench_shape(d, n, causal, tiles[d], args.rmse_heads, gen)
                rows.append(r)
                t, e = r["tflops"], r.get("rmse", {})
                print(f"{d:>4} {n:>6} {r['batch']}x{r['heads']:<3} {str(causal):>6} | {t['fp8_prep_attn']:>13.0f} "
                      f"{t['fp8_attn']:>9.0f} {t['sdpa_fp16']:>9.0f} | {r['ratio_vs_sdpa']['fp8_prep_attn']:>6.2f} "
                      f"{r['ratio_vs_sdpa']['fp8_attn']:>8.2f} | {e.get('sdpa_fp16', float('nan')):>9.2e} "
                      f"{e.get('fp8_per_tensor_emulated', float('nan')):>10.2e} {e.get('fp8_kernel', float('nan')):>10.2e}",
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps(dict(
            gpu=torch.cuda.get_device_name(), triton=triton.__version__, torch=torch.__version__,
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            tokens=TOKENS, hidden=HIDDEN, rows=rows), indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
