"""Tile tuning for the split-KV decode kernel (aot/flash_decode.py), run on a GPU machine.

Each candidate (BLOCK_N, num_warps, num_stages) of `flash_decode_split` (BLOCK_M is the packed
row tile, 16) is JIT-compiled and timed, split + combine, at the number of KV splits
cpp/decode_heuristics.cc would choose for it (`choose_splits`) and at one and two CTAs per SM, on decode
shapes (fp16, Hq 32, Hkv 8, d 128 or --head-dim, Sq 1). Every point is timed from CUDA-graph replays over
rotating input sets (as the decode benchmark times them), its output checked against torch SDPA,
beside torch SDPA (cuDNN) in the same process; the best point's split kernel is timed alone too
(what the combine step costs). --sweep keeps the shipped tile and sweeps the number of splits
instead. Writes JSON with the GPU, the Triton version and the date; copy winners into
aot/variants.py (get_fwd_config, kind "decode") by hand and record the run in docs/perf-notes.md.

--merge times the fused merge against the combine kernel at the shipped tile and the launcher's
splits; --sq sets the query rows (default 1), --fused makes the tile and split sweeps merge in
the split kernel, --nonpad makes them pass nonpad_kv_seqlen (the variant a static cache runs).

    python lab/experiments/tune_decode.py [--shapes 1x4096,1x32768,1x131072,4x32768,8x32768] [--sq N]
        [--head-dim 64|128] [--sweep | --merge | --compare] [--fused] [--nonpad] [--out F]

GroupQueryAttention's decode (GenAI: seqlens_k, so the EXTRAS variant) at d64, where it trails
ONNX Runtime's XQA at B8 from 16k keys: --head-dim 64 --nonpad --sweep --shapes 8x16384,8x32768,8x131072.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import math
import sys
from pathlib import Path

# The sibling scripts and the shipped kernels (aot/) they time.
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

from aot.flash_decode import flash_decode_combine, flash_decode_split, merge_round_trips  # noqa: E402
from tune import save  # noqa: E402

CANDIDATES = [dict(BLOCK_N=n, num_warps=w, num_stages=s)
              for n, w, s in itertools.product((32, 64, 128), (4, 8), (2, 3, 4))]
TILE_CANDIDATES = CANDIDATES + [dict(BLOCK_N=32, num_warps=4, num_stages=6),
                                dict(BLOCK_N=64, num_warps=4, num_stages=5)]
BLOCK_M = 16
MAX_SPLITS, MIN_SPLIT_KEYS, CTA_OVERHEAD_TILES = 128, 128, 4  # cpp/decode_heuristics.h
COMBINE_BLOCK_S = 16  # aot/variants.py, the combine kind's block_n


def choose_splits(groups: int, skv: int, block_n: int, sms: int, head_dim: int) -> int:
    """cpp/decode_heuristics.cc's split count: the fewest splits that minimize waves of
    decode_ctas_per_sm CTAs per SM (two at head dim 64, one above) times (key tiles per CTA +
    CTA_OVERHEAD_TILES), at most one split per 128 keys."""
    sms *= 2 if head_dim <= 64 else 1
    blocks = -(-skv // block_n)
    most = max(1, min(MAX_SPLITS, blocks, skv // MIN_SPLIT_KEYS))
    best, best_cost = 1, None
    for s in range(1, most + 1):
        tiles = -(-blocks // s)
        cost = -(-groups * -(-blocks // tiles) // sms) * (tiles + CTA_OVERHEAD_TILES)
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    return best


@functools.cache
def _shipped_pdl(device) -> int:
    """The AOT build's PDL level for this GPU (aot/build.py decode_pdl), looked up once."""
    from aot.build import decode_pdl
    major, minor = torch.cuda.get_device_capability(device)
    return decode_pdl(10 * major + minor)


def run(q, k, v, y, lse, opart, lpart, splits, cfg, combine=True, seqlens=None, counter=None, pdl=None):
    """Split + combine; `seqlens` (int64 (B,) on the device) takes the EXTRAS variant with
    nonpad_kv_seqlen, as the op runs a static cache; `counter` (int32, zeros, one per row block)
    merges in the split kernel (the fused merge) instead of the combine kernel; `pdl` launches
    the split kernel with programmatic dependent launch at that PDL level (flash_decode_split;
    default: the AOT build's level for this GPU, aot/build.py decode_pdl)."""
    if pdl is None:
        pdl = _shipped_pdl(q.device)
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    dummy = torch.empty(1, dtype=torch.int8, device=q.device)
    lens = seqlens if seqlens is not None else torch.empty(1, dtype=torch.int64, device=q.device)
    fused = counter is not None and splits > 1
    if counter is None:
        counter = torch.empty(1, dtype=torch.int32, device=q.device)
    kern = flash_decode_split[(splits, b * hkv, triton.cdiv(sq * hq // hkv, BLOCK_M))](
        q, k, v, y, lse, dummy, lens, opart, lpart, counter, 1.0 / math.sqrt(d), 0.0,
        hq, hq // hkv, sq, skv, d, d, skv - sq, 1, -1, -1, skv, int(seqlens is not None), 1, splits,
        int(fused),
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *y.stride()[:3], 0, 0, 0,
        BLOCK_M=BLOCK_M, BLOCK_N=cfg["BLOCK_N"], BLOCK_D=d, BLOCK_DV=d, EVEN_D=True,
        MASK_KIND=0, EXTRAS=seqlens is not None, DOT_PRECISION="tf32", PDL=pdl,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], launch_pdl=pdl > 0)
    if splits > 1 and combine and not fused:
        flash_decode_combine[(b * hq * sq,)](opart, lpart, y, lse, hq, sq, d, splits, 1,
                                             *y.stride()[:3], BLOCK_DV=d, BLOCK_S=COMBINE_BLOCK_S,
                                             num_warps=4)
    return kern


def sweep(args) -> int:
    """The tile candidates at the launcher's split count and at one and two CTAs per SM, or with
    --sweep the splits at the shipped tile (see the module docstring)."""
    from aot.variants import Variant, get_fwd_config

    from ort_flash.bench.tensors import rotation_sets
    from ort_flash.bench.timers import cuda_graph_calls, time_calls
    t = get_fwd_config(90, Variant("fp16", args.head_dim, True, "none", False, "tf32", "decode"))
    shipped = dict(BLOCK_N=t.block_n, num_warps=t.num_warps, num_stages=t.num_stages)
    hq, hkv, d, sq = 32, 8, args.head_dim, args.sq
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    stream = torch.cuda.Stream()
    results = []

    def timed(fns):
        calls, per = cuda_graph_calls(fns, stream)
        return time_calls(calls, "cuda", stream=stream, target_s=0.05).ms / per * 1e3  # us

    for shape in args.shapes.split(","):
        b, skv = map(int, shape.split("x"))
        nbytes = 2 * b * hkv * skv * d * 2
        tb = lambda us: nbytes / us / 1e6  # noqa: E731
        sets = []
        for _ in range(rotation_sets(nbytes)):
            q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.float16)
            k, v = (torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.float16) for _ in range(2))
            sets.append((q, k, v, torch.empty_like(q), torch.empty(b, hq, sq, device="cuda")))
        opart = torch.empty(b * hq * sq * MAX_SPLITS * d, device="cuda", dtype=torch.float32)
        lpart = torch.empty(b * hq * sq * MAX_SPLITS, device="cuda", dtype=torch.float32)
        q, k, v, y, lse = sets[0]
        # The kernel runs causal with the queries at the cache's end (bottom-right aligned).
        vis = torch.ones(sq, skv, dtype=torch.bool, device="cuda").tril(skv - sq)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=vis, enable_gqa=True).float()
        groups = b * hkv * triton.cdiv(sq * hq // hkv, BLOCK_M)

        counter = torch.zeros(groups, dtype=torch.int32, device="cuda")

        lens0 = torch.full((b,), skv, dtype=torch.int64, device="cuda") if args.nonpad else None

        def point(splits, cfg, fused=args.fused):
            y.fill_(float("nan"))
            c = counter if fused else None
            run(q, k, v, y, lse, opart, lpart, splits, cfg, counter=c, seqlens=lens0)
            err = float((y.float() - ref).abs().max())
            blocks = -(-skv // cfg["BLOCK_N"])
            tiles = -(-blocks // splits)
            us = timed([lambda s=s_: run(*s, opart, lpart, splits, cfg, counter=c, seqlens=lens0) for s_ in sets])
            assert not counter.any(), "fused merge left a counter non-zero"
            return dict(cfg, splits=splits, tiles=tiles, ctas=groups * -(-blocks // tiles), us=us, max_err=err,
                        fused=fused)

        def rule(cfg):
            return choose_splits(groups, skv, cfg["BLOCK_N"], sms, d)

        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            cudnn_us = timed([lambda s=s_: torch.nn.functional.scaled_dot_product_attention(
                s[0], s[1], s[2], enable_gqa=True) for s_ in sets])
        row = dict(batch=b, cache=skv, hq=hq, hkv=hkv, sq=sq, d=d, sms=sms, cudnn_us=cudnn_us, points=[])
        if args.compare:  # the shipped AOT kernel through the launcher beside its JIT twin
            lens = [torch.full((b,), skv, dtype=torch.int64, device="cuda") for _ in sets]
            splits = rule(shipped)
            out = {}
            three = dict(shipped, num_stages=3)
            for name, cfg, n, nonpad, fuse in (
                    ("jit", shipped, splits, False, False), ("jit_nonpad", shipped, splits, True, False),
                    ("jit_fused", shipped, splits, False, True), ("jit_fused_nonpad", shipped, splits, True, True),
                    ("jit_fused_nonpad_2x", shipped, min(2 * splits, MAX_SPLITS), True, True),
                    ("jit3_fused_nonpad", three, splits, True, True),
                    ("jit_split_only", shipped, splits, True, False)):
                y.fill_(float("nan"))
                run(*sets[0], opart, lpart, n, cfg, seqlens=lens[0] if nonpad else None,
                    counter=counter if fuse else None)
                out[name + "_err"] = float((y.float() - ref).abs().max())
                alone = name == "jit_split_only"
                out[name] = timed([lambda s_=s_, l_=l_, cfg=cfg, n=n, nonpad=nonpad, fuse=fuse, alone=alone: run(
                    *s_, opart, lpart, n, cfg, seqlens=l_ if nonpad else None, counter=counter if fuse else None,
                    combine=not alone) for s_, l_ in zip(sets, lens)])
            assert not counter.any(), "fused merge left a counter non-zero"
            from ort_flash import _C

            def params(s_, lens_):
                p = _C.FlashParams()
                p.dtype = _C.DType.float16
                p.q, p.k, p.v, p.y = (t.data_ptr() for t in s_[:4])
                p.batch, p.hq, p.hkv, p.sq, p.skv, p.d, p.dv = b, hq, hkv, sq, skv, d, d
                p.q_stride, p.y_stride = [hq * sq * d, sq * d, d], [hq * sq * d, sq * d, d]
                p.k_stride = p.v_stride = [hkv * skv * d, skv * d, d]
                p.causal, p.scale = True, d ** -0.5
                if lens_ is None:
                    p.offset = skv - sq
                else:
                    p.seqlens_k = lens_.data_ptr()
                return p
            for name, use in (("aot", False), ("aot_nonpad", True)):
                ps = [params(s_, l_ if use else None) for s_, l_ in zip(sets, lens)]
                row[f"{name}_plan"] = list(_C.launch_plan(ps[0])) + [_C.launch_variant(ps[0])]
                out[name] = timed([lambda p=p: _C.run_cuda(p, torch.cuda.current_stream().cuda_stream) for p in ps])
            row.update(splits=splits, compare=out)
            print(f"B{b} L{skv}: cuDNN {cudnn_us:.1f} us; {splits} splits: "
                  + ", ".join(f"{k} {v:.1f} ({tb(v):.2f} TB/s)" for k, v in out.items() if not k.endswith("_err"))
                  + f"; max err {max(v for k, v in out.items() if k.endswith('_err')):.1e}"
                  + f"; plans {row['aot_plan']} {row['aot_nonpad_plan']}", flush=True)
        elif args.tiles:
            for cfg in args.candidates or TILE_CANDIDATES:
                try:
                    for splits in sorted({rule(cfg), max(1, sms // groups), max(1, 2 * sms // groups)}):
                        row["points"].append(dict(point(splits, cfg), rule=splits == rule(cfg)))
                except Exception as e:  # noqa: BLE001 - out of shared memory, etc.
                    print(f"  skip {cfg}: {type(e).__name__}: {str(e)[:100]}", file=sys.stderr)
        elif args.merge:  # the fused merge against the combine kernel, at the launcher's splits
            splits = rule(shipped)
            for fused in (False, True):
                row["points"].append(dict(point(splits, shipped, fused), rule=True))
            c, f = row["points"]
            print(f"B{b} L{skv} Sq{sq}: cuDNN {cudnn_us:.1f} us; {splits} splits, merge round trips "
                  f"{merge_round_trips(min(BLOCK_M, sq * hq // hkv), splits)}: combine {c['us']:.1f} us "
                  f"({tb(c['us']):.2f} TB/s), fused {f['us']:.1f} ({tb(f['us']):.2f} TB/s)", flush=True)
        else:
            blocks = -(-skv // shipped["BLOCK_N"])
            most = max(1, min(MAX_SPLITS, blocks, skv // MIN_SPLIT_KEYS))
            at_rule, seen = rule(shipped), set()
            for splits in range(1, most + 1):
                tiles = -(-blocks // splits)  # key tiles per CTA; splits past cdiv(blocks, tiles) idle
                if tiles not in seen or splits == at_rule:
                    seen.add(tiles)
                    row["points"].append(dict(point(splits, shipped), rule=splits == at_rule))
        if args.compare or args.merge:  # no best point to pick
            results.append(row)
            save(args.out, results)
            sets.clear()
            continue
        best = min(row["points"], key=lambda r: r["us"])
        shipped_at_rule = next((r for r in row["points"] if r["rule"] and all(r[k] == shipped[k] for k in shipped)),
                               None)
        row.update(best=best, shipped_at_rule=shipped_at_rule,
                   split_only_us=timed([lambda s=s_: run(*s, opart, lpart, best["splits"], best, combine=False)
                                        for s_ in sets]))
        pick = {k: best[k] for k in ("BLOCK_N", "num_warps", "num_stages", "splits", "ctas")}
        ship = (f"shipped tile at the launcher's {shipped_at_rule['splits']} splits {shipped_at_rule['us']:.1f} us "
                f"({cudnn_us / shipped_at_rule['us']:.2f}x); " if shipped_at_rule else "")
        print(f"B{b} L{skv}: cuDNN {cudnn_us:.1f} us ({tb(cudnn_us):.2f} TB/s); {ship}best {best['us']:.1f} us "
              f"({tb(best['us']):.2f} TB/s, {cudnn_us / best['us']:.2f}x cuDNN) {pick}; its split kernel alone "
              f"{row['split_only_us']:.1f} (err {best['max_err']:.1e})", flush=True)
        results.append(row)
        save(args.out, results)
        sets.clear()
        torch.cuda.empty_cache()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x4096,1x32768,1x131072,4x32768,8x32768", help="BxCACHE list")
    ap.add_argument("--out", default="tune-decode.json")
    ap.add_argument("--sweep", action="store_true", help="sweep the splits at the shipped tile instead")
    ap.add_argument("--compare", action="store_true",
                    help="the shipped AOT kernel through the launcher (ort_flash._C) beside its JIT twin")
    ap.add_argument("--merge", action="store_true",
                    help="the fused merge against the combine kernel at the shipped tile and splits")
    ap.add_argument("--sq", type=int, default=1, help="query rows per call (default 1)")
    ap.add_argument("--head-dim", type=int, default=128, choices=(64, 128),
                    help="head dim of the shapes and the shipped decode tile (default 128)")
    ap.add_argument("--fused", action="store_true", help="tile and split sweeps merge in the split kernel")
    ap.add_argument("--nonpad", action="store_true",
                    help="tile, split and merge points pass nonpad_kv_seqlen (the EXTRAS variant, as a static cache runs)")
    ap.add_argument("--candidates", default="",
                    help="tiles to time instead of the full list, BLOCK_NxWARPSxSTAGES comma list (64x4x3,...)")
    args = ap.parse_args(argv)
    args.tiles = not (args.sweep or args.compare or args.merge)
    args.candidates = [dict(zip(("BLOCK_N", "num_warps", "num_stages"), map(int, c.split("x"))))
                       for c in args.candidates.split(",") if c]
    return sweep(args)


if __name__ == "__main__":
    sys.exit(main())
