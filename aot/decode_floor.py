"""What a decode grid can read: the floor under the split-KV kernel, measured on a GPU machine.

The split kernel (aot/flash_decode.py) at B1 runs one CTA per SM, each streaming its chunk of
one KV head. This times, on decode shapes (fp16, Hkv 8, d 128, a 16-row Q tile), kernels that do
less than it over the same grid, so the gap between them says what costs what:

- `read`: the CTAs only load their K and V chunks (elementwise, summed), no tensor cores;
- `dots`: the split kernel's loads and both tl.dot calls, no softmax (P = S cast to fp16);
- `dots_tma`: the same with K/V tiles loaded through host tensor descriptors (TMA);
- `split`: the shipped split kernel alone (no combine), and with its combine launch;
- cuDNN SDPA, and a torch copy of the same K/V bytes (read + write), in the same process.

Each at 1, 2 and 4 CTAs per SM's worth of splits and a few tiles. Timed from CUDA-graph replays
over rotating input sets (ort_flash.bench.timers, as the decode benchmark times). Prints a table
and writes JSON; results go to docs/perf-notes.md by hand.

    python aot/decode_floor.py [--shapes 1x4096,1x32768] [--out decode-floor.json]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tune import save  # noqa: E402

HKV, HQ, D, BLOCK_M = 8, 32, 128, 16


@triton.jit
def floor_read(K, V, Out, chunk, S, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    split, hk = tl.program_id(0), tl.program_id(1)
    base = hk.to(tl.int64) * S * BLOCK_D
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for i in range(0, chunk, BLOCK_N):
        start = split * chunk + i
        p = base + (start + offs_n)[:, None].to(tl.int64) * BLOCK_D + offs_d[None, :]
        acc += tl.load(K + p).to(tl.float32) + tl.load(V + p).to(tl.float32)
    tl.store(Out + hk * tl.num_programs(0) + split, tl.sum(tl.sum(acc, 1), 0))


@triton.jit
def floor_dots(Q, K, V, Out, chunk, S, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, TMA: tl.constexpr):
    split, hk = tl.program_id(0), tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = tl.load(Q + (hk * BLOCK_M + offs_m)[:, None] * BLOCK_D + offs_d[None, :])
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    base = hk.to(tl.int64) * S * BLOCK_D
    for i in range(0, chunk, BLOCK_N):
        start = split * chunk + i
        if TMA:
            k = K.load([hk * S + start, 0])
            v = V.load([hk * S + start, 0])
        else:
            p = base + (start + offs_n)[:, None].to(tl.int64) * BLOCK_D + offs_d[None, :]
            k = tl.load(K + p)
            v = tl.load(V + p)
        s = tl.dot(q, tl.trans(k))
        acc = tl.dot(s.to(tl.float16), v, acc)
    o = Out + ((hk * tl.num_programs(0) + split) * BLOCK_M + offs_m)[:, None] * BLOCK_D + offs_d[None, :]
    tl.store(o, acc)


@triton.jit
def floor_attn(Q, K, V, Out, chunk, S, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, REP: tl.constexpr, TMA: tl.constexpr):
    """The online softmax over the chunk, rows = the 16-row Q tile repeated REP times: replica j
    sees the j-th BLOCK_N / REP keys of every tile (a block-diagonal score mask), so with REP 4 the
    dots are 64 rows tall (Hopper's warpgroup MMA, one warp per 16 rows: the row max and sum stay
    inside a warp) at 4x the MMA work; the replicas are merged once at the end."""
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
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if REP > 1:
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(tl.float16), v, acc * alpha[:, None])
        m_i = m_new
    offs_m = tl.arange(0, BLOCK_M)
    if REP > 1:
        m3 = tl.reshape(m_i, [REP, BLOCK_M])
        mm = tl.max(m3, 0)
        w = tl.exp2(m3 - mm[None, :])
        l = tl.sum(tl.reshape(l_i, [REP, BLOCK_M]) * w, 0)
        o = tl.sum(tl.reshape(acc, [REP, BLOCK_M, BLOCK_D]) * w[:, :, None], 0) / l[:, None]
    else:
        o = acc / l_i[:, None]
    dst = Out + ((hk * tl.num_programs(0) + split) * BLOCK_M + offs_m)[:, None] * BLOCK_D + offs_d[None, :]
    tl.store(dst, o)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x4096,1x32768", help="BxCACHE list (B 1 only)")
    ap.add_argument("--out", default="decode-floor.json")
    args = ap.parse_args(argv)

    from triton.tools.tensor_descriptor import TensorDescriptor

    from flash_decode import flash_decode_combine, flash_decode_split
    from ort_flash.bench.tensors import rotation_sets
    from ort_flash.bench.timers import cuda_graph_calls, time_calls
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    stream = torch.cuda.Stream()

    def timed(fns):
        calls, per = cuda_graph_calls(fns, stream)
        return time_calls(calls, "cuda", stream=stream, target_s=0.05).ms / per * 1e3  # us

    results = []
    for shape in args.shapes.split(","):
        b, skv = map(int, shape.split("x"))
        assert b == 1
        nbytes = 2 * HKV * skv * D * 2
        tb = lambda us: nbytes / us / 1e6  # noqa: E731
        sets = []
        for _ in range(rotation_sets(nbytes)):
            q = torch.randn(1, HQ, 1, D, device="cuda", dtype=torch.float16)
            k, v = (torch.randn(1, HKV, skv, D, device="cuda", dtype=torch.float16) for _ in range(2))
            sets.append((q, k, v, torch.empty_like(q), torch.empty(1, HQ, 1, device="cuda")))
        qt = torch.randn(HKV * BLOCK_M, D, device="cuda", dtype=torch.float16)
        out = torch.empty(HKV * 128 * BLOCK_M * D, device="cuda", dtype=torch.float32)
        opart = torch.empty(HQ * 128 * D, device="cuda", dtype=torch.float32)
        lpart = torch.empty(HQ * 128, device="cuda", dtype=torch.float32)
        dummy = torch.empty(1, dtype=torch.int32, device="cuda")
        lens = torch.full((1,), skv, dtype=torch.int64, device="cuda")
        refs = [torch.nn.functional.scaled_dot_product_attention(sets[0][0], sets[0][1], sets[0][2],
                                                                 enable_gqa=True).float()]
        row = dict(batch=b, cache=skv, hkv=HKV, d=D, sms=sms, mbytes=nbytes / 1e6, points=[])

        def add(kind, us, **kw):
            row["points"].append(dict(kind=kind, us=us, tbs=tb(us), **kw))
            print(f"B{b} L{skv} {kind:9s} {kw}: {us:7.2f} us {tb(us):5.2f} TB/s", flush=True)

        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            add("cudnn", timed([lambda s=s: torch.nn.functional.scaled_dot_product_attention(
                s[0], s[1], s[2], enable_gqa=True) for s in sets]))
        dst = [torch.empty_like(sets[0][1]) for _ in range(2)]
        add("copy_rw", timed([lambda s=s: (dst[0].copy_(s[1]), dst[1].copy_(s[2])) for s in sets]))
        add("torch_sum", timed([lambda s=s: (s[1].sum(dtype=torch.float32), s[2].sum(dtype=torch.float32))
                                for s in sets]))
        for splits in (64, 128, 256):
            for bn, w, st in ((64, 4, 3), (128, 8, 3), (128, 4, 2)):
                if skv // splits >= bn:
                    add("read", timed([lambda s=s: floor_read[(splits, HKV)](
                        s[1], s[2], out, skv // splits, skv, BLOCK_N=bn, BLOCK_D=D, num_warps=w, num_stages=st)
                        for s in sets]), splits=splits, bn=bn, warps=w, stages=st)
        for splits in (16, 32):
            chunk = skv // splits
            for bn, w, st in ((64, 4, 3), (128, 8, 3)):
                try:
                    add("read", timed([lambda s=s: floor_read[(splits, HKV)](
                        s[1], s[2], out, chunk, skv, BLOCK_N=bn, BLOCK_D=D, num_warps=w, num_stages=st)
                        for s in sets]), splits=splits, bn=bn, warps=w, stages=st)
                except Exception as e:  # noqa: BLE001 - out of resources
                    print(f"  skip read {bn, w, st}: {type(e).__name__}: {str(e)[:80]}", file=sys.stderr)
            for tma in (False, True):
                for bn, w, st in ((64, 4, 3), (128, 4, 3)):
                    def call(s, bn=bn, w=w, st=st, tma=tma):
                        if tma:
                            kd = TensorDescriptor(s[1].view(-1, D), [HKV * skv, D], [D, 1], [bn, D])
                            vd = TensorDescriptor(s[2].view(-1, D), [HKV * skv, D], [D, 1], [bn, D])
                            return lambda: floor_dots[(splits, HKV)](qt, kd, vd, out, chunk, skv, BLOCK_M=BLOCK_M,
                                                                     BLOCK_N=bn, BLOCK_D=D, TMA=True,
                                                                     num_warps=w, num_stages=st)
                        return lambda: floor_dots[(splits, HKV)](qt, s[1], s[2], out, chunk, skv, BLOCK_M=BLOCK_M,
                                                                 BLOCK_N=bn, BLOCK_D=D, TMA=False,
                                                                 num_warps=w, num_stages=st)
                    try:
                        add("dots_tma" if tma else "dots", timed([call(s) for s in sets]),
                            splits=splits, bn=bn, warps=w, stages=st)
                    except Exception as e:  # noqa: BLE001
                        print(f"  skip dots {bn, w, st, tma}: {type(e).__name__}: {str(e)[:80]}", file=sys.stderr)
            for tma in (False, True):
                for rep, bn, w, st in ((1, 64, 4, 3), (1, 128, 4, 3)):
                    def acall(s, bn=bn, w=w, st=st, tma=tma, rep=rep):
                        kk, vv = s[1], s[2]
                        if tma:
                            kk = TensorDescriptor(s[1].view(-1, D), [HKV * skv, D], [D, 1], [bn, D])
                            vv = TensorDescriptor(s[2].view(-1, D), [HKV * skv, D], [D, 1], [bn, D])
                        return lambda: floor_attn[(splits, HKV)](qt, kk, vv, out, chunk, skv, D ** -0.5,
                                                                 BLOCK_M=BLOCK_M, BLOCK_N=bn, BLOCK_D=D, REP=rep,
                                                                 TMA=tma, num_warps=w, num_stages=st)
                    try:
                        add("attn_tma" if tma else "attn", timed([acall(s) for s in sets]),
                            splits=splits, rep=rep, bn=bn, warps=w, stages=st)
                    except Exception as e:  # noqa: BLE001
                        print(f"  skip attn {rep, bn, w, st, tma}: {type(e).__name__}: {str(e)[:80]}",
                              file=sys.stderr)
            counter = torch.zeros(HKV, dtype=torch.int32, device="cuda")
            for kname, kern, nonpad, bn, w, st, merge, tma in (
                    ("split", flash_decode_split, 0, 64, 4, 4, "", False),
                    ("split", flash_decode_split, 1, 64, 4, 4, "", False),
                    ("split", flash_decode_split, 1, 64, 4, 4, "comb", False),
                    ("split", flash_decode_split, 1, 64, 4, 4, "fused", False),
                    ("split", flash_decode_split, 1, 64, 4, 3, "", False),
                    ("split", flash_decode_split, 1, 128, 4, 3, "", False),
):
                def split_call(s, kern=kern, bn=bn, w=w, st=st, merge=merge, nonpad=nonpad, tma=tma):
                    kk, vv = s[1], s[2]
                    if tma:
                        kk, vv = (TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, bn, D]) for t in s[1:3])

                    def f(merge=merge):
                        kern[(splits, HKV, 1)](
                            s[0], kk, vv, s[3], s[4], dummy, lens, opart, lpart, counter,
                            1.0 / math.sqrt(D), 0.0, HQ, HQ // HKV, 1, skv, D, D, skv - 1, 1, -1, -1, skv,
                            nonpad, 1, splits, int(merge == "fused"), *s[0].stride()[:3], *s[1].stride()[:3],
                            *s[2].stride()[:3], *s[3].stride()[:3], 0, 0, 0, BLOCK_M=BLOCK_M, BLOCK_N=bn,
                            BLOCK_D=D, BLOCK_DV=D, EVEN_D=True, MASK_KIND=0, EXTRAS=bool(nonpad),
                            DOT_PRECISION="tf32", num_warps=w, num_stages=st,
                            **({"TMA": True} if tma else {}))
                        if merge == "comb":
                            flash_decode_combine[(HQ,)](opart, lpart, s[3], s[4], HQ, 1, D, splits, 1,
                                                        *s[3].stride()[:3], BLOCK_DV=D, BLOCK_S=16, num_warps=4)
                    return f
                y0 = sets[0][3]
                y0.fill_(float("nan"))
                f0 = split_call(sets[0])
                if merge == "":
                    f0(merge="comb")
                else:
                    f0()
                err = float((y0.float() - refs[0]).abs().max())
                add(kname + ("+" + merge if merge else "") + ("_tma" if tma else ""),
                    timed([split_call(s) for s in sets]), splits=splits, bn=bn, warps=w, stages=st,
                    nonpad=nonpad, err=err)
            assert not counter.any(), "fused merge left a counter non-zero"
        results.append(row)
        save(args.out, results)
        sets.clear()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
