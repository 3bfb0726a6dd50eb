"""How evenly a persistent grid's CTAs share a call's query tiles, by model, no GPU: each tile costs
its key blocks plus a fixed overhead (--overhead, in blocks), and the CTAs take tiles

  static:  round robin over every head's longest tile, then every head's next, ...
           (_cta_tile under causal),
  grid:    in a per-tile grid's launch order (head after head, each head's longest tile first)
           whenever a CTA frees up (what the hardware does with a CTA per tile),
  dynamic: as the CTAs free up, in _tile_of's order (heads in groups whose K/V take about 16 MB,
           each group's longest tiles first; aot/flash_fwd_gluon_ws.py DYNAMIC_TILES),

and prints the busiest CTA's work over the mean (1.00: no CTA waits at the end) on the op
benchmark's grid (batch x seqlen = 16k tokens, hidden 2048). A prediction for perf-notes, not a
measurement.

    python lab/experiments/tile_schedule.py [--sms 132] [--overhead 1] [--out tile_schedule.json]
"""
from __future__ import annotations

import argparse
import heapq
import json


def tile_blocks(sq: int, block_m: int, block_n: int, causal: bool) -> list[int]:
    """Key blocks of each query tile m (aot/flash_fwd_gluon_ws.py _tile_span, offset 0)."""
    out = []
    for m in range(-(-sq // block_m)):
        hi = min(sq, (m + 1) * block_m) if causal else sq
        out.append(max(-(-hi // block_n), 1))
    return out


def group_heads(skv: int, head_dim: int) -> int:
    """_tile_of's heads per group (the kernel's grp)."""
    return max(min((4194304 // head_dim) // max(skv, 1), 8), 1)


def orders(bh: int, blocks: list[int], grp: int) -> dict[str, list[int]]:
    """Tile costs (blocks) in each policy's order."""
    n_m = len(blocks)
    lpt = [blocks[n_m - 1 - r] for r in range(n_m) for _ in range(bh)]
    head_major = [blocks[n_m - 1 - r] for _ in range(bh) for r in range(n_m)]
    grouped = []
    for g0 in range(0, bh, grp):
        size = min(grp, bh - g0)
        grouped += [blocks[n_m - 1 - r] for r in range(n_m) for _ in range(size)]
    return {"static": lpt, "grid": head_major, "dynamic": grouped}


def round_robin(costs: list[float], ctas: int) -> list[float]:
    load = [0.0] * ctas
    for i, c in enumerate(costs):
        load[i % ctas] += c
    return load


def greedy(costs: list[float], ctas: int) -> list[float]:
    heap = [(0.0, i) for i in range(ctas)]
    for c in costs:
        t, i = heapq.heappop(heap)
        heapq.heappush(heap, (t + c, i))
    return [t for t, _ in heap]


def imbalance(policy: str, costs: list[float], ctas: int) -> float:
    ctas = min(ctas, len(costs))
    load = round_robin(costs, ctas) if policy == "static" else greedy(costs, ctas)
    return max(load) / (sum(load) / ctas)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=132, help="CTAs of the persistent grid (H200: 132 SMs)")
    ap.add_argument("--overhead", type=float, default=1.0, help="a tile's fixed cost, in key blocks")
    ap.add_argument("--seqs", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--out", default="tile_schedule.json")
    args = ap.parse_args(argv)
    rows = []
    print(f"busiest CTA / mean, {args.sms} CTAs, tile = blocks + {args.overhead:g}")
    print(f"{'d':>4} {'causal':>6} {'N':>6} {'grp':>4} {'static':>7} {'grid':>7} {'dynamic':>8}")
    for d, block_m in ((128, 128), (64, 192)):
        for causal in (True, False):
            for s in map(int, args.seqs.split(",")):
                heads, batch = 2048 // d, max(1, 16384 // s)
                grp = group_heads(s, d)
                costs = {k: [c + args.overhead for c in v]
                         for k, v in orders(batch * heads, tile_blocks(s, block_m, 128, causal), grp).items()}
                row = dict(head_dim=d, causal=causal, seq=s, batch=batch, heads=heads, grp=grp,
                           **{k: round(imbalance(k, v, args.sms), 4) for k, v in costs.items()})
                rows.append(row)
                print(f"{d:>4} {int(causal):>6} {s:>6} {grp:>4} {row['static']:>7.3f} {row['grid']:>7.3f} "
                      f"{row['dynamic']:>8.3f}")
    with open(args.out, "w") as f:
        json.dump(dict(sms=args.sms, overhead=args.overhead, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
