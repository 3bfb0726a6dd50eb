"""Measures Hopper levers the shipped kernel does not use yet, on a GPU machine (Triton JIT).

The Hopper performance issue names levers beyond tiles: TMA tensor descriptors (K/V tiles by
the bulk-copy engine instead of per-thread loads), warp specialization (producer/consumer warps
via `tl.range(..., warp_specialize=True)`) and causal scheduling. Wiring each into the AOT
launcher is real work (host descriptors mean `cuTensorMapEncodeTiled` in cpp/cuda_launch.cc),
so this script first measures what they would buy, with a minimal kernel that has only the
fast path (no mask, exact head dim, sequence a multiple of the tiles) beside the shipped
`flash_fwd` at its tuned tile, in the same process on the same inputs:

- `desc`: host-side TensorDescriptor loads of Q/K/V and store of Y, exp2 with the scale folded;
- `desc+ws`: the same key loop with warp_specialize=True;
- causal: diagonal block last, keys past the diagonal skipped.

    python aot/levers.py [--seqs 8192] [--head-dims 64,128] [--out levers.json]

Prints TFLOP/s per candidate and writes JSON (GPU, Triton version, date) for docs/perf-notes.md.
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.testing  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from tune import launch as launch_shipped  # noqa: E402
from tune import save  # noqa: E402
from variants import Variant, get_fwd_config  # noqa: E402


@triton.jit
def _desc_inner(acc, l_i, m_i, q, desc_k, desc_v, row0, lo, hi, offs_m, offs_n, qk_scale,
                BLOCK_N: tl.constexpr, DIAG: tl.constexpr, WS: tl.constexpr):
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        k = desc_k.load([row0 + start_n, 0])
        s = tl.dot(q, k.T)
        if DIAG:
            s = s * qk_scale + tl.where(offs_m[:, None] >= start_n + offs_n[None, :], 0.0, -1.0e6)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            s = s - m_new[:, None]
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            s = s * qk_scale - m_new[:, None]
        p = tl.math.exp2(s)
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = desc_v.load([row0 + start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def flash_fwd_desc(desc_q, desc_k, desc_v, desc_y, S, sm_scale,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                   CAUSAL: tl.constexpr, WS: tl.constexpr):
    pid_m = tl.program_id(0)
    row0 = tl.program_id(1) * S          # (b, h) flattened: rows of the (B*H*S, D) views
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q = desc_q.load([row0 + pid_m * BLOCK_M, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0e-30
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    if CAUSAL:
        hi_full = pid_m * BLOCK_M
        acc, l_i, m_i = _desc_inner(acc, l_i, m_i, q, desc_k, desc_v, row0, 0, hi_full, offs_m, offs_n,
                                    qk_scale, BLOCK_N, False, WS)
        acc, l_i, m_i = _desc_inner(acc, l_i, m_i, q, desc_k, desc_v, row0, hi_full, hi_full + BLOCK_M,
                                    offs_m, offs_n, qk_scale, BLOCK_N, True, WS)
    else:
        acc, l_i, m_i = _desc_inner(acc, l_i, m_i, q, desc_k, desc_v, row0, 0, S, offs_m, offs_n,
                                    qk_scale, BLOCK_N, False, WS)
    desc_y.store([row0 + pid_m * BLOCK_M, 0], (acc / l_i[:, None]).to(desc_y.dtype))


def run_desc(q, k, v, y, causal, cfg):
    b, h, s, d = q.shape
    flat = [t.view(b * h * s, d) for t in (q, k, v, y)]
    dq = TensorDescriptor(flat[0], [b * h * s, d], [d, 1], [cfg["BLOCK_M"], d])
    dk = TensorDescriptor(flat[1], [b * h * s, d], [d, 1], [cfg["BLOCK_N"], d])
    dv = TensorDescriptor(flat[2], [b * h * s, d], [d, 1], [cfg["BLOCK_N"], d])
    dy = TensorDescriptor(flat[3], [b * h * s, d], [d, 1], [cfg["BLOCK_M"], d])
    flash_fwd_desc[(s // cfg["BLOCK_M"], b * h)](
        dq, dk, dv, dy, s, 1.0 / math.sqrt(d), BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
        HEAD_DIM=d, CAUSAL=causal, WS=cfg["WS"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


CANDIDATES = [dict(BLOCK_M=128, BLOCK_N=n, num_warps=w, num_stages=st, WS=ws)
              for n, w, st, ws in itertools.product((64, 128), (4, 8), (2, 3), (False, True))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="8192")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--out", default="levers.json")
    args = ap.parse_args(argv)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    results = []
    for d, s in itertools.product(map(int, args.head_dims.split(",")), map(int, args.seqs.split(","))):
        h, b = 2048 // d, max(1, 16384 // s)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
        y = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        for causal in (False, True):
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            tile = get_fwd_config(90, Variant("fp16", d, True, "none", False, "tf32"))
            shipped = dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, num_warps=tile.num_warps,
                           num_stages=tile.num_stages)
            ms = triton.testing.do_bench(lambda: launch_shipped(q, k, v, y, lse, causal, shipped),
                                         warmup=25, rep=100, return_mode="median")
            rows = [dict(kernel="flash_fwd (shipped)", tile=str(tile), tflops=flops / ms / 1e9,
                         max_err=float((y - ref).abs().max()))]
            for cfg in CANDIDATES:
                try:
                    y.fill_(float("nan"))
                    run_desc(q, k, v, y, causal, cfg)
                    err = float((y - ref).abs().max())
                    ms = triton.testing.do_bench(lambda: run_desc(q, k, v, y, causal, cfg),
                                                 warmup=25, rep=100, return_mode="median")
                except Exception as e:  # noqa: BLE001 - unsupported config / out of resources
                    print(f"  skip {cfg}: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
                    continue
                rows.append(dict(kernel="desc+ws" if cfg["WS"] else "desc", tile=str(cfg),
                                 tflops=flops / ms / 1e9, max_err=err))
            rows.sort(key=lambda r: -r["tflops"])
            ship = next(r for r in rows if r["kernel"].startswith("flash_fwd"))
            print(f"d{d} S{s} B{b} H{h} causal={int(causal)}: shipped {ship['tflops']:.0f} TFLOP/s; "
                  + "; ".join(f"{r['kernel']} {r['tflops']:.0f} (err {r['max_err']:.1e}) {r['tile']}"
                              for r in rows[:3]), flush=True)
            results.append(dict(head_dim=d, seq=s, batch=b, heads=h, causal=causal, rows=rows))
            save(args.out, results)  # after each shape: a timeout keeps what was measured
    return 0


if __name__ == "__main__":
    sys.exit(main())
