"""What a decode grid can read: the floor under the split-KV kernel, measured on a GPU machine.

The split kernel (aot/flash_decode.py) at B1 runs one CTA per SM, each streaming its chunk of
one KV head. This times, on decode shapes (fp16, Hkv 8, d 128, a 16-row Q tile; any batch: the
floor kernels see B * Hkv heads), kernels that do less than it over the same grid, so the gaps
between them say what costs what:

- `read`: the CTAs only load their K and V chunks (elementwise, summed), over grids of 128-2048
  CTAs (at least one per head): what the card reads in one such call; `read_flat`: the same
  over 1-8 CTAs per SM, each an equal share of all heads' rows (no head boundaries);
- `dots`: the split kernel's loads and both tl.dot calls, no softmax (P = S cast to fp16), over
  about 128 and 256 CTAs (at least one per head);
- `attn`: loads, dots and the online softmax, nothing else (no masks, LSE or partials);
  `attn` with rep 4 stacks the Q tile 4 times over a block-diagonal score mask (64-row dots);
- `_tma` twins of dots and attn: K/V tiles through host tensor descriptors (TMA);
- `split`: the shipped split kernel alone, with its combine launch (`+comb`) and with the fused
  merge (`+fused`), at those split counts, checked against torch SDPA; `+pdl1` launched with
  programmatic dependent launch, waiting for the grid before it first thing (the launch and the
  prologue overlap that grid's drain), `+pdl2` also releasing the next one at once (in these
  back-to-back replays the next grid is the same kernel; in a model it is not);
- cuDNN SDPA, a torch copy of the same K/V bytes (read + write) and torch's sum of them.

Timed from CUDA-graph replays over rotating input sets (ort_flash.bench.timers, as the decode
benchmark times). Prints one line per point and writes JSON (docs/measurements/decode/:
decode-floor.json, v5; decode-floor-v7.json, with `read_flat`, the PDL points and B32); the
reading is in docs/perf-notes.md (decode v5 and v7).

    python lab/experiments/decode_floor.py [--shapes 1x4096,1x32768,32x32768] [--out decode-floor.json]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The sibling scripts, the shipped kernels (aot/) and the package (ort_flash.bench.timers).
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tune import save  # noqa: E402

HKV, HQ, D, BLOCK_M = 8, 32, 128, 16


@triton.jit
def floor_read(K, V, Out, chunk, S, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Out[hk, split] = the sum of this CTA's K and V chunk (K, V: (Hkv, S, D) contiguous)."""
    split, hk = tl.program_id(0), tl.program_id(1)
    base = hk.to(tl.int64) * S * BLOCK_D
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for i in range(0, chunk, BLOCK_N):
        p = base + (split * chunk + i + offs_n)[:, None].to(tl.int64) * BLOCK_D + offs_d[None, :]
        acc += tl.load(K + p).to(tl.float32) + tl.load(V + p).to(tl.float32)
    tl.store(Out + hk * tl.num_programs(0) + split, tl.sum(tl.sum(acc, 1), 0))


@triton.jit
def floor_read_flat(K, V, Out, chunk, total, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Out[pid] = the sum of rows [pid * chunk, (pid + 1) * chunk) of K and V viewed as
    (B * Hkv * S, D): every CTA the same number of rows whatever the heads (an equal-work grid)."""
    pid = tl.program_id(0)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    lo = pid.to(tl.int64) * chunk
    hi = tl.minimum(lo + chunk, total)
    for i in range(lo, hi, BLOCK_N):
        p = (i + offs_n)[:, None] * BLOCK_D + offs_d[None, :]
        acc += tl.load(K + p).to(tl.float32) + tl.load(V + p).to(tl.float32)
    tl.store(Out + pid, tl.sum(tl.sum(acc, 1), 0))


@triton.jit
def floor_attn(Q, K, V, Out, chunk, S, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, REP: tl.constexpr, TMA: tl.constexpr, SOFTMAX: tl.constexpr):
    """Out[hk, split] = softmax(Q_hk K_c^T * scale) V_c over this CTA's chunk c (Q: (Hkv * BLOCK_M,
    D); K, V: (Hkv, S, D), or with TMA descriptors over their (Hkv * S, D) view). Without SOFTMAX
    only the dots: sum_c (Q K_c^T as fp16) V_c. REP > 1 stacks the Q tile REP times: replica j
    sees the j-th BLOCK_N / REP keys of every tile (a block-diagonal score mask), so the dots are
    REP * BLOCK_M rows tall (Hopper's warpgroup MMA, each warp's rows' max and sum inside the
    warp) at REP times the MMA work; the replicas are merged once at the end."""
    split, hk = tl.program_id(0), tl.program_id(1)
    R: tl.constexpr = BLOCK_M * REP
    offs_r = tl.arange(0, R)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = tl.load(Q + (hk * BLOCK_M + offs_r % BLOCK_M)[:, None] * BLOCK_D + offs_d[None, :])
    keep = (offs_n[None, :] // (BLOCK_N // REP)) == (offs_r // BLOCK_M)[:, None]
    m_i = tl.full([R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([R], dtype=tl.float32)
    acc = tl.zeros([R, BLOCK_D], dtype=tl.float32)
    base = hk.to(tl.int64) * S * BLOCK_D
    qk_scale = scale * 1.4426950408889634
    for i in range(0, chunk, BLOCK_N):
        start = split * chunk + i
        if TMA:
            k = K.load([hk * S + start, 0])
            v = V.load([hk * S + start, 0])
        else:
            p = base + (start + offs_n)[:, None].to(tl.int64) * BLOCK_D + offs_d[None, :]
            k = tl.load(K + p)
            v = tl.load(V + p)
        if SOFTMAX:
            s = tl.dot(q, tl.trans(k)) * qk_scale
            if REP > 1:
                s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(tl.float16), v, acc * alpha[:, None])
            m_i = m_new
        else:
            acc = tl.dot(tl.dot(q, tl.trans(k)).to(tl.float16), v, acc)
    offs_m = tl.arange(0, BLOCK_M)
    if not SOFTMAX:
        o = acc
    elif REP > 1:
        m3 = tl.reshape(m_i, [REP, BLOCK_M])
        mm = tl.max(m3, 0)
        w = tl.exp2(m3 - mm[None, :])
        l = tl.sum(tl.reshape(l_i, [REP, BLOCK_M]) * w, 0)
        o = tl.sum(tl.reshape(acc, [REP, BLOCK_M, BLOCK_D]) * w[:, :, None], 0) / l[:, None]
    else:
        o = acc / l_i[:, None]
    dst = Out + ((hk * tl.num_programs(0) + split) * BLOCK_M + offs_m)[:, None] * BLOCK_D + offs_d[None, :]
    tl.store(dst, o)


class Shape:
    """One decode shape's timing: its rotating input sets (q, k, v, y, lse; fp16, Hq HQ, Hkv HKV,
    d D, Sq 1), its JSON row and `add`, which times a point from CUDA-graph replays of one callable
    per input set and prints and records it (a tile out of resources is skipped with a line)."""

    def __init__(self, b: int, skv: int, stream, sms: int):
        from ort_flash.bench.tensors import rotation_sets
        self.b, self.skv, self.stream, self.sms = b, skv, stream, sms
        self.nbytes = 2 * b * HKV * skv * D * 2
        self.sets = []
        for _ in range(rotation_sets(self.nbytes)):
            q = torch.randn(b, HQ, 1, D, device="cuda", dtype=torch.float16)
            k, v = (torch.randn(b, HKV, skv, D, device="cuda", dtype=torch.float16) for _ in range(2))
            self.sets.append((q, k, v, torch.empty_like(q), torch.empty(b, HQ, 1, device="cuda")))
        self.row = dict(batch=b, cache=skv, hkv=HKV, d=D, sms=sms, mbytes=self.nbytes / 1e6, points=[])

    def add(self, kind, fns, **kw):
        from ort_flash.bench.timers import cuda_graph_calls, time_calls
        try:
            calls, per = cuda_graph_calls(fns, self.stream)
            us = time_calls(calls, "cuda", stream=self.stream, target_s=0.05).ms / per * 1e3
        except Exception as e:  # noqa: BLE001 - a tile out of resources
            print(f"  skip {kind} {kw}: {type(e).__name__}: {str(e)[:80]}", file=sys.stderr)
            return
        self.row["points"].append(dict(kind=kind, us=us, tbs=self.nbytes / us / 1e6, **kw))
        print(f"B{self.b} L{self.skv} {kind:11s} {kw}: {us:7.2f} us {self.nbytes / us / 1e6:5.2f} TB/s", flush=True)

    def add_cudnn(self):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            self.add("cudnn", [lambda s=s: torch.nn.functional.scaled_dot_product_attention(*s[:3], enable_gqa=True)
                               for s in self.sets])


def each_shape(shapes: str, out: str):
    """A Shape per BxCACHE of the comma-separated `shapes`; after each, every row so far is saved
    to `out` (JSON) and the shape's inputs are freed."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    stream = torch.cuda.Stream()
    results = []
    for spec in shapes.split(","):
        b, skv = map(int, spec.split("x"))
        sh = Shape(b, skv, stream, sms)
        yield sh
        results.append(sh.row)
        save(out, results)
        sh.sets.clear()
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x4096,1x32768", help="BxCACHE list")
    ap.add_argument("--out", default="decode-floor.json")
    args = ap.parse_args(argv)

    from triton.tools.tensor_descriptor import TensorDescriptor

    from tune_decode import run  # the split kernel (+ combine or fused merge) as tune_decode launches it

    for sh in each_shape(args.shapes, args.out):
        b, skv, sets, add = sh.b, sh.skv, sh.sets, sh.add
        heads = b * HKV  # the floor kernels' grid axis 1: K, V as (B * Hkv, S, D)
        read_splits = sorted({max(1, n // heads) for n in (128, 256, 512, 1024, 2048)})
        attn_splits = sorted({max(1, n // heads) for n in (128, 256)})
        qt = torch.randn(heads * BLOCK_M, D, device="cuda", dtype=torch.float16)
        out = torch.empty(heads * max(max(read_splits), max(attn_splits) * BLOCK_M * D), device="cuda",
                          dtype=torch.float32)
        opart = torch.empty(b * HQ * max(attn_splits) * D, device="cuda", dtype=torch.float32)
        lpart = torch.empty(b * HQ * max(attn_splits), device="cuda", dtype=torch.float32)
        counter = torch.zeros(heads, dtype=torch.int32, device="cuda")
        lens = torch.full((b,), skv, dtype=torch.int64, device="cuda")
        ref = torch.nn.functional.scaled_dot_product_attention(*sets[0][:3], enable_gqa=True).float()
        print(f"B{b} L{skv}: read splits {read_splits}, attn/split splits {attn_splits}", flush=True)

        sh.add_cudnn()
        dst = [torch.empty_like(sets[0][1]) for _ in range(2)]
        add("copy_rw", [lambda s=s: (dst[0].copy_(s[1]), dst[1].copy_(s[2])) for s in sets])
        add("torch_sum", [lambda s=s: (s[1].sum(dtype=torch.float32), s[2].sum(dtype=torch.float32)) for s in sets])
        for splits in read_splits:
            chunk = skv // splits
            for bn, w, st in ((64, 4, 3), (128, 8, 3), (128, 4, 2)):
                if chunk >= bn:
                    add("read", [lambda s=s, bn=bn, w=w, st=st, c=chunk, n=splits: floor_read[(n, heads)](
                        s[1], s[2], out, c, skv, BLOCK_N=bn, BLOCK_D=D, num_warps=w, num_stages=st)
                        for s in sets], splits=splits, bn=bn, warps=w, stages=st)
        total = heads * skv
        for per_sm in (1, 2, 4, 8):
            n = per_sm * sh.sms
            for bn, w, st in ((64, 4, 3), (128, 8, 3)):
                chunk = -(-(-(-total // n)) // bn) * bn
                add("read_flat", [lambda s=s, bn=bn, w=w, st=st, c=chunk, n=n: floor_read_flat[(n,)](
                    s[1], s[2], out, c, total, BLOCK_N=bn, BLOCK_D=D, num_warps=w, num_stages=st)
                    for s in sets], ctas=n, bn=bn, warps=w, stages=st)
        for splits in attn_splits:
            chunk = skv // splits

            def floor(s, bn, w, st, tma, rep, softmax, n=splits, c=chunk):
                kk, vv = s[1], s[2]
                if tma:
                    kk, vv = (TensorDescriptor(t.view(-1, D), [heads * skv, D], [D, 1], [bn, D]) for t in s[1:3])
                return lambda: floor_attn[(n, heads)](qt, kk, vv, out, c, skv, D ** -0.5, BLOCK_M=BLOCK_M,
                                                    BLOCK_N=bn, BLOCK_D=D, REP=rep, TMA=tma, SOFTMAX=softmax,
                                                    num_warps=w, num_stages=st)
            for tma in (False, True):
                for softmax, rep, bn, w, st in ((False, 1, 64, 4, 3), (False, 1, 128, 4, 3), (True, 1, 64, 4, 3),
                                                (True, 1, 128, 4, 3), (True, 4, 64, 4, 3)):
                    add(("attn" if softmax else "dots") + ("_tma" if tma else ""),
                        [floor(s, bn, w, st, tma, rep, softmax) for s in sets],
                        splits=splits, rep=rep, bn=bn, warps=w, stages=st)

            def split_call(s, bn, w, st, merge, nonpad, n=splits):
                cfg = dict(BLOCK_N=bn, num_warps=w, num_stages=st)
                fused = merge.startswith("fused")
                pdl = int(merge[-1]) if "pdl" in merge else 0
                return lambda: run(*s, opart, lpart, n, cfg, combine=merge.startswith("comb"),
                                   seqlens=lens if nonpad else None, counter=counter if fused else None, pdl=pdl)
            for nonpad, bn, w, st, merge in ((0, 64, 4, 4, ""), (1, 64, 4, 4, ""), (1, 64, 4, 4, "comb"),
                                             (1, 64, 4, 4, "fused"), (1, 64, 4, 4, "fused+pdl1"),
                                             (1, 64, 4, 4, "fused+pdl2"), (1, 64, 4, 3, ""),
                                             (1, 64, 4, 3, "pdl1"), (1, 64, 4, 3, "pdl2"), (1, 128, 4, 3, "")):
                y0 = sets[0][3]
                y0.fill_(float("nan"))  # poisoned: every element must be written
                # Checked merged (with its PDL level): the split kernel alone leaves partials.
                pdl = [x for x in merge.split("+") if "pdl" in x]
                check = merge if merge.startswith("fused") else "+".join(["comb"] + pdl)
                split_call(sets[0], bn, w, st, check, nonpad)()
                err = float((y0.float() - ref).abs().max())
                add("split" + ("+" + merge if merge else ""), [split_call(s, bn, w, st, merge, nonpad) for s in sets],
                    splits=splits, bn=bn, warps=w, stages=st, nonpad=nonpad, err=err)
            assert not counter.any(), "the fused merge left a counter non-zero"
    return 0


if __name__ == "__main__":
    sys.exit(main())
