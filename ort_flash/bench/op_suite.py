"""Op level: one attention call on prefill shapes, the fused op against every peer in one run.

CUDA grid (benchmark issue): batch × seqlen = 16k tokens, hidden 2048, head dim 64 and 128
(heads = 2048 / d), seqlen 512 … 16k, causal and not, fp16 and bf16. ``--quick``: fp16,
seqlen 512 / 2k / 8k. CPU grid (to exercise the harness, not to publish): 2k tokens, hidden 256.

Reported per peer: milliseconds, TFLOP/s (4·B·H·N²·D, half when causal), the fraction of the
matmul ceiling measured in the same run (8192³ in the row's dtype; bf16 where that is missing),
and for ours the ratio to the best competitor in the same run.
"""
from __future__ import annotations

import itertools

from ort_flash.bench import op_peers, results
from ort_flash.bench.measure import Budget, Context, add_ratios, measure, release, run_grid
from ort_flash.bench.spot_check import SpotCheck
from ort_flash.bench.tables import text_table
from ort_flash.bench.tensors import rotation_sets
from ort_flash.bench.workload import attention_flops, io_bytes, tflops

PEER_ORDER = ("ort_flash", "ort_flash_kernel", "ort_flash_fp8", "ort_mha", "onnx_attention", "unfused",
              "sdpa_cudnn", "sdpa_flash", "sdpa")


def grid(device: str, quick: bool, overrides: dict | None = None) -> dict:
    o = overrides or {}
    if device == "cuda":
        g = dict(tokens=16384, hidden=2048, head_dims=[128, 64], causal=[False, True],
                 dtypes=["float16"] if quick else ["float16", "bfloat16"],
                 seqlens=[512, 2048, 8192] if quick else [128, 256, 512, 1024, 2048, 4096, 8192, 16384],
                 model_shapes=[] if quick else [list(m) for m in MODEL_SHAPES])
    else:
        g = dict(tokens=2048, hidden=256, head_dims=[64] if quick else [64, 128], causal=[False, True],
                 dtypes=["float32"] if quick else ["float32", "float16"],
                 seqlens=[256, 512] if quick else [256, 512, 1024])
    for key in ("seqlens", "dtypes", "head_dims", "tokens", "hidden"):
        if o.get(key):
            g[key] = o[key]
    return g


# Encoders' attention shapes, bidirectional (heads, head dim, sequence, batch x sequence):
# BERT-base and -large at 128 and 512 tokens, ViT-B/16 (197 tokens), MiniLM-L12-H384.
MODEL_SHAPES = ((12, 64, 128, 4096), (12, 64, 128, 65536), (12, 64, 512, 4096), (12, 64, 512, 65536),
                (16, 64, 128, 4096), (16, 64, 512, 65536), (12, 64, 197, 12608), (12, 32, 128, 16384))


def configs(g: dict) -> list[dict]:
    out = []
    for dtype, d, causal, n in itertools.product(g["dtypes"], g["head_dims"], g["causal"], g["seqlens"]):
        out.append(dict(dtype=dtype, d=d, heads=g["hidden"] // d, batch=max(1, g["tokens"] // n),
                        seqlen=n, causal=causal))
    for dtype, (heads, d, n, tokens) in itertools.product(g["dtypes"], g.get("model_shapes", [])):
        out.append(dict(dtype=dtype, d=d, heads=heads, batch=max(1, tokens // n), seqlen=n, causal=False))
    return out


def run(ctx: Context, suite: dict, ceilings: dict, budget: Budget, args, save, progress) -> None:
    run_grid(ctx, suite, configs(suite["grid"]), op_peers.peers_for(ctx.device), run_config,
             ceilings, budget, args, save, progress, "op")


def run_config(ctx: Context, cfg: dict, builders: dict, ceilings: dict, bar=None) -> list[dict]:
    t = ctx.tensors
    b, h, n, d = cfg["batch"], cfg["heads"], cfg["seqlen"], cfg["d"]
    shape = (b, h, n, d)
    nsets = rotation_sets(io_bytes(b, h, h, n, n, d, cfg["dtype"]) * 3 / 4)
    sets = [{name: t.randn(shape, cfg["dtype"]) for name in ("q", "k", "v")} for _ in range(nsets)]
    try:
        check = SpotCheck(sets[0]["q"], sets[0]["k"], sets[0]["v"], causal=cfg["causal"], dtype=cfg["dtype"])
    except Exception:  # noqa: BLE001 - no host view of the tensors (CUDA without torch)
        check = None
    flops = attention_flops(b, h, n, n, d, cfg["causal"])
    rows = []
    for name, build in builders.items():
        if bar is not None and hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(f"{cfg['dtype']} d{d} N{n}{' causal' if cfg['causal'] else ''}: {name}")
        row = measure(ctx, name, lambda build=build, sets=sets: build(ctx, cfg, sets), check=check,
                      graph_torch=ctx.cuda_graph)
        row["config"] = cfg
        if row["status"] in ("ok", "mismatch"):
            row["tflops"] = tflops(flops, row["ms"])
            ceiling = ceilings.get(f"matmul_{cfg['dtype']}_tflops") or ceilings.get("matmul_tflops")
            row["ceiling_fraction"] = row["tflops"] / ceiling if ceiling else None
        rows.append(row)
    add_ratios(rows, "tflops")
    del sets
    release(ctx)
    return rows


def summary(suite: dict) -> tuple[list[str], list[list]]:
    """One line per configuration: TFLOP/s per peer, ours against the best competitor."""
    peers = [p for p in PEER_ORDER if any(r["peer"] == p for r in suite["rows"])]
    fp8 = "ort_flash_fp8" in peers
    header = (["dtype", "d", "N", "B×H", "causal"] + peers + ["best peer", "ours/best", "kernel/best"]
              + (["fp8/best"] if fp8 else []) + ["of ceiling"])
    rows = []
    for cfg, group in results.group_by_config(suite["rows"]):
        by = {r["peer"]: r for r in group}
        cells = [cfg["dtype"], cfg["d"], cfg["seqlen"], f"{cfg['batch']}×{cfg['heads']}", cfg["causal"]]
        for p in peers:
            cells.append(cell(by.get(p), "tflops"))
        ours, kern = by.get("ort_flash", {}), by.get("ort_flash_kernel", {})
        ref = ours if "best_peer" in ours else kern
        cells += [ref.get("best_peer"), verdict(ours.get("vs_best_peer")), verdict(kern.get("vs_best_peer"))]
        if fp8:
            cells.append(verdict(by.get("ort_flash_fp8", {}).get("vs_best_peer")))
        cells.append(percent(ours.get("ceiling_fraction")))
        rows.append(cells)
    return header, rows


def cell(row: dict | None, key: str):
    """A peer's value, or why there is none."""
    if row is None:
        return None
    if row["status"] == "ok":
        return row.get(key)
    if row["status"] == "mismatch":
        return f"{row.get(key, 0):.0f} WRONG"
    return "n/a" if row["status"] == "unsupported" else "error"


def verdict(ratio: float | None) -> str | None:
    """1.12x, or 0.87x (peer wins) when ours is slower."""
    if ratio is None:
        return None
    return f"{ratio:.2f}x" + ("" if ratio >= 1.0 else " (peer wins)")


def percent(x: float | None) -> str | None:
    return None if x is None else f"{100 * x:.0f}%"


def print_summary(suite: dict) -> None:
    header, rows = summary(suite)
    print(text_table(header, rows, title=f"\nop level on {suite['device']}: TFLOP/s "
                     f"(4·B·H·N²·D, causal halved); n/a = peer does not support the configuration"))
    print(results.format_reasons(suite["rows"]))
