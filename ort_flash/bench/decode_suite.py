"""Decode: Sq = 1 (and 4) query tokens against a long KV cache (the decode grid):
fp16, Hq 32, Hkv 8, d 128, batch 1 … 32, cache 4k … 128k.

The work is reading K and V once, so the figure of merit is the effective KV read bandwidth,
bytes of K + V / time, and its fraction of the copy bandwidth measured in the same run. Launch
overhead matters at these sizes (a B1 4k step moves 17 MB: ~4 µs at 4 TB/s), so every peer is
timed from CUDA-graph replays where it can be captured (``--cuda-graph off`` to compare).
"""
from __future__ import annotations

import itertools

import numpy as np

from ort_flash.bench import decode_peers, results
from ort_flash.bench.measure import Budget, Context, add_ratios, measure, release, run_grid
from ort_flash.bench.op_suite import cell, percent, verdict
from ort_flash.bench.spot_check import SpotCheck
from ort_flash.bench.tables import text_table
from ort_flash.bench.tensors import rotation_sets
from ort_flash.bench.workload import kv_read_bytes, tbps

TARGET_S = {False: 0.1, True: 0.05}  # graph replays are steady; many shapes to cover
PEER_ORDER = ("ort_flash", "ort_flash_run", "ort_flash_past", "ort_flash_kernel", "ort_gqa", "ort_mha", "sdpa",
              "sdpa_flash", "sdpa_cudnn")


def grid(device: str, quick: bool, overrides: dict | None = None) -> dict:
    o = overrides or {}
    if device == "cuda":
        g = dict(dtype="float16", hq=32, hkv=8, d=128,
                 batches=[1, 8, 32] if quick else [1, 4, 8, 16, 32],
                 caches=[4096, 32768, 131072] if quick else [4096, 8192, 16384, 32768, 65536, 131072],
                 sq4=[] if quick else [(1, 4096), (1, 32768), (1, 131072), (8, 4096), (8, 32768), (8, 131072)],
                 # Batches between the grid's, where the split rule and the tile choice meet grids
                 # of neither one CTA per SM nor two (24: 192 row blocks on 132 SMs).
                 odd=[] if quick else [(2, 16384), (12, 32768), (24, 8192), (24, 65536)])
    else:
        g = dict(dtype="float32", hq=8, hkv=2, d=64, batches=[1, 2], caches=[1024, 4096] if not quick else [1024],
                 sq4=[(1, 1024)])
    if o.get("batches"):
        g["batches"] = o["batches"]
        g["odd"] = []
    if o.get("caches"):
        g["caches"] = o["caches"]
    if o.get("dtypes"):
        g["dtype"] = o["dtypes"][0]
    return g


KEY_SHAPES = {(1, 4096), (1, 32768), (1, 131072), (8, 131072), (8, 4096), (32, 32768)}  # the grid's named shapes


def configs(g: dict) -> list[dict]:
    """Sq = 1 shapes, the named ones (KEY_SHAPES) first (a time budget cuts from the end), the odd
    batches, then Sq = 4."""
    base = dict(dtype=g["dtype"], hq=g["hq"], hkv=g["hkv"], d=g["d"])
    pairs = sorted(itertools.product(g["batches"], g["caches"]), key=lambda bc: (bc not in KEY_SHAPES, bc[1], bc[0]))
    out = [dict(base, batch=b, sq=1, cache=c) for b, c in pairs]
    out += [dict(base, batch=b, sq=1, cache=c) for b, c in g.get("odd", [])]
    out += [dict(base, batch=b, sq=4, cache=c) for b, c in g["sq4"]]
    return out


def run(ctx: Context, suite: dict, ceilings: dict, budget: Budget, args, save, progress) -> None:
    run_grid(ctx, suite, configs(suite["grid"]), decode_peers.peers_for(ctx.device), run_config,
             ceilings, budget, args, save, progress, "decode")


def run_config(ctx: Context, cfg: dict, builders: dict, ceilings: dict, bar=None) -> list[dict]:
    t = ctx.tensors
    b, sq, cache, d = cfg["batch"], cfg["sq"], cfg["cache"], cfg["d"]
    nbytes = kv_read_bytes(b, cfg["hkv"], cache, d, cfg["dtype"])
    sets = [{"q": t.randn((b, cfg["hq"], sq, d), cfg["dtype"]),
             "k": t.randn((b, cfg["hkv"], cache, d), cfg["dtype"]),
             "v": t.randn((b, cfg["hkv"], cache, d), cfg["dtype"]),
             "lens": t.values(np.full(b, cache), "int64")} for _ in range(rotation_sets(nbytes))]
    try:
        check = SpotCheck(sets[0]["q"], sets[0]["k"], sets[0]["v"], causal=True, dtype=cfg["dtype"])
    except Exception:  # noqa: BLE001 - no host view of the tensors (CUDA without torch)
        check = None
    rows = []
    for name, build in builders.items():
        if bar is not None and hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(f"B{b} Sq{sq} cache {cache}: {name}")
        row = measure(ctx, name, lambda build=build, sets=sets: build(ctx, cfg, sets), check=check,
                      graph_torch=ctx.cuda_graph)
        row["config"] = cfg
        if row["status"] in ("ok", "mismatch"):
            row["kv_tbps"] = tbps(nbytes, row["ms"])
            row["us"] = row["ms"] * 1e3
            row["bandwidth_fraction"] = row["kv_tbps"] / ceilings["copy_tbps"] if ceilings.get("copy_tbps") else None
        rows.append(row)
    add_ratios(rows, "kv_tbps")
    del sets
    release(ctx)
    return rows


def summary(suite: dict) -> tuple[list[str], list[list]]:
    peers = [p for p in PEER_ORDER if any(r["peer"] == p for r in suite["rows"])]
    header = ["B", "Sq", "cache", "KV MB"] + peers + ["best peer", "ours/best", "kernel/best", "of copy BW"]
    rows = []
    for cfg, group in results.group_by_config(suite["rows"]):
        by = {r["peer"]: r for r in group}
        kv = kv_read_bytes(cfg["batch"], cfg["hkv"], cfg["cache"], cfg["d"], cfg["dtype"]) / 1e6
        cells = [cfg["batch"], cfg["sq"], cfg["cache"], kv] + [cell(by.get(p), "kv_tbps") for p in peers]
        ours, kern = by.get("ort_flash", {}), by.get("ort_flash_kernel", {})
        cells += [(ours if "best_peer" in ours else kern).get("best_peer"), verdict(ours.get("vs_best_peer")),
                  verdict(kern.get("vs_best_peer")), percent(ours.get("bandwidth_fraction"))]
        rows.append(cells)
    return header, rows


def print_summary(suite: dict) -> None:
    header, rows = summary(suite)
    g = suite["grid"]
    print(text_table(header, rows, title=f"\ndecode on {suite['device']} ({g['dtype']}, Hq {g['hq']}, "
                     f"Hkv {g['hkv']}, d {g['d']}): effective KV read bandwidth, TB/s"))
    print(results.format_reasons(suite["rows"]))
