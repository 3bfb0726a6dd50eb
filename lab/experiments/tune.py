"""Tile tuning for aot/variants.py, run on a GPU machine (Triton JIT, torch tensors).

AOT builds cannot autotune at run time, so the tiles in `get_fwd_config` are chosen here:
every candidate (BLOCK_M, BLOCK_N, num_warps, num_stages) is timed with triton.testing.do_bench
(median, warm-up, fresh random inputs) on the benchmark grid's shapes (batch x seqlen = 16k
tokens, hidden 2048), and the best per (dtype, head dim, causal, sequence bucket) is printed and
written as JSON with the GPU, the Triton version and the date. Copy the winners into
aot/variants.py by hand and record the run in docs/perf-notes.md.

    python lab/experiments/tune.py [--dtypes fp16,bf16] [--head-dims 64,128] [--seqs 1024,8192] [--out tune.json]
                       [--tma] [--masked]

--tma tunes the "fwd_tma" kind instead (Q/K/V/Y as TMA tensor descriptors, sm_90), checks each
candidate's output against torch SDPA, times the shipped pointer kernel beside it, and times the
winner again over the (B, S, H, D) storage of the 3-D layout. --masked times masked calls at the
shipped tiles (full (B, 1, S, S) and key-padding (B, 1, 1, S) masks, with and without the
MASK_KEYS variants) beside torch SDPA with the same masks.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import sys
from pathlib import Path

# The sibling scripts and the shipped kernels (aot/) they time.
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

from aot.contract import ordered_args, stride_args  # noqa: E402
from aot.flash_fwd import flash_fwd  # noqa: E402

CANDIDATES = [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s)
              for m, n, w, s in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4))
              if not (m == 64 and w == 8)]
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


TMA_CANDIDATES = [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s)
                  for m, n, w, s in itertools.product((64, 128), (64, 128), (4, 8), (2, 3, 4))
                  if not (m == 64 and w == 8)]


class NullPointer:
    """A null device pointer for a JIT launch (Triton passes a data_ptr() of 0 as is): a pointer
    argument that means "none", such as the Gluon kernels' TileCounter without a counter."""
    dtype = torch.int64

    @staticmethod
    def data_ptr() -> int:
        return 0


NULL = NullPointer()
# The Gluon kinds' Q rotary (their FwdGluon ABI's), off: Q as it is.
NO_ROTARY = dict(Cos=NULL, Sin=NULL, rotary_half=0, max_position=0)


def fwd_values(q, k, v, y, lse, **named) -> dict:
    """The forward kernels' runtime arguments by name (aot/contract.py's Fwd ABI; ordered_args puts
    them in launch order) for (B, H, S, D) views q, k, v, y (last stride 1) and lse: shapes and
    strides from the tensors, scale 1/sqrt(D), no softcap, offset, causality, window, key lengths
    or mask (its strides 0, mask_len Skv), Lse stored. `named` sets any argument by its name (Q, K,
    V, Y: TMA descriptors in the tensors' place; Mask and SeqlensK have no default; the Gluon
    kinds' TileCounter (their FwdGluon ABI's) has none either)."""
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    values = dict(Q=q, K=k, V=v, Y=y, Lse=lse, scale=1.0 / math.sqrt(d), softcap=0.0, Hq=hq, group=hq // hkv,
                  Sq=sq, Skv=skv, D=d, Dv=v.shape[3], offset=0, causal=0, window_left=-1, window_right=-1,
                  mask_len=skv, has_seqlens=0, store_lse=1, **stride_args("q", q.stride()),
                  **stride_args("k", k.stride()), **stride_args("v", v.stride()), **stride_args("y", y.stride()),
                  **stride_args("m", (0, 0, 0)))
    values.update(named)
    return values


def launch(q, k, v, y, lse, causal, cfg, tma=False, mask=None, mask_keys=False):
    """flash_fwd on (B, H, S, D) views (any strides, last one 1), one launch; `mask` an additive
    (B, 1, S, S) or (B, 1, 1, S) tensor or None; `mask_keys`: the MASK_KEYS variant (a (B, 1, 1, S)
    mask read as one key vector per CTA)."""
    b, h, s, d = q.shape
    grid = (triton.cdiv(s, cfg["BLOCK_M"]), b * h)
    dummy = torch.empty(1, dtype=torch.int8, device=q.device) if mask is None else mask
    ms = (0, 0, 0) if mask is None else (mask.stride(0), 0, mask.stride(2) if mask.shape[2] > 1 else 0)
    seqlens = torch.empty(1, dtype=torch.int64, device=q.device)
    tensors = (q, k, v, y)
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        rows = (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_N"], cfg["BLOCK_M"])
        tensors = [TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, r, d])
                   for t, r in zip(tensors, rows)]
    args = fwd_values(q, k, v, y, lse, **dict(zip("QKVY", tensors)), Mask=dummy, SeqlensK=seqlens,
                      causal=int(causal), **stride_args("m", ms))
    flash_fwd[grid](
        *ordered_args("fwd_tma" if tma else "fwd", args),
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=d, BLOCK_DV=d, EVEN_D=True,
        MASK_KIND=0 if mask is None else 2, EXTRAS=False, DOT_PRECISION="tf32", TMA=tma,
        MASK_KEYS=mask_keys, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def save(path, results: list) -> None:
    """The results as JSON with the GPU, the Triton version and the date (also used by
    lab/experiments/levers.py and lab/experiments/tune_decode.py)."""
    meta = dict(gpu=torch.cuda.get_device_name(), triton=triton.__version__,
                date=datetime.date.today().isoformat())
    Path(path).write_text(json.dumps(dict(meta=meta, results=results), indent=1))


def bench(fn) -> float:
    """Median milliseconds of fn: triton.testing.do_bench, 25 ms of warm-up, 100 ms of runs
    (also used by lab/experiments/levers.py)."""
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def tile_dict(t) -> dict:
    """A variants.TileConfig as the launch keywords `launch` takes (also used by lab/experiments/levers.py)."""
    return dict(BLOCK_M=t.block_m, BLOCK_N=t.block_n, num_warps=t.num_warps, num_stages=t.num_stages)


def _shipped(dt: str, d: int, kind: str, mask: str = "none", mask_keys: bool = False, causal: bool = False,
             skv: int = 0) -> dict:
    from aot.variants import Variant, get_fwd_config, tma_tile
    if kind == "fwd_tma" and mask == "none":
        return tile_dict(tma_tile(d, causal, skv))
    return tile_dict(get_fwd_config(90, Variant(dt, d, True, mask, False, "tf32", kind, mask_keys)))


# Spill-free on sm_90 by the compiler's resource report (cuobjdump -res-usage) for both mask
# forms; the shipped tile of each kind is timed too.
MASKED_CANDIDATES = [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s)
                     for m, n, w, s in ((64, 64, 4, 3), (64, 64, 4, 2), (128, 64, 8, 2), (128, 64, 8, 3))]


def masked(args) -> int:
    """Masked calls, each output checked against torch SDPA first: no mask (the reference
    point), an additive (B, 1, S, S) mask (what the rewriter keeps for padded causal models) and a
    (B, 1, 1, S) key-padding mask (what it emits for BERT-style padding), the latter through the
    full-mask kernel (query stride 0) and through the MASK_KEYS variants (pointer and TMA), at the
    shipped tile and the spill-free candidates, beside torch SDPA with the same masks."""
    results = []
    for dt, d, s in itertools.product(args.dtypes.split(","), map(int, args.head_dims.split(",")),
                                      map(int, args.seqs.split(","))):
        h, b = 2048 // d, max(1, 16384 // s)
        tdt = TORCH_DTYPES[dt]
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=tdt) for _ in range(3))
        full = torch.randn(b, 1, s, s, device="cuda", dtype=tdt)
        keys = torch.zeros(b, 1, 1, s, device="cuda", dtype=tdt)
        for i in range(b):  # right padding: the last 0-25 % of the keys of each row
            keys[i, ..., s - (i * s) // (4 * b):] = float("-inf")
        y = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        flops = 4 * b * h * s * s * d
        sdpa = {}
        for label, mask in (("none", None), ("add (B,1,S,S)", full), ("add (B,1,1,S)", keys)):
            sdpa[label] = flops / bench(
                lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)) / 1e9
        runs = [("none", None, False, False, "none"), ("none", None, True, False, "none"),
                ("add (B,1,S,S)", full, False, False, "add"), ("add (B,1,1,S)", keys, False, False, "add"),
                ("add (B,1,1,S)", keys, False, True, "add"), ("add (B,1,1,S)", keys, True, True, "add")]
        for label, mask, tma, mk, mkind in runs:
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            shipped = _shipped(dt, d, "fwd_tma" if tma else "fwd", mkind, mk, False, s)
            sweep = mk or label == "add (B,1,S,S)"  # the keys mask via the full-mask kernel: as shipped
            cands = [shipped] + ([c for c in MASKED_CANDIDATES if c != shipped] if sweep else [])
            for cfg in cands:
                try:
                    y.fill_(float("nan"))
                    launch(q, k, v, y, lse, False, cfg, tma=tma, mask=mask, mask_keys=mk)
                    err = float((y.float() - ref.float()).abs().max())
                    if not err < 2e-2:
                        print(f"  WRONG {label} {cfg}: max error {err}", file=sys.stderr)
                        continue
                    ms = bench(lambda: launch(q, k, v, y, lse, False, cfg, tma, mask, mk))
                except Exception as e:  # noqa: BLE001 - out of resources
                    print(f"  skip {label} {cfg}: {type(e).__name__}: {str(e)[:100]}", file=sys.stderr)
                    continue
                kind = ("tma" if tma else "pointer") + (" keys" if mk else "")
                row = dict(dtype=dt, head_dim=d, seq=s, batch=b, heads=h, kind=kind, mask=label, cfg=cfg,
                           shipped=cfg == shipped, tflops=flops / ms / 1e9, sdpa_tflops=sdpa[label],
                           max_err=err)
                print(f"{dt} d{d} S{s} B{b} {label:<14} {kind:<12} {tuple(cfg.values())}"
                      f"{'*' if cfg == shipped else ' '} {row['tflops']:4.0f} TFLOP/s; torch SDPA "
                      f"{sdpa[label]:4.0f} (err {err:.1e})", flush=True)
                results.append(row)
        save(args.out, results)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="fp16")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seqs", default="1024,8192")
    ap.add_argument("--out", default="tune.json")
    ap.add_argument("--tma", action="store_true", help="tune the TMA-descriptor kind (sm_90)")
    ap.add_argument("--masked", action="store_true",
                    help="masked calls at the shipped tiles: full and key-padding masks, both kinds")
    args = ap.parse_args(argv)
    if args.masked:
        return masked(args)
    candidates = TMA_CANDIDATES if args.tma else CANDIDATES
    results = []
    for dt, d, s in itertools.product(args.dtypes.split(","), map(int, args.head_dims.split(",")),
                                      map(int, args.seqs.split(","))):
        h, b = 2048 // d, max(1, 16384 // s)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=TORCH_DTYPES[dt]) for _ in range(3))
        y = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        for causal in (False, True):
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal) if args.tma else None
            timed = []
            for cfg in candidates:
                try:
                    if args.tma:  # a wrong answer disqualifies before any timing
                        y.fill_(float("nan"))
                        launch(q, k, v, y, lse, causal, cfg, tma=True)
                        err = float((y.float() - ref.float()).abs().max())
                        if not err < 2e-2:
                            print(f"  WRONG {cfg}: max error {err}", file=sys.stderr)
                            continue
                    ms = bench(lambda: launch(q, k, v, y, lse, causal, cfg, args.tma))
                except Exception as e:  # out of shared memory, etc.
                    print(f"  skip {cfg}: {type(e).__name__}: {str(e)[:100]}", file=sys.stderr)
                    continue
                timed.append((flops / ms / 1e9, cfg))
            timed.sort(key=lambda t: -t[0])
            best_tflops, best = timed[0]
            row = dict(dtype=dt, head_dim=d, seq=s, batch=b, heads=h, causal=causal,
                       best=best, tflops=best_tflops, all=[dict(cfg, tflops=t) for t, cfg in timed])
            extra = ""
            if args.tma:  # the pointer kernel at its shipped tile, and the winner over (B, S, H, D)
                shipped = _shipped(dt, d, "fwd")
                ms = bench(lambda: launch(q, k, v, y, lse, causal, shipped))
                row["pointer_kernel_tflops"] = flops / ms / 1e9
                qs, ks, vs, ys = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, y))
                ys.fill_(float("nan"))
                launch(qs, ks, vs, ys, lse, causal, best, tma=True)
                row["bshd_max_err"] = float((ys.float() - ref.float()).abs().max())
                ms = bench(lambda: launch(qs, ks, vs, ys, lse, causal, best, True))
                row["bshd_tflops"] = flops / ms / 1e9
                extra = (f"; pointer kernel {row['pointer_kernel_tflops']:.0f}; (B,S,H,D) "
                         f"{row['bshd_tflops']:.0f} (err {row['bshd_max_err']:.1e})")
            print(f"{dt} d{d} S{s} B{b} H{h} causal={int(causal)}: best {best_tflops:.0f} TFLOP/s {best}; "
                  f"runner-up {timed[1][0]:.0f} {timed[1][1]}{extra}", flush=True)
            results.append(row)
            save(args.out, results)
    save(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
