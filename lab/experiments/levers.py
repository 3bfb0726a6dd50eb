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
- causal: diagonal block last, keys past the diagonal skipped;
- `--persistent`: the same kernel on a persistent grid (a few CTAs per SM, each looping over
  query blocks) against the one-CTA-per-block grid at the same tiles.

    python lab/experiments/levers.py [--seqs 8192] [--head-dims 64,128] [--out levers.json] [--persistent]

Prints TFLOP/s per candidate and writes JSON (GPU, Triton version, date) for docs/perf-notes.md.
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

# The sibling scripts and the shipped kernels (aot/) they time.
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.testing  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from tune import bench, save, tile_dict  # noqa: E402
from tune import launch as launch_shipped  # noqa: E402
from aot.variants import Variant, get_fwd_config, tma_tile  # noqa: E402


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
def _desc_tile(desc_q, desc_k, desc_v, desc_y, pid_m, row0, S, sm_scale,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
               CAUSAL: tl.constexpr, WS: tl.constexpr):
    # One query block: rows [pid_m * BLOCK_M, +BLOCK_M) of the (b, h) whose rows start at row0.
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


@triton.jit
def flash_fwd_desc(desc_q, desc_k, desc_v, desc_y, S, sm_scale,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                   CAUSAL: tl.constexpr, WS: tl.constexpr):
    # (b, h) flattened: rows of the (B*H*S, D) views. Grid (S / BLOCK_M, B * H).
    _desc_tile(desc_q, desc_k, desc_v, desc_y, tl.program_id(0), tl.program_id(1) * S, S, sm_scale,
               BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, WS)


@triton.jit
def flash_fwd_desc_persistent(desc_q, desc_k, desc_v, desc_y, S, BH, n_prog, sm_scale,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                              CAUSAL: tl.constexpr, HEAD_MAJOR: tl.constexpr):
    # A grid of a few CTAs per SM, each walking query blocks t = pid, pid + grid, ... in one of two
    # orders: HEAD_MAJOR, every head's last block first, then the next-to-last ... (longest first
    # under causal: a greedy longest-processing-time schedule); else the blocks of one head
    # together, last first (its K/V stay in L2 while the CTAs on it share them).
    n_m = S // BLOCK_M
    for t in range(tl.program_id(0), n_m * BH, n_prog):  # n_prog: the grid size
        if HEAD_MAJOR:
            pid_m = n_m - 1 - t // BH
            bh = t % BH
        else:
            pid_m = n_m - 1 - t % n_m
            bh = t // n_m
        _desc_tile(desc_q, desc_k, desc_v, desc_y, pid_m, bh * S, S, sm_scale,
                   BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, False)


def _descs(q, k, v, y, cfg):
    b, h, s, d = q.shape
    flat = [t.view(b * h * s, d) for t in (q, k, v, y)]
    rows = (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_N"], cfg["BLOCK_M"])
    return [TensorDescriptor(t, [b * h * s, d], [d, 1], [r, d]) for t, r in zip(flat, rows)]


def run_desc(q, k, v, y, causal, cfg):
    b, h, s, d = q.shape
    flash_fwd_desc[(s // cfg["BLOCK_M"], b * h)](
        *_descs(q, k, v, y, cfg), s, 1.0 / math.sqrt(d), BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
        HEAD_DIM=d, CAUSAL=causal, WS=cfg["WS"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def run_persistent(q, k, v, y, causal, cfg, ctas_per_sm, head_major):
    b, h, s, d = q.shape
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    grid = min(sms * ctas_per_sm, (s // cfg["BLOCK_M"]) * b * h)
    flash_fwd_desc_persistent[(grid,)](
        *_descs(q, k, v, y, cfg), s, b * h, grid, 1.0 / math.sqrt(d), BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"], HEAD_DIM=d, CAUSAL=causal, HEAD_MAJOR=head_major,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


CANDIDATES = [dict(BLOCK_M=128, BLOCK_N=n, num_warps=w, num_stages=st, WS=ws)
              for n, w, st, ws in itertools.product((64, 128), (4, 8), (2, 3), (False, True))]


PERSISTENT_TILES = [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=st, WS=False)
                    for m, n, w, st in ((128, 64, 8, 3), (64, 64, 4, 3), (64, 64, 4, 2))]


def _cases(args):
    """The shapes of a run (B·N = 16k tokens, hidden 2048, fp16), causal and not, with fresh
    inputs, an output buffer, the LSE buffer and torch SDPA's answer."""
    for d, s in itertools.product(map(int, args.head_dims.split(",")), map(int, args.seqs.split(","))):
        h, b = 2048 // d, max(1, 16384 // s)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
        y = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        for causal in (False, True):
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            yield d, s, b, h, causal, flops, q, k, v, y, lse, ref


def persistent(args) -> int:
    """The persistent grid against the one-CTA-per-block grid, both on the minimal descriptor
    kernel at the same tiles (so only the schedule differs), beside the shipped TMA kernel at its
    tile: 1 or 2 CTAs per SM, head-major (longest first) or head-by-head order."""
    results = []
    for d, s, b, h, causal, flops, q, k, v, y, lse, ref in _cases(args):
        shipped = tile_dict(tma_tile(d, causal, s))
        ms = bench(lambda: launch_shipped(q, k, v, y, lse, causal, shipped, tma=True))
        rows = [dict(kernel="flash_fwd TMA (shipped)", tile=str(shipped), tflops=flops / ms / 1e9)]
        runs = [("grid", cfg, None, None) for cfg in PERSISTENT_TILES]
        runs += [("persistent", cfg, n, hm) for cfg in PERSISTENT_TILES for n in (1, 2) for hm in (True, False)]
        for kind, cfg, n, hm in runs:
            fn = ((lambda: run_desc(q, k, v, y, causal, cfg)) if kind == "grid" else
                  (lambda: run_persistent(q, k, v, y, causal, cfg, n, hm)))
            try:
                y.fill_(float("nan"))
                fn()
                err = float((y - ref).abs().max())
                if not err < 2e-2:
                    print(f"  WRONG {kind} {cfg} {n} {hm}: max error {err}", file=sys.stderr)
                    continue
                ms = bench(fn)
            except Exception as e:  # noqa: BLE001 - unsupported config / out of resources
                print(f"  skip {kind} {cfg}: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
                continue
            label = kind if kind == "grid" else f"persistent x{n} {'head-major' if hm else 'by head'}"
            rows.append(dict(kernel=label, tile=str(cfg), tflops=flops / ms / 1e9, max_err=err))
        print(f"d{d} S{s} B{b} H{h} causal={int(causal)}:", flush=True)
        for r in rows:
            print(f"   {r['kernel']:<28} {r['tile']:<70} {r['tflops']:4.0f}", flush=True)
        results.append(dict(head_dim=d, seq=s, batch=b, heads=h, causal=causal, rows=rows))
        save(args.out, results)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="8192")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--out", default="levers.json")
    ap.add_argument("--persistent", action="store_true",
                    help="the persistent grid against the plain grid on the minimal kernel")
    args = ap.parse_args(argv)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    if args.persistent:
        return persistent(args)
    results = []
    for d, s, b, h, causal, flops, q, k, v, y, lse, ref in _cases(args):
        tile = get_fwd_config(90, Variant("fp16", d, True, "none", False, "tf32"))
        shipped = tile_dict(tile)
        ms = bench(lambda: launch_shipped(q, k, v, y, lse, causal, shipped))
        rows = [dict(kernel="flash_fwd (shipped)", tile=str(tile), tflops=flops / ms / 1e9,
                     max_err=float((y - ref).abs().max()))]
        for cfg in CANDIDATES:
            try:
                y.fill_(float("nan"))
                run_desc(q, k, v, y, causal, cfg)
                err = float((y - ref).abs().max())
                ms = bench(lambda: run_desc(q, k, v, y, causal, cfg))
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
