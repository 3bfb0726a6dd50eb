"""What merging the rare shape classes into superset variants costs at run time, on a GPU machine.

The build compiles fp32, fp16/bf16 at head dims 32 and 256 and inexact head dims only as superset
variants (aot/variants.py superset_only, edge_loop): the extras variant run with neutral arguments,
for fp32 prefill the masked-head-dim one, both boundary key ranges through one loop (EDGE_LOOP).
For each call of lab/experiments/merged_pairs.py (CALLS) this script compiles (a) the variant the
unmerged build compiles for it (what the dispatcher picks from the unmerged product,
`aot/build.py --unmerged`, with EDGE_LOOP off) and (b) the variant the merged build
compiles (what cpp/kernel_select.cc find_superset picks), both exactly as aot/build.py
compiles them (its signature and hints, its tile, triton.compile, in parallel processes), checks both
against the float64 reference of ort_flash/reference.py on fresh random data (outputs poisoned
with NaN) and times both with triton.testing.do_bench, interleaved round by round. Prints a
table (call, before us, after us, after/before) and writes JSON.

    python3 lab/experiments/merged_variants.py [--out merged.json] [--only REGEX] [--rounds N]
    python3 lab/experiments/merged_variants.py --dry-run     # no GPU: the pairs, checked against the tables
    python3 lab/experiments/merged_variants.py --before-source OLD_AOT_DIR [--out ab.json]

--before-source DIR is an A/B run of two versions of the kernels instead: each call whose variant
the build compiles with EDGE_LOOP (merged_pairs.AB_CALLS: CALLS and calls with a softcap or a full
mask) runs that one variant compiled from DIR's flash_fwd.py / flash_decode.py (e.g. `git show
REV:aot/flash_fwd.py > DIR/flash_fwd.py`, the same for flash_decode.py) as "before" and from aot/
as "after"; a variants.py in DIR (`git show REV:aot/variants.py`) gives the "before" side its tile
(an A/B of tiles), aot/'s kernel files standing in for the ones DIR lacks.

Needs torch, triton 3.6 and numpy; the repository need not be installed (the script imports aot/
and ort_flash/reference.py from its checkout).
"""
from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import re
import secrets
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]
# torch.cuda.is_available() through NVML, so CUDA is not initialized before the compile workers fork.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

from aot import compile_pool  # noqa: E402
from aot.contract import ordered_args, stride_args  # noqa: E402
from aot.flash_decode import merge_round_trips  # noqa: E402
from merged_pairs import (AB_CALLS, ARCH, CALLS, MAX_DECODE_ROWS, Call, Pair, V, ab_pairs,  # noqa: E402
                          combine_variant, fwd_config, make_pairs, source)
from tune import fwd_values, save  # noqa: E402
from tune_decode import MAX_SPLITS, choose_splits  # noqa: E402

H200_SMS = 132             # the dry run's SM count (choose_splits)
MAX_FUSED_SPLITS, MAX_FUSED_TRIPS = 32, 2  # cpp/decode_heuristics.h kMaxFusedSplits, kMaxFusedRoundTrips
TORCH = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
FLOORS = {"fp16": 1e-3, "bf16": 8e-3, "fp32": 4e-6}  # tests/test_cuda_kernel.py's error floors
FLOORS_TF32 = 5e-3     # TF32 dots against plain fp32 as the low-precision computation


def _compile(job) -> float:
    """A worker: compiles one variant into Triton's cache (and its launcher), returns wall seconds."""
    v, arch, edge, folder = job
    from triton.backends.compiler import GPUTarget
    t = time.perf_counter()
    src, opts, _, _ = source(v, arch, edge, folder)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)
    try:  # the launcher's and the driver utilities' C modules too, so the main process finds them cached
        from triton.backends.nvidia.driver import CudaLauncher, CudaUtils
        CudaLauncher(src, k.metadata)
        CudaUtils()
    except Exception:  # noqa: BLE001 - the main process builds them then
        pass
    return time.perf_counter() - t


def compile_all(jobs: list, arch: int, workers: int) -> dict:
    """Every (variant, EDGE_LOOP, kernel source folder) compiled on `workers` processes (forked before CUDA
    starts), the costliest first; then loaded here from Triton's cache: {job: CompiledKernel}."""
    from triton.backends.compiler import GPUTarget
    order = sorted(set(jobs), key=lambda j: -compile_pool.estimated_cost(j[0], arch, fwd_config(j[0], arch, j[2])))
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork")) as pool:
        futs = {pool.submit(_compile, (v, arch, e, folder)): (v, e, folder) for v, e, folder in order}
        for n, f in enumerate(as_completed(futs), 1):
            v, e, folder = futs[f]
            try:
                msg = f"{f.result():.1f} s"
            except Exception as err:  # noqa: BLE001 - its calls are reported as not run
                msg = f"FAILED: {type(err).__name__}: {str(err)[:300]}"
                order.remove((v, e, folder))
            print(f"compiled [{n}/{len(futs)}] {v.name}{' EDGE_LOOP' if e else ''}{f' from {folder}' if folder else ''} "
                  f"{msg} ({time.perf_counter() - start:.0f} s elapsed)", flush=True)
    out = {}
    for v, e, folder in order:
        src, opts, _, _ = source(v, arch, e, folder)
        out[(v, e, folder)] = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)
    return out


def _tensor(shape, layout, dtype, device, fill=None):
    b, h, s, d = shape
    full = {"bhsd": (b, h, s, d), "bshd": (b, s, h, d), "pad": (b, h, s, d + 8)}[layout]
    t = torch.randn(full, dtype=dtype, device=device) if fill is None else torch.full(full, fill, dtype=dtype, device=device)
    return t.transpose(1, 2) if layout == "bshd" else t[..., :d]


def make_inputs(c: Call, device) -> dict:
    """Fresh random Q, K, V; Y and Lse poisoned with NaN; the mask (batch i pads the last i/4B of
    its keys; a full mask also drops a tenth of the rest, every row keeps key 0)."""
    dt = TORCH[c.dtype]
    t = dict(q=_tensor((c.b, c.hq, c.sq, c.d), c.layout, dt, device),
             k=_tensor((c.b, c.hkv, c.skv, c.d), c.layout, dt, device),
             v=_tensor((c.b, c.hkv, c.skv, c.d), c.layout, dt, device),
             y=_tensor((c.b, c.hq, c.sq, c.d), c.layout, dt, device, float("nan")),
             lse=torch.full((c.b, c.hq, c.sq), float("nan"), device=device),
             dummy8=torch.zeros(1, dtype=torch.int8, device=device),
             dummy64=torch.zeros(1, dtype=torch.int64, device=device), mask=None, mask_strides=(0, 0, 0))
    if c.mask != "none":
        rows = c.sq if c.mask_rows else 1
        keep = torch.arange(c.skv, device=device)[None, :] < (
            c.skv - torch.arange(c.b, device=device) * c.skv // (4 * c.b))[:, None]
        keep = keep[:, None, None, :].expand(c.b, 1, rows, c.skv)
        if c.mask_rows:
            keep = keep & (torch.rand(c.b, 1, rows, c.skv, device=device) > 0.1)
            keep[..., 0] = True
        keep = keep.contiguous()
        if c.mask == "bool":
            t["mask"] = keep
        else:
            bias = 0.5 * torch.randn(keep.shape, device=device)
            t["mask"] = torch.where(keep, bias, float("-inf")).to(dt)
        t["mask_strides"] = (rows * c.skv, 0, c.skv if c.mask_rows else 0)
    return t


def inputs(p: Pair, device) -> dict:
    """make_inputs and, for decode, the split kernel's workspace: partials for the most splits,
    arrival counters (zero) per (batch, KV head, row block)."""
    c, t = p.call, make_inputs(p.call, device)
    if c.kind == "decode":
        n = c.b * c.hq * c.sq * MAX_SPLITS
        t.update(opart=torch.empty(n * p.after.head_dim, device=device), lpart=torch.empty(n, device=device),
                 counter=torch.zeros(c.b * c.hkv * -(-MAX_DECODE_ROWS // V.DECODE_BLOCK_M), dtype=torch.int32,
                                     device=device))
    return t


def decode_plan(c: Call, v: V.Variant, sms: int, folder: str | None = None) -> tuple[int, bool]:
    """(KV splits, merge in the split kernel) as cpp/launch_plan.cc plan_decode chooses them."""
    cfg = fwd_config(v, ARCH, folder)
    rows = c.hq // c.hkv * c.sq
    splits = choose_splits(c.b * c.hkv * -(-rows // cfg.block_m), c.skv, cfg.block_n, sms, v.head_dim)
    fused = 1 < splits <= MAX_FUSED_SPLITS and merge_round_trips(min(cfg.block_m, rows), splits) <= MAX_FUSED_TRIPS
    return splits, fused


def launch_args(c: Call, v: V.Variant, t: dict, names, sig, splits: int = 1, fused: bool = False) -> list:
    """The kernel's arguments in parameter order, as cpp/cuda_launch.cc fills them; the extras
    neutral (no window, no key lengths, the call's softcap: 0 but in AB_CALLS). Constexpr slots are
    None (the launcher skips them)."""
    mask = t["dummy8"] if t["mask"] is None else t["mask"].view(torch.int8) if c.mask == "bool" else t["mask"]
    a = fwd_values(t["q"], t["k"], t["v"], t["y"], t["lse"], Mask=mask, SeqlensK=t["dummy64"], softcap=c.softcap,
                   offset=c.skv - c.sq, causal=int(c.causal), **stride_args("m", t["mask_strides"]))
    if v.kind == "decode":
        a.update(num_splits=splits, fused=int(fused), OPart=t.get("opart"), LsePart=t.get("lpart"),
                 Counter=t.get("counter"))
    return _ordered(v.kind, a, names, sig)


def _ordered(kind: str, a: dict, names, sig) -> list:
    """`a`, the kind's runtime arguments by name (aot/contract.py's ABI: each one, no other), in the
    compiled kernel's parameter order `names`, its constexpr slots None."""
    ordered_args(kind, a)  # raises unless `a` has a value for each of them and no other
    return [a[n] if sig[n] != "constexpr" else None for n in names]


def runner(p: Pair, v: V.Variant, kern, comb, t: dict, sms: int, folder: str | None = None):
    """A closure that runs one call through `kern` (+ the combine kernel where the launcher would),
    at the tile of the table it was compiled from (`folder`'s variants.py, where it has one)."""
    c = p.call
    _, _, names, sig = source(v, ARCH, False, folder)
    cfg = fwd_config(v, ARCH, folder)
    if v.kind == "fwd":
        run = kern[(triton.cdiv(c.sq, cfg.block_m), c.b * c.hq, 1)]
        args = launch_args(c, v, t, names, sig)
        return lambda: run(*args)
    splits, fused = decode_plan(c, v, sms, folder)
    run = kern[(splits, c.b * c.hkv, triton.cdiv(c.hq // c.hkv * c.sq, cfg.block_m))]
    args = launch_args(c, v, t, names, sig, splits, fused)
    if splits == 1 or fused:
        return lambda: run(*args)
    cv = combine_variant(v)
    crun = comb[(c.b * c.hq * c.sq, 1, 1)]
    _, _, cnames, csig = source(cv, ARCH, False)
    cvals = dict(OPart=t["opart"], LsePart=t["lpart"], Y=t["y"], Lse=t["lse"], Hq=c.hq, Sq=c.sq, Dv=c.d,
                 num_splits=splits, store_lse=1, **stride_args("y", t["y"].stride()))
    cargs = _ordered(cv.kind, cvals, cnames, csig)

    def both():
        run(*args)
        crun(*cargs)
    return both


def check(p: Pair, fn, t: dict) -> dict:
    """Runs fn on NaN-poisoned outputs: no NaN left in Y, nothing written past Dv, and Y and Lse
    against ort_flash.reference with the error contract on batches 0 and B-1, KV heads 0 and
    Hkv-1, query rows [0, 64) and the last 192 (so the reference costs moments)."""
    import numpy as np
    from ort_flash.reference import attention_lowp, attention_reference, error_bound
    c = p.call
    t["y"].fill_(float("nan"))  # a view: poisons it, the pad columns stay NaN
    t["lse"].fill_(float("nan"))
    fn()
    if t["y"].is_cuda:
        torch.cuda.synchronize()
    ok = not torch.isnan(t["y"]).any().item()
    if c.layout == "pad":
        ok &= bool(torch.isnan(t["y"].as_strided((c.b, c.hq, c.sq, 8), t["y"].stride(), c.d)).all())
    try:
        npdt = {"fp16": np.float16, "fp32": np.float32}[c.dtype]
    except KeyError:
        import ml_dtypes  # numpy has no bfloat16
        npdt = ml_dtypes.bfloat16

    def host(x):
        return x.float().cpu().numpy().astype(npdt)

    g, off = c.hq // c.hkv, c.skv - c.sq
    floor = FLOORS_TF32 if c.prec == "tf32" and c.dtype == "fp32" else FLOORS[c.dtype]
    ranges = [(0, c.sq)] if c.sq <= 256 else [(0, 64), (c.sq - 192, c.sq)]
    y_err = bound = lse_err = 0.0
    for b, h, (r0, r1) in sorted({(b, h, r) for b, h in ((0, 0), (c.b - 1, c.hkv - 1)) for r in ranges}):
        heads = slice(h * g, (h + 1) * g)
        k, v = host(t["k"][b:b + 1, h:h + 1]), host(t["v"][b:b + 1, h:h + 1])
        past = off + r0  # the rows' offset: keys before it are the reference's past
        kw = dict(is_causal=c.causal, scale=1.0 / math.sqrt(c.d), softcap=c.softcap)
        if past:
            kw.update(past_key=k[:, :, :past], past_value=v[:, :, :past])
        if t["mask"] is not None:
            m = t["mask"][b:b + 1, :, r0:r1] if c.mask_rows else t["mask"][b:b + 1]
            kw["attn_mask"] = m.cpu().numpy() if c.mask == "bool" else host(m)
        args = (host(t["q"][b:b + 1, heads, r0:r1]), k[:, :, past:], v[:, :, past:])
        ref, _, _, ref_lse = attention_reference(*args, **kw)
        bnd = error_bound(ref, attention_lowp(*args, **kw)[0], floor)
        err = float(np.abs(t["y"][b:b + 1, heads, r0:r1].double().cpu().numpy() - ref).max())
        lse = t["lse"][b:b + 1, heads, r0:r1].cpu().numpy()
        fin = np.isfinite(ref_lse)
        le = float(np.abs(lse[fin] - ref_lse[fin]).max(initial=0))
        ok &= bool(err <= bnd and np.array_equal(np.isneginf(lse), ~fin)
                   and le < 1e-3 * max(1.0, np.abs(ref_lse[fin]).max(initial=1)))
        y_err, bound, lse_err = max(y_err, err), max(bound, bnd), max(lse_err, le)
    return dict(ok=bool(ok), max_err=y_err, bound=bound, lse_err=lse_err)


def timed(fns: list, rounds: int, warmup: int, rep: int) -> list:
    """Per-round do_bench medians (us) of each (before, after) pair of closures: every round times
    every pair, the side that goes first alternating, so a drift of the clock hits both."""
    out = [([], []) for _ in fns]
    for r in range(rounds):
        for i, pair in enumerate(fns):
            for side in ((0, 1) if (r + i) % 2 == 0 else (1, 0)):
                ms = triton.testing.do_bench(pair[side], warmup=warmup, rep=rep, return_mode="median")
                out[i][side].append(ms * 1e3)
    return out


class Recorder:
    """Stands in for a compiled kernel in the dry run: records each launch's grid and arguments."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args: self.launches.append((grid, args))


def dry_run(pairs: list) -> int:
    """Prints the pairs and builds every launch on the meta device (no GPU, nothing compiled)."""
    for p in pairs:
        t = inputs(p, "meta")
        for v, _, _ in p.jobs:
            runner(p, v, Recorder(), Recorder(), t, H200_SMS)()
        extra = ""
        if p.call.kind == "decode":
            splits, fused = decode_plan(p.call, p.after, H200_SMS)
            extra = f"  splits {splits}{' fused' if fused else ' + combine'}"
        print(f"{p.call.label:<28} {p.before.name:<32} -> {p.after.name}"
              f"{' EDGE_LOOP' if V.edge_loop(p.after) else ''}{extra}")
    jobs = {j for p in pairs for j in p.jobs}
    print(f"{len(pairs)} pairs, {len(jobs)} variants to compile (+ combine kernels for the decode calls)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="merged.json")
    ap.add_argument("--only", metavar="REGEX", help="the calls whose label matches")
    ap.add_argument("--rounds", type=int, default=7, help="timing rounds (each times every pair once)")
    ap.add_argument("--rep", type=int, default=25, help="do_bench milliseconds of runs per timing")
    ap.add_argument("--jobs", type=int, default=compile_pool.available_cpus(), help="compile processes")
    ap.add_argument("--dry-run", action="store_true", help="print and check the pairs; no GPU")
    ap.add_argument("--before-source", metavar="DIR",
                    help="A/B: each EDGE_LOOP call's variant compiled from DIR's flash_fwd.py / flash_decode.py "
                         "(and at DIR's variants.py tiles) and from aot/")
    args = ap.parse_args(argv)
    if args.before_source:
        folder = str(Path(args.before_source).resolve())
        pairs = ab_pairs(folder, [c for c in AB_CALLS if not args.only or re.search(args.only, c.label)])
    else:
        pairs = make_pairs([c for c in CALLS if not args.only or re.search(args.only, c.label)])
    if args.dry_run:
        return dry_run(pairs)
    if not torch.cuda.is_available():
        print("merged_variants.py times kernels on a CUDA GPU; --dry-run checks the pairs without one",
              file=sys.stderr)
        return 2
    start = time.perf_counter()
    jobs = [j for p in pairs for j in p.jobs] + [(combine_variant(p.after), False, None) for p in pairs
                                                  if p.call.kind == "decode"]
    kernels = compile_all(jobs, ARCH, args.jobs)  # before CUDA starts: the workers are forked
    compile_s = time.perf_counter() - start
    cap = torch.cuda.get_device_capability()
    if 10 * cap[0] + cap[1] != ARCH:
        print(f"this GPU is sm_{cap[0]}{cap[1]}; the pairs are for the sm_{ARCH} build", file=sys.stderr)
        return 1
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, timed_rows, fns = [], [], []
    seed = secrets.randbits(31)
    for i, p in enumerate(pairs):
        row = dict(call=asdict(p.call), seed=seed + i, kind=p.call.kind, before=p.before.name,
                   after=p.after.name, after_edge_loop=V.edge_loop(p.after), before_source=p.before_source)
        rows.append(row)
        try:
            torch.manual_seed(seed + i)
            t = inputs(p, "cuda")
            comb = kernels.get((combine_variant(p.after), False, None))
            sides = [runner(p, j[0], kernels[j], comb, t, sms, j[2]) for j in p.jobs]
            row["check_before"], row["check_after"] = (check(p, fn, t) for fn in sides)
        except Exception as e:  # noqa: BLE001 - a call that cannot run is reported, the others go on
            row["error"] = f"{type(e).__name__}: {e}"[:800]
            print(f"{p.call.label}: {row['error']}", file=sys.stderr, flush=True)
            continue
        if p.call.kind == "decode":
            row["splits"], row["fused"] = decode_plan(p.call, p.after, sms)
        timed_rows.append(row)
        fns.append(sides)
    save(args.out, rows)  # the checks, should the timing not finish
    print(f"checked {len(timed_rows)} of {len(rows)} calls in {time.perf_counter() - start:.0f} s; timing "
          f"{args.rounds} rounds", flush=True)
    times = timed(fns, args.rounds, warmup=5, rep=args.rep)
    print(f"\n{'call':<28} {'before us':>10} {'after us':>10} {'after/before':>12}  {'per round':>11}  check")
    for row, (tb, ta) in zip(timed_rows, times):
        b, a = statistics.median(tb), statistics.median(ta)
        per = sorted(x / y for x, y in zip(ta, tb))
        row.update(before_us=b, after_us=a, ratio=a / b, before_rounds_us=tb, after_rounds_us=ta,
                   ratio_range=[per[0], per[-1]])
        ok = row["check_before"]["ok"] and row["check_after"]["ok"]
        print(f"{row['call']['label']:<28} {b:10.1f} {a:10.1f} {a / b:12.3f}  {per[0]:.3f}-{per[-1]:.3f}  "
              f"{'ok' if ok else 'WRONG'}", flush=True)
    failed = sum(not (r.get("check_before", {}).get("ok") and r.get("check_after", {}).get("ok")) for r in rows)
    ratios = [r["ratio"] for r in timed_rows] or [float("nan")]
    print(f"after/before: median {statistics.median(ratios):.3f}, worst {max(ratios):.3f}; "
          f"{sum(x > 1.03 for x in ratios)} of {len(timed_rows)} calls over 1.03; compile {compile_s:.0f} s, "
          f"total {time.perf_counter() - start:.0f} s" + (f"; {failed} calls WRONG or not run" if failed else ""))
    save(args.out, rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
