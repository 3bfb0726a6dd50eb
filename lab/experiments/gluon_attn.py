"""The Gluon prefill kernel (aot/flash_fwd_gluon.py) in JIT on a GPU machine: correctness against
an fp32 reference, then TFLOP/s beside torch SDPA's cuDNN backend and the shipped Triton kernel
(aot/flash_fwd.py, TMA variant at its shipped tile, as lab/experiments/tune.py drives it), all in one
run, on the benchmark grid (batch x seqlen = 16k tokens, hidden 2048). Prints a table, writes JSON.

    python lab/experiments/gluon_attn.py [--quick] [--dtypes fp16,bf16] [--head-dims 64,128]
        [--seqs 512,...,16384] [--configs "128:64,64,3,4;64:128,64,4,8"] [--check-only] [--out gluon.json]
        [--ws "128:128,128,2,1,168,2,240,2;..."] [--runtime-ints] [--no-triton] [--no-plain]

--configs times (and checks) the Gluon kernel at each tile given as head_dim:BLOCK_M,BLOCK_N,
NUM_STAGES,num_warps[,OVERLAP_PV] besides the tile table's; --ws the warp-specialized kernel at
head_dim:BLOCK_M,BLOCK_N,NUM_STAGES,PINGPONG[,maxnreg[,consumers[,consumer regs[,TILES_PER_CTA[,OVERLAP_PV
[,PERSISTENT_GRID[,DYNAMIC_TILES[,SKIP_PAST_ROWS]]]]]]]] (TILES_PER_CTA query tiles of BLOCK_M rows per CTA, grid cdiv(Sq, BLOCK_M * TILES_PER_CTA);
OVERLAP_PV 1: a consumer's softmax also runs under its own P V, the wait in an opaque branch;
PERSISTENT_GRID n: a persistent grid of n CTAs per SM over all tiles (B * Hq from Q's descriptor);
DYNAMIC_TILES 1: with it, the CTAs claim tiles through a counter (an int64 pair passed as TileCounter,
which every check then finds back at zero), 2: the same tile order, claimed round robin without one
(TileCounter null);
SKIP_PAST_ROWS 1: a consumer whose rows of a tile all lie past Sq only passes the barriers).
--runtime-ints compiles the Gluon kernels with their integer arguments unspecialized, as aot/build.py
compiles them (JIT otherwise folds causal == 1 and compiles anew per Sq % 16, group == 1, ...): one
compile per variant instead of one per shape class.
--sass needs no GPU: it compiles each variant ahead of time for sm_90 (as aot/build.py would),
prints registers, spills and shared memory, and reads the main loop's SASS for the overlap: how
many MUFU.EX2 (the softmax) sit between the wait for S (WARPGROUP.DEPBAR.LE gsb0, 0x1) and the
wait for P V (WARPGROUP.DEPBAR.LE gsb0, 0x0).
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

import torch  # noqa: E402
import triton  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from aot import flash_fwd_gluon as fg  # noqa: E402
from aot import flash_fwd_gluon_ws as fws  # noqa: E402
from aot.contract import ordered_args  # noqa: E402
from aot.tiles import gluon_config, ws_config, ws_desc_rows  # noqa: E402
from tune import NO_ROTARY, NULL, _shipped, bench, fwd_values, launch, save  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def run_gluon(q, k, v, y, lse, causal, offset=0, cfg=None, store_lse=True):
    """One launch of flash_fwd_gluon on (B, H, S, D) tensors (last stride 1); K/V may have fewer
    heads (GQA). `cfg` overrides the tile table's BLOCK_M/BLOCK_N/NUM_STAGES/num_warps."""
    b, hq, sq, d = q.shape
    c = dict(gluon_config(str(q.dtype), d, causal), **(cfg or {}))
    lay = fg.desc_layout()
    rows = (c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_N"], c["BLOCK_M"])
    descs = [TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, r, d], lay)
             for t, r in zip((q, k, v, y), rows)]
    dummy = lse  # Mask / SeqlensK: unused by this kernel
    grid = (triton.cdiv(sq, c["BLOCK_M"]), b * hq)
    args = fwd_values(q, k, v, y, lse, **dict(zip("QKVY", descs)), Mask=dummy, SeqlensK=dummy, TileCounter=NULL,
                      offset=offset, causal=int(causal), store_lse=int(store_lse), **NO_ROTARY)
    fg.flash_fwd_gluon[grid](
        *ordered_args("fwd_gluon", args),
        BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_D=d, NUM_STAGES=c["NUM_STAGES"],
        OVERLAP_PV=c.get("OVERLAP_PV", False), num_warps=c["num_warps"])


_COUNTERS = {}  # device -> the DYNAMIC_TILES counter pair (the kernel leaves it at zero)


def counter(device) -> torch.Tensor:
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(2, dtype=torch.int64, device=device)
    return _COUNTERS[device]


def run_ws(q, k, v, y, lse, causal, offset=0, cfg=None, store_lse=True):
    """One launch of the warp-specialized kernel (aot/flash_fwd_gluon_ws.py); `cfg` overrides its
    tile table (BLOCK_M, BLOCK_N, NUM_STAGES, PINGPONG, maxnreg, NUM_CONSUMERS, CONSUMER_REGS,
    TILES_PER_CTA: a CTA takes that many consecutive BLOCK_M tiles)."""
    b, hq, sq, d = q.shape
    c = dict(ws_config(str(q.dtype), d, causal), **(cfg or {}))
    lay = fg.desc_layout()
    descs = [TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, r, d], lay)
             for t, r in zip((q, k, v, y), ws_desc_rows(c))]
    tiles = c.get("TILES_PER_CTA", 1)
    grid = (triton.cdiv(sq, c["BLOCK_M"] * tiles), b * hq)
    persistent = c.get("PERSISTENT_GRID", 0)
    if persistent:  # the experiment's grid: that many CTAs per SM over all tiles
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        grid = (min(sms * persistent, triton.cdiv(sq, c["BLOCK_M"]) * b * hq), 1)
    dynamic = c.get("DYNAMIC_TILES", 0) if persistent else 0
    args = fwd_values(q, k, v, y, lse, **dict(zip("QKVY", descs)), Mask=lse, SeqlensK=lse,
                      TileCounter=counter(q.device) if dynamic == 1 else NULL, offset=offset, causal=int(causal),
                      store_lse=int(store_lse), **NO_ROTARY)
    fws.flash_fwd_gluon_ws[grid](
        *ordered_args("fwd_gluon", args),
        BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_D=d, NUM_STAGES=c["NUM_STAGES"],
        PINGPONG=c["PINGPONG"], NUM_CONSUMERS=c.get("NUM_CONSUMERS", 2),
        CONSUMER_REGS=c.get("CONSUMER_REGS", 240), TILES_PER_CTA=tiles, OVERLAP_PV=c.get("OVERLAP_PV", False),
        PERSISTENT_GRID=bool(persistent), DYNAMIC_TILES=bool(dynamic),
        SKIP_PAST_ROWS=bool(c.get("SKIP_PAST_ROWS", False)), num_warps=c["num_warps"],
        maxnreg=c["maxnreg"])


def run_any(q, k, v, y, lse, causal, offset=0, cfg=None, store_lse=True):
    """run_ws for a cfg with WS set (the flag itself is not a kernel argument), else run_gluon."""
    if cfg and cfg.get("WS"):
        return run_ws(q, k, v, y, lse, causal, offset, {key: val for key, val in cfg.items() if key != "WS"},
                      store_lse)
    return run_gluon(q, k, v, y, lse, causal, offset, cfg, store_lse)


def runtime_ints() -> None:
    """Leave the Gluon kernels' integer arguments (all but the strides) unspecialized, as the AOT
    build does: set before the first launch, when JIT builds its argument binder."""
    for fn in (fg.flash_fwd_gluon, fws.flash_fwd_gluon_ws):
        assert not fn.device_caches, "set before the first launch"
        for p in fn.params:
            if not p.is_constexpr and p.name not in ("scale", "softcap") and not p.name.startswith("stride_") \
                    and p.name not in ("Q", "K", "V", "Y", "Lse", "Mask", "SeqlensK", "TileCounter"):
                p.do_not_specialize = True


def reference(q, k, v, causal, offset):
    """fp32 attention with the op's bottom-right causal rule (row i sees keys j <= i + offset);
    a row that sees nothing gives 0 and lse -inf."""
    group = q.shape[1] // k.shape[1]
    qf, kf, vf = q.float(), k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    s = qf @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        i = torch.arange(q.shape[2], device=q.device)[:, None]
        j = torch.arange(k.shape[2], device=q.device)[None, :]
        s = s.masked_fill(j > i + offset, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    return p @ vf, lse


CHECKS = [  # (B, Hq, Hkv, Sq, Skv, causal, offset)
    (2, 4, 2, 1000, 1000, False, 0), (2, 4, 2, 1000, 1000, True, 0),
    (1, 3, 1, 113, 203, True, 90), (1, 3, 1, 113, 203, False, 0),
    (1, 2, 2, 256, 128, True, -128), (2, 2, 1, 300, 700, True, 57),
    (1, 2, 2, 1024, 1024, True, 0), (1, 2, 1, 129, 1023, False, 0),
    # Several query tiles per CTA (TILES_PER_CTA): a last CTA with fewer valid tiles, a tile whose
    # upper consumer rows all lie past Sq, causal offsets both ways, K/V rings over many blocks.
    (1, 3, 1, 300, 700, True, 57), (2, 2, 1, 777, 1999, False, 0), (1, 2, 1, 1000, 1500, True, 500),
    (1, 2, 1, 300, 171, True, -129), (1, 2, 1, 129, 129, True, 0), (1, 4, 2, 2000, 2000, True, 0),
    # More tiles than a persistent grid has CTAs (DYNAMIC_TILES: claims through the counter), B * Hq
    # not a multiple of the head group, and a group of 3 heads (d128 at 9000 keys).
    (5, 6, 2, 777, 777, True, 0), (5, 6, 3, 1000, 1000, False, 0), (1, 5, 1, 2000, 9000, True, 7000),
]


def check(dtypes, head_dims, cfgs) -> list:
    """Every CHECKS shape: Y and lse against the fp32 reference, outputs poisoned with NaN."""
    rows, failed = [], 0
    for dt, d, (b, hq, hkv, sq, skv, causal, off), cfg in itertools.product(dtypes, head_dims, CHECKS, cfgs):
        if cfg and cfg.get("BLOCK_D", d) != d:
            continue
        cfg = {key: val for key, val in (cfg or {}).items() if key != "BLOCK_D"} or None
        q = torch.randn(b, hq, sq, d, device="cuda", dtype=DTYPES[dt])
        k = torch.randn(b, hkv, skv, d, device="cuda", dtype=DTYPES[dt])
        v = torch.randn(b, hkv, skv, d, device="cuda", dtype=DTYPES[dt])
        y = torch.full_like(q, float("nan"))
        lse = torch.full((b, hq, sq), float("nan"), device="cuda")
        run_any(q, k, v, y, lse, causal, off, cfg)
        torch.cuda.synchronize()
        ref, ref_lse = reference(q, k, v, causal, off)
        err = float((y.float() - ref).norm() / ref.norm().clamp_min(1e-6))
        finite = torch.isfinite(ref_lse)
        lse_err = float((lse[finite] - ref_lse[finite]).abs().max()) if finite.any() else 0.0
        lse_ok = bool(torch.equal(torch.isneginf(lse), ~finite))
        ok = (not torch.isnan(y).any()) and err < (1e-2 if dt == "bf16" else 3e-3) and lse_err < 1e-2 and lse_ok
        if cfg and cfg.get("DYNAMIC_TILES") == 1 and cfg.get("PERSISTENT_GRID"):
            ok = ok and counter(q.device).tolist() == [0, 0]  # the launch left the counter at zero
        failed += not ok
        shape = f"B{b} Hq{hq} Hkv{hkv} Sq{sq} Skv{skv} causal={int(causal)} off={off}"
        print(f"check {dt} d{d} {shape} {cfg or ''}: rel err {err:.1e}, lse err {lse_err:.1e}"
              f"{'' if ok else '  FAIL'}", flush=True)
        rows.append(dict(dtype=dt, head_dim=d, shape=shape, cfg=cfg, rel_err=err, lse_err=lse_err, ok=ok))
    print(f"checks: {len(rows) - failed}/{len(rows)} passed", flush=True)
    return rows


def cudnn(q, k, v, causal):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _label(cfg) -> str:
    """A short printed name of a timed variant (the JSON keeps the full one)."""
    if not cfg:
        return "one-partition"
    if cfg.get("WS"):
        return (f"ws M{cfg['BLOCK_M']} T{cfg.get('TILES_PER_CTA', 1)}" + (" O" if cfg.get("OVERLAP_PV") else "")
                + (" P" if cfg.get("PERSISTENT_GRID") else "")
                + ({1: " D", 2: " S"}.get(cfg.get("DYNAMIC_TILES", 0), "") if cfg.get("PERSISTENT_GRID") else "")
                + (" K" if cfg.get("SKIP_PAST_ROWS") else ""))
    return ",".join(f"{val}" for key, val in cfg.items())


def grid(dtypes, head_dims, seqs, cfgs, triton_peer=True, save_to=None, checks=()) -> list:
    """Every cell timed; with save_to, the JSON rewritten after each cell (a run cut short keeps
    what it measured)."""
    results = []
    for dt, d, s in itertools.product(dtypes, head_dims, seqs):
        h, b = 2048 // d, max(1, 16384 // s)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=DTYPES[dt]) for _ in range(3))
        y = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        for causal in (False, True):
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            ref = cudnn(q, k, v, causal)
            row = dict(dtype=dt, head_dim=d, seq=s, batch=b, heads=h, causal=causal)
            labels = {}  # row key -> short name for the printed line
            row["cudnn"] = flops / bench(lambda: cudnn(q, k, v, causal)) / 1e9
            if triton_peer:
                tile = _shipped(dt, d, "fwd_tma", causal=causal, skv=s)
                row["triton"] = flops / bench(lambda: launch(q, k, v, y, lse, causal, tile, tma=True)) / 1e9
            for cfg in cfgs:
                if cfg and cfg.get("BLOCK_D", d) != d:
                    continue
                cfg = {key: val for key, val in (cfg or {}).items() if key != "BLOCK_D"} or None
                y.fill_(float("nan"))
                run_any(q, k, v, y, lse, causal, 0, cfg)
                err = float((y.float() - ref.float()).abs().max())
                name = "gluon" + "".join(f" {key}={val}" for key, val in (cfg or {}).items())
                row[name] = flops / bench(lambda: run_any(q, k, v, y, lse, causal, 0, cfg)) / 1e9
                row[name + " max_err"] = err
                labels[name] = _label(cfg) + ("" if err < 0.1 else " ERR")  # NaN included
            gl_best = max(val for key, val in row.items() if key.startswith("gluon") and "err" not in key)
            peer = max(row["cudnn"], row.get("triton", 0.0))
            print(f"{dt} d{d:<3} N{s:<5} B{b:<2} causal={int(causal)}  gluon {gl_best:4.0f}  triton "
                  f"{row.get('triton', float('nan')):4.0f}  cudnn {row['cudnn']:4.0f}  gluon/cudnn {gl_best / row['cudnn']:.2f}x"
                  f"  gluon/best {gl_best / peer:.2f}x" + "".join(
                      f"  [{label}: {row[key]:.0f}]" for key, label in labels.items()), flush=True)
            results.append(row)
            if save_to:
                save(save_to, results + [dict(kind="checks", checks=checks)])
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fp16, N 1024/4096/16384")
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seqs", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--configs", default="", help="extra tiles, head_dim:BM,BN,stages,warps;...")
    ap.add_argument("--ws", default="", help="warp-specialized tiles, head_dim:BM,BN,stages,pingpong[,maxnreg[,consumers"
                    "[,consumer regs[,tiles per CTA[,overlap P V[,persistent CTAs per SM[,dynamic tiles[,skip past rows]]]]]]]];...")
    ap.add_argument("--runtime-ints", action="store_true", help="Gluon integer arguments unspecialized, as AOT")
    ap.add_argument("--no-triton", action="store_true", help="leave out the shipped Triton kernel's timing")
    ap.add_argument("--no-plain", action="store_true", help="leave out the one-partition kernel's own tile")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--sass", action="store_true", help="AOT-compile on the CPU, read registers and SASS order")
    ap.add_argument("--out", default="gluon_attn.json")
    args = ap.parse_args(argv)
    dtypes, seqs = args.dtypes.split(","), [int(x) for x in args.seqs.split(",")]
    if args.quick:
        dtypes, seqs = ["fp16"], [1024, 4096, 16384]
    head_dims = [int(x) for x in args.head_dims.split(",")]
    cfgs = [None]
    for item in filter(None, args.configs.split(";")):
        d, tile = item.split(":")
        bm, bn, st, nw, *overlap = map(int, tile.split(","))
        cfgs.append(dict(BLOCK_D=int(d), BLOCK_M=bm, BLOCK_N=bn, NUM_STAGES=st, num_warps=nw,
                         **(dict(OVERLAP_PV=bool(overlap[0])) if overlap else {})))
    for item in filter(None, args.ws.split(";")):
        d, tile = item.split(":")
        bm, bn, st, pp, *more = map(int, tile.split(","))
        extra = dict(zip(("maxnreg", "NUM_CONSUMERS", "CONSUMER_REGS", "TILES_PER_CTA", "OVERLAP_PV",
                          "PERSISTENT_GRID", "DYNAMIC_TILES", "SKIP_PAST_ROWS"), more))
        if "OVERLAP_PV" in extra:
            extra["OVERLAP_PV"] = bool(extra["OVERLAP_PV"])
        cfgs.append(dict(BLOCK_D=int(d), WS=True, BLOCK_M=bm, BLOCK_N=bn, NUM_STAGES=st, PINGPONG=bool(pp), **extra))
    if args.no_plain:
        cfgs.remove(None)
    if args.sass:
        from gluon_sass import report
        return report(dtypes, head_dims, cfgs)
    if args.runtime_ints:
        runtime_ints()
    checks = check(dtypes, head_dims, cfgs)
    save(args.out, [dict(kind="checks", checks=checks)])
    results = [] if args.check_only else grid(dtypes, head_dims, seqs, cfgs, not args.no_triton, args.out, checks)
    save(args.out, results + [dict(kind="checks", checks=checks)])
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
