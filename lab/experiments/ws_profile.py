"""One shape through the warp-specialized Gluon kernel (aot/flash_fwd_gluon_ws.py) at its shipped
tile, launched a few times, for Nsight Compute to profile one launch on the GPU machine:

    ncu --clock-control none --kernel-name regex:flash_fwd_gluon_ws --launch-skip 3 --launch-count 1 \
        --section WarpStateStats --section SourceCounters ... \
        python3 lab/experiments/ws_profile.py --head-dim 128 --seq 8192 [--causal] [--dtype fp16]

Batch x sequence = 16k tokens and hidden 2048, as the op grid. With --time it also prints the
kernel's TFLOP/s (do_bench median) beside cuDNN's, without a profiler attached.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

import torch  # noqa: E402

import gluon_attn  # noqa: E402
from aot import variants  # noqa: E402
from aot.tiles import ws_config  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402


@gluon.jit
def _softmax_pairs(s, m_i, l_i, start_n, mask_from, limit, pos, qk_scale,
                   s_layout: gl.constexpr, BLOCK_N: gl.constexpr):
    """flash_fwd_gluon._softmax with the row max and sum taken over S's register pairs first
    (columns 2c and 2c + 1 of a thread, elementwise), so that each thread's serial FMNMX and FADD
    chains are half as long (perf-notes prefill v13): an experiment, --pairs."""
    if start_n + BLOCK_N > mask_from:
        cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        keep = (cols[None, :] <= pos[:, None]) & (cols[None, :] < limit)
        s = gl.where(keep, s, float("-inf"))
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    a, b = gl.split(gl.reshape(s, [s.shape[0], BLOCK_N // 2, 2]))
    mx = gl.convert_layout(gl.max(gl.maximum(a, b), axis=1), row_layout)
    m_new = gl.maximum(m_i, mx * qk_scale)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * qk_scale - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    pa, pb = gl.split(gl.reshape(p, [s.shape[0], BLOCK_N // 2, 2]))
    l_i = l_i * alpha + gl.convert_layout(gl.sum(pa + pb, axis=1), row_layout)
    return p, alpha, m_new, l_i


def use_pair_softmax():
    """The warp-specialized kernel's unmasked softmax through _softmax_pairs (before the first
    launch): the name its main loop (aot/gluon_ws/mainloop.py) calls."""
    from aot.gluon_ws import mainloop
    mainloop._softmax = _softmax_pairs


def shipped_cfg(dtype: str, d: int, causal: bool, n: int) -> dict:
    """The tile the AOT build ships for this call: aot/tiles.py's ws_config on the grid of the cubin
    whose length range holds n (variants.gluon_ws_entries: tiles per CTA, or the persistent grid
    with its CTAs per SM, dynamic tiles (claimed through a counter) and skipped rows); a per-tile
    grid below the warp-specialized kernel's range."""
    grids = [g for lo, hi, g in variants.gluon_ws_entries(dtype, d, causal) if lo <= n and (hi == 0 or n < hi)]
    grid = grids[0] if grids else variants.WsGrid()
    cfg = dict(ws_config(dtype, d, causal), TILES_PER_CTA=grid.tiles, SKIP_PAST_ROWS=grid.skip)
    if grid.persistent:
        cfg.update(PERSISTENT_GRID=variants.gluon_ws_tile(dtype, d, causal, grid).persistent,
                   DYNAMIC_TILES=int(grid.dynamic))
    return cfg


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--pairs", action="store_true", help="row max and sum over register pairs first (experiment)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=INT",
                    help="override a tile knob of the shipped config (NUM_STAGES=3, PINGPONG=0, OVERLAP_PV=1, ...)")
    args = ap.parse_args(argv)
    gluon_attn.runtime_ints()
    if args.pairs:
        use_pair_softmax()
    d, s = args.head_dim, args.seq
    h, b = 2048 // d, max(1, 16384 // s)
    dt = gluon_attn.DTYPES[args.dtype]
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dt) for _ in range(3))
    y = torch.full_like(q, float("nan"))
    lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    cfg = shipped_cfg(args.dtype, d, args.causal, s)
    for item in args.set:
        key, val = item.split("=")
        cfg[key] = bool(int(val)) if key in ("PINGPONG", "OVERLAP_PV") else int(val)
    print(f"{args.dtype} d{d} N{s} B{b} H{h} causal={int(args.causal)} cfg {cfg}", flush=True)
    for _ in range(args.launches):
        gluon_attn.run_ws(q, k, v, y, lse, args.causal, 0, cfg)
    torch.cuda.synchronize()
    ref = gluon_attn.cudnn(q, k, v, args.causal)
    err = float((y.float() - ref.float()).abs().max())
    print(f"max |y - cudnn| {err:.3e}", flush=True)
    if args.time:
        flops = 4 * b * h * s * s * d / (2 if args.causal else 1)
        ours = flops / gluon_attn.bench(lambda: gluon_attn.run_ws(q, k, v, y, lse, args.causal, 0, cfg)) / 1e9
        peer = flops / gluon_attn.bench(lambda: gluon_attn.cudnn(q, k, v, args.causal)) / 1e9
        print(f"TFLOP/s: ws {ours:.0f}  cudnn {peer:.0f}  ratio {ours / peer:.2f}", flush=True)
    return 0 if err < 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
