"""An equal-work decode grid with the attention in it: does it close the last percent?

NOT YET RUN ON A GPU (written 2026-12-01 in a session with no device time left); the kernel's
tile schedule and merge are checked on the CPU (tests/test_kernel_interpreter.py, Triton's
interpreter). perf-notes "Where decode stops (v7)" says why this is the experiment to run next.

lab/experiments/decode_floor.py found that a read over an equal-work grid (`read_flat`: every CTA the same
number of K/V rows whatever the heads) reads faster than any per-head split grid, and that at
B16/B32 cuDNN sits within 0.5 % of that read while the split kernel and even the minimal
attention loop (`attn`) are 1-2 % behind. This measures the attention itself over such a grid:

- `attn_flat`: CTA c takes key tiles [c * per_cta, (c + 1) * per_cta) of the flattened (KV head,
  key tile) space in one loop (so the software pipeline runs across head boundaries), the Q
  rows of the tile's head loaded with each K/V tile (they change at a head boundary; an L2 hit
  otherwise), the online softmax reset at a head's first tile and the head's partial (O / l,
  LSE) stored at its last tile or the CTA's last; checked against a float64 reference after
  merging the partials on the host;
- beside it, same process and inputs: cuDNN SDPA, `floor_attn` (decode_floor.py's minimal
  per-head split grid) and the shipped split kernel with its fused merge (tune_decode.run) at
  the launcher's split count.

Timed from CUDA-graph replays over rotating input sets (as decode_floor.py). Prints a line per
point and writes JSON.

    python lab/experiments/decode_flat.py [--shapes 1x32768,16x65536,32x16384,32x32768] [--out decode-flat.json]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The sibling scripts, the shipped kernels (aot/) and the package (ort_flash.bench.timers).
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

HKV, HQ, D, BLOCK_M = 8, 32, 128, 16
GROUP = HQ // HKV


@triton.jit
def floor_attn_flat(Q, K, V, OPart, LPart, per_cta, total, nb, S, scale, max_parts,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    GROUP: tl.constexpr):
    """Q: (heads * GROUP, D), head hk's query rows at hk * GROUP; K, V: (heads, S, D) with
    S = nb * BLOCK_N; `total` = heads * nb key tiles. The partial of (head hk, part j) lands at
    rows (hk * max_parts + j) * GROUP of OPart (O / l, fp32) and LPart (natural-log LSE), j = this
    CTA minus the head's first CTA."""
    pid = tl.program_id(0)
    t_lo = pid * per_cta
    t_hi = tl.minimum(t_lo + per_cta, total)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < GROUP
    qk_scale = scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for t in tl.range(t_lo, t_hi):
        hk = t // nb
        j = t - hk * nb
        first = (j == 0) | (t == t_lo)
        q = tl.load(Q + (hk * GROUP + offs_m)[:, None] * BLOCK_D + offs_d[None, :], mask=row_ok[:, None],
                    other=0.0)
        p = (hk.to(tl.int64) * S + j * BLOCK_N + offs_n)[:, None] * BLOCK_D + offs_d[None, :]
        k = tl.load(K + p)
        v = tl.load(V + p)
        m_i = tl.where(first, float("-inf"), m_i)
        l_i = tl.where(first, 0.0, l_i)
        acc = tl.where(first, 0.0, acc)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        pr = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(pr, 1)
        acc = tl.dot(pr.to(tl.float16), v, acc * alpha[:, None])
        m_i = m_new
        if (j == nb - 1) | (t == t_hi - 1):
            part = hk * max_parts + (pid - (hk * nb) // per_cta)
            rows = part * GROUP + offs_m
            tl.store(OPart + rows[:, None] * BLOCK_D + offs_d[None, :], acc / l_i[:, None], mask=row_ok[:, None])
            tl.store(LPart + rows, (m_i + tl.log2(l_i)) * 0.6931471805599453, mask=row_ok)


def flat_grid(heads: int, nb: int, ctas_wanted: int) -> tuple[int, int, int]:
    """(CTAs, key tiles per CTA, partial slots per head) of the equal-work grid of about
    `ctas_wanted` CTAs over heads * nb key tiles."""
    total = heads * nb
    per_cta = -(-total // ctas_wanted)
    return -(-total // per_cta), per_cta, -(-nb // per_cta) + 1


def merge_flat(opart, lpart, heads: int, max_parts: int, group: int, d: int):
    """The softmax merge of each head's partials (float64, torch); unwritten slots hold LSE -inf."""
    import torch
    lp = lpart.view(heads, max_parts, group).double()
    op = opart.view(heads, max_parts, group, d).double()
    w = torch.where(torch.isfinite(lp), torch.exp(lp - lp.amax(1, keepdim=True)), torch.zeros_like(lp))
    return (torch.nan_to_num(op) * w[..., None]).sum(1) / w.sum(1)[..., None]


def main(argv=None) -> int:
    import torch

    from decode_floor import each_shape, floor_attn
    from tune_decode import BLOCK_M as SPLIT_BLOCK_M, choose_splits, run

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x32768,16x65536,32x16384,32x32768", help="BxCACHE list")
    ap.add_argument("--out", default="decode-flat.json")
    args = ap.parse_args(argv)
    for sh in each_shape(args.shapes, args.out):
        b, skv, sets, add, sms = sh.b, sh.skv, sh.sets, sh.add, sh.sms
        heads = b * HKV
        sh.add_cudnn()

        # attn_flat over (B, Hq, 1, D) Q (= (heads * GROUP, D)) and (B, Hkv, S, D) K/V (= (heads, S, D)).
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(t.double() for t in sets[0][:3]), enable_gqa=True).reshape(heads, GROUP, D)
        for bn, w, st, per_sm in ((64, 4, 3, 1), (64, 4, 3, 2), (64, 4, 4, 1), (64, 4, 4, 2), (128, 4, 3, 1),
                                  (128, 8, 3, 1), (128, 4, 2, 2), (32, 4, 4, 2), (32, 4, 6, 1), (64, 8, 3, 2)):
            nb = skv // bn
            ctas, per_cta, max_parts = flat_grid(heads, nb, per_sm * sms)
            opart = torch.full((heads * max_parts * GROUP, D), float("nan"), device="cuda")
            lpart = torch.full((heads * max_parts * GROUP,), float("-inf"), device="cuda")

            def call(s, bn=bn, w=w, st=st, nb=nb, ctas=ctas, per_cta=per_cta, mp=max_parts, op=opart, lp=lpart):
                return lambda: floor_attn_flat[(ctas,)](
                    s[0], s[1], s[2], op, lp, per_cta, heads * nb, nb, skv, D ** -0.5, mp,
                    BLOCK_M=BLOCK_M, BLOCK_N=bn, BLOCK_D=D, GROUP=GROUP, num_warps=w, num_stages=st)
            try:
                call(sets[0])()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                print(f"  skip attn_flat bn{bn} w{w} s{st}: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
                continue
            err = float((merge_flat(opart, lpart, heads, max_parts, GROUP, D) - ref).abs().max())
            add("attn_flat", [call(s) for s in sets], bn=bn, warps=w, stages=st, ctas=ctas, per_cta=per_cta,
                err=err)

        # The minimal per-head split grid (decode_floor.py's attn) at about 128 and 256 CTAs.
        qt = torch.randn(heads * BLOCK_M, D, device="cuda", dtype=torch.float16)
        for n in sorted({max(1, c // heads) for c in (128, 256)}):
            out = torch.empty(heads * n * BLOCK_M * D, device="cuda", dtype=torch.float32)
            for bn, w, st in ((64, 4, 3), (128, 4, 3)):
                add("attn", [lambda s=s, bn=bn, w=w, st=st, n=n, out=out: floor_attn[(n, heads)](
                    qt, s[1], s[2], out, skv // n, skv, D ** -0.5, BLOCK_M=BLOCK_M, BLOCK_N=bn, BLOCK_D=D,
                    REP=1, TMA=False, SOFTMAX=True, num_warps=w, num_stages=st) for s in sets],
                    splits=n, bn=bn, warps=w, stages=st)

        # The shipped split kernel with the fused merge, at the launcher's split count for its tile.
        lens = torch.full((b,), skv, dtype=torch.int64, device="cuda")
        for bn, w, st in ((64, 4, 4), (64, 4, 3), (128, 4, 3)):
            splits = choose_splits(b * HKV * triton.cdiv(GROUP, SPLIT_BLOCK_M), skv, bn, sms, D)
            opart = torch.empty(b * HQ * splits * D, device="cuda", dtype=torch.float32)
            lpart = torch.empty(b * HQ * splits, device="cuda", dtype=torch.float32)
            counter = torch.zeros(b * HKV, dtype=torch.int32, device="cuda")
            cfg = dict(BLOCK_N=bn, num_warps=w, num_stages=st)
            add("split+fused", [lambda s=s, o=opart, lp=lpart, n=splits, c=counter, cfg=cfg: run(
                *s, o, lp, n, cfg, seqlens=lens, counter=c) for s in sets],
                bn=bn, warps=w, stages=st, splits=splits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
