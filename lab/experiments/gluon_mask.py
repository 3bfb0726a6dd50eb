"""The warp-specialized Gluon kernel (aot/flash_fwd_gluon_ws.py) under a key-vector mask, in JIT on
a GPU machine: correctness against an fp32 reference with NaN-poisoned outputs, then time per call
beside the kernel the library runs for such calls today (flash_fwd's TMA variant with MASK_KEYS at
its shipped tile), the unmasked warp-specialized kernel and torch SDPA with the same mask, in one
run. Prints a table, writes JSON.

    python lab/experiments/gluon_mask.py [--check-only] [--prefix] [--out gluon_mask.json]
        [--d64 "BM,BN,stages,maxnreg,consumers,consumer_regs;..."]

--prefix compiles the kernels as the build does (MASK_PREFIX: the visible-range check) and adds
left-padded and holed masks to the checks and the timing.

A mask is (B, 1, 1, S) (or (B, H, 1, S)) bool or additive; keys from mask_len on are hidden. The
shapes: BERT-base's attention (12 heads of 64, B8 S512, B1 S2048, B1 S4096) and the op benchmark's
grid (16k tokens, hidden 2048) at N 2048-16384, each batch padded to a random length.
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
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from aot import flash_fwd_gluon as fg  # noqa: E402
from aot import flash_fwd_gluon_ws as fws  # noqa: E402
from aot.contract import ordered_args, stride_args  # noqa: E402
from aot.tiles import ws_config, ws_desc_rows  # noqa: E402
from gluon_attn import run_ws, runtime_ints  # noqa: E402
from tune import NO_ROTARY, NULL, _shipped, bench, fwd_values, launch, save  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
KINDS = {"bool": 1, "add": 2}


def run_ws_masked(q, k, v, y, lse, mask, kind, causal=False, offset=0, mask_len=None, cfg=None):
    """One launch of the warp-specialized kernel with a key-vector mask (B, 1 or H, 1, L): `kind`
    "bool" (uint8 0/1) or "add" (the model dtype); mask_len defaults to L."""
    b, hq, sq, d = q.shape
    c = dict(ws_config(str(q.dtype), d, causal, kind), **(cfg or {}))
    lay = fg.desc_layout()
    descs = [TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, r, d], lay)
             for t, r in zip((q, k, v, y), ws_desc_rows(c))]
    tiles = c.get("TILES_PER_CTA", 1)
    grid = (triton.cdiv(sq, c["BLOCK_M"] * tiles), b * hq)
    ml = mask.shape[-1] if mask_len is None else mask_len
    args = fwd_values(q, k, v, y, lse, **dict(zip("QKVY", descs)), Mask=mask, SeqlensK=lse, TileCounter=NULL,
                      offset=offset, causal=int(causal), mask_len=ml, **NO_ROTARY,
                      **stride_args("m", (mask.stride(0), mask.stride(1) if mask.shape[1] > 1 else 0, 0)))
    fws.flash_fwd_gluon_ws[grid](
        *ordered_args("fwd_gluon", args),
        BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_D=d, NUM_STAGES=c["NUM_STAGES"],
        PINGPONG=c["PINGPONG"], NUM_CONSUMERS=c["NUM_CONSUMERS"], CONSUMER_REGS=c["CONSUMER_REGS"],
        TILES_PER_CTA=tiles, MASK_KIND=KINDS[kind], MASK_PREFIX=PREFIX[0] and tiles == 1,
        num_warps=c["num_warps"], maxnreg=c["maxnreg"])


PREFIX = [False]  # --prefix: the kernels run the visible-range check (MASK_PREFIX)


def make_mask(b, hm, skv, kind, dtype, lengths, fill=None, pattern="right"):
    """(B, hm, 1, skv): keys below each batch's length visible ("right" padding: a visible prefix),
    or the last `length` keys ("left"), or every third key hidden within the length ("holes").
    Additive: 0 / `fill` (-inf or the dtype's lowest)."""
    j = torch.arange(skv, device="cuda")
    n = torch.tensor(lengths, device="cuda")[:, None]
    if pattern == "left":
        keep = j[None, :] >= skv - n
    elif pattern == "holes":
        keep = (j[None, :] < n) & (j[None, :] % 3 != 1)
    else:
        keep = j[None, :] < n
    keep = keep[:, None, None, :].expand(b, hm, 1, skv)
    if kind == "bool":
        return keep.to(torch.uint8).contiguous()
    fill = torch.finfo(dtype).min if fill is None else fill
    return torch.where(keep, 0.0, fill).to(dtype).contiguous()


def reference(q, k, v, mask, kind, causal, offset, mask_len):
    """fp32 attention: scores scaled, the mask applied (bool hides, additive adds), keys from
    mask_len on hidden, bottom-right causal; a row that sees nothing gives 0 and lse -inf."""
    group = q.shape[1] // k.shape[1]
    qf, kf, vf = q.float(), k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    s = qf @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])
    skv = k.shape[2]
    m = torch.zeros(mask.shape[0], mask.shape[1], 1, skv, device=q.device)
    ml = min(mask_len, skv)
    if kind == "bool":
        m[..., :ml] = torch.where(mask[..., :ml] != 0, 0.0, float("-inf"))
    else:
        m[..., :ml] = mask[..., :ml].float()
    m[..., ml:] = float("-inf")
    s = s + m
    if causal:
        i = torch.arange(q.shape[2], device=q.device)[:, None]
        jj = torch.arange(skv, device=q.device)[None, :]
        s = s.masked_fill(jj > i + offset, float("-inf"))
    # The max first (as torch.softmax): at a dtype's lowest, logsumexp's log(n) is lost in rounding.
    mx = s.amax(-1, keepdim=True)
    mx = torch.where(torch.isinf(mx), 0.0, mx)
    e = torch.exp(s - mx)
    l = e.sum(-1)
    lse = torch.where(l == 0, float("-inf"), mx.squeeze(-1) + torch.log(l))
    return (e @ vf) / torch.where(l == 0, 1.0, l)[..., None], lse


PATTERNS = ["right"]  # --prefix adds "left" (a visible run from lo > 0: unmasked but under causal)
# and "holes" (no visible run: the masked loop)
# (B, Hq, Hkv, Sq, Skv, causal, offset, per-head mask, mask_len - Skv or None)
CHECKS = [
    (3, 4, 4, 1000, 1000, False, 0, False, None), (2, 4, 2, 333, 777, False, 0, True, None),
    (2, 4, 2, 1000, 1000, True, 0, False, None), (2, 3, 1, 113, 203, True, 90, False, None),
    (2, 2, 2, 600, 900, False, 0, False, -37), (1, 2, 1, 129, 1023, False, 0, False, None),
    (3, 2, 1, 2000, 2000, False, 0, False, None), (2, 2, 2, 300, 171, True, -129, False, None),
]


def check(dtypes, head_dims, cfgs) -> list:
    rows, failed = [], 0
    gen = torch.Generator(device="cuda").manual_seed(torch.seed() % (1 << 31))
    for dt, d, kind, (b, hq, hkv, sq, skv, causal, off, per_head, cut), cfg in itertools.product(
            dtypes, head_dims, KINDS, CHECKS, cfgs):
        if cfg and cfg.get("BLOCK_D", d) != d:
            continue
        c = {key: val for key, val in (cfg or {}).items() if key != "BLOCK_D"} or None
        dtype = DTYPES[dt]
        q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype, generator=gen)
        k, v = (torch.randn(b, hkv, skv, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
        # One batch wholly padded (its rows see nothing), the others at random lengths.
        lengths = [0] + [int(x) for x in torch.randint(1, skv + 1, (b - 1,), generator=gen, device="cuda")]
        fills = (None,) if kind == "bool" else (float("-inf"), None, -5000.0)
        for fill, pattern in itertools.product(fills, PATTERNS):
            if fill == -5000.0 and pattern != "right":
                continue  # a value above HIDDEN_AT: not a visible run, the masked loop runs
            mask = make_mask(b, hq if per_head else 1, skv, kind, dtype, lengths, fill, pattern)
            ml = skv if cut is None else skv + cut
            y = torch.full_like(q, float("nan"))
            lse = torch.full((b, hq, sq), float("nan"), device="cuda")
            run_ws_masked(q, k, v, y, lse, mask, kind, causal, off, ml, c)
            ref, ref_lse = reference(q, k, v, mask, kind, causal, off, ml)
            err = float((y.float() - ref).abs().max())
            fin = torch.isfinite(ref_lse)
            lse_ok = bool(torch.equal(torch.isinf(lse), ~fin)) and bool(((lse[fin] - ref_lse[fin]).abs() <= 1e-2 * ref_lse[fin].abs().clamp(min=1)).all())
            tol = 2e-2 if dt == "fp16" else 4e-2
            ok = err < tol and lse_ok  # NaN compares false
            failed += not ok
            rows.append(dict(dtype=dt, head_dim=d, kind=kind, fill=str(fill), pattern=pattern,
                             prefix=PREFIX[0], shape=[b, hq, hkv, sq, skv],
                             causal=causal, offset=off, per_head=per_head, mask_len=ml, cfg=c, max_err=err,
                             lse_ok=lse_ok, ok=ok))
            if not ok:
                print(f"FAIL {dt} d{d} {kind} fill={fill} {pattern} {(b, hq, hkv, sq, skv, causal, off, per_head, ml)} "
                      f"cfg={c}: err {err:.3g} lse_ok {lse_ok}", flush=True)
    print(f"checks: {len(rows) - failed}/{len(rows)} passed", flush=True)
    return rows


def sdpa(q, k, v, mask_bool):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask_bool)


SHAPES = [  # (label, B, H, S, D)
    ("bert B8 S512", 8, 12, 512, 64), ("bert B1 S2048", 1, 12, 2048, 64), ("bert B1 S4096", 1, 12, 4096, 64),
] + [(f"grid N{s}", max(1, 16384 // s), 2048 // d, s, d) for d in (64, 128) for s in (2048, 4096, 8192, 16384)]


def timing(dtypes, cfgs, save_to=None, checks=()) -> list:
    results = []
    for dt, (label, b, h, s, d) in itertools.product(dtypes, SHAPES):
        dtype = DTYPES[dt]
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
        y = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        lengths = [s - (i * s // (4 * b)) for i in range(b)]  # up to a quarter padded
        flops = 4 * b * h * s * s * d
        row = dict(dtype=dt, label=label, batch=b, heads=h, seq=s, head_dim=d, lengths=lengths)
        add = make_mask(b, 1, s, "add", dtype, lengths)
        boo = make_mask(b, 1, s, "bool", dtype, lengths)
        masks = [("add", add), ("bool", boo)]
        if PREFIX[0]:  # also unpadded (all keys visible: a batch of one), left padding (a visible run
            # from lo > 0) and holes (no visible run: the masked loop)
            masks += [("add_ones", make_mask(b, 1, s, "add", dtype, [s] * b)),
                      ("add_left", make_mask(b, 1, s, "add", dtype, lengths, pattern="left")),
                      ("add_holes", make_mask(b, 1, s, "add", dtype, lengths, pattern="holes"))]
        tile = _shipped(dt, d, "fwd_tma", "add", True)
        row["tma_keys_add"] = flops / bench(lambda: launch(q, k, v, y, lse, False, tile, tma=True, mask=add, mask_keys=True)) / 1e9
        row["ws_none"] = flops / bench(lambda: run_ws(q, k, v, y, lse, False)) / 1e9
        mb = boo.bool()
        try:
            row["sdpa_mask"] = flops / bench(lambda: sdpa(q, k, v, mb)) / 1e9
        except Exception as e:  # a backend that refuses the mask
            row["sdpa_mask"] = float("nan")
            row["sdpa_error"] = str(e)[:200]
        for cfg in cfgs:
            if cfg and cfg.get("BLOCK_D", d) != d:
                continue
            c = {key: val for key, val in (cfg or {}).items() if key != "BLOCK_D"} or None
            tag = "" if not c else "".join(f" {key}={val}" for key, val in c.items() if key in ("BLOCK_M", "BLOCK_N", "NUM_CONSUMERS", "TILES_PER_CTA"))
            for kind, m in masks:
                row[f"ws_{kind}{tag}"] = flops / bench(lambda: run_ws_masked(q, k, v, y, lse, m, kind.split("_")[0], cfg=c)) / 1e9
        best_ws = max(val for key, val in row.items() if key.startswith("ws_") and key != "ws_none")
        print(f"{dt} {label:<14} d{d:<3} ws(mask) {best_ws:4.0f}  tma(keys) {row['tma_keys_add']:4.0f}  "
              f"ws(none) {row['ws_none']:4.0f}  sdpa {row['sdpa_mask']:4.0f}  ws/tma {best_ws / row['tma_keys_add']:.2f}x  "
              + "  ".join(f"[{key[3:]}: {val:.0f}]" for key, val in row.items() if key.startswith("ws_") and key != "ws_none"),
              flush=True)
        results.append(row)
        if save_to:
            save(save_to, results + [dict(kind="checks", checks=checks)])
    return results


def parse_d64(spec: str) -> list:
    out = []
    for part in filter(None, spec.split(";")):
        bm, bn, st, mr, nc, cr = (int(x) for x in part.split(","))
        out.append(dict(BLOCK_D=64, BLOCK_M=bm, BLOCK_N=bn, NUM_STAGES=st, maxnreg=mr, NUM_CONSUMERS=nc,
                        CONSUMER_REGS=cr, PINGPONG=True, num_warps=4))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--d64", default="", help="extra d64 tiles: BM,BN,stages,maxnreg,consumers,consumer_regs;...")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--out", default="gluon_mask.json")
    ap.add_argument("--prefix", action="store_true", help="MASK_PREFIX: the visible-range check")
    a = ap.parse_args(argv)
    if a.prefix:
        PREFIX[0] = True
        PATTERNS[:] = ["right", "left", "holes"]
    dtypes = a.dtypes.split(",")
    # The AOT build's argument binding (one compile per variant, not per shape class).
    runtime_ints()
    # The shipped d128 non-causal tile below 8192 runs two query tiles per CTA.
    cfgs = ([None] if a.prefix else [None, dict(BLOCK_D=128, TILES_PER_CTA=2)]) + parse_d64(a.d64)
    rows = check(dtypes, (64, 128), cfgs)
    save(a.out, [dict(kind="checks", checks=rows)])
    if not a.check_only:
        timing(dtypes, cfgs, a.out, rows)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
