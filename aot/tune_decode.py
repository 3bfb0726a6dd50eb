"""Tile tuning for the split-KV decode kernel (aot/flash_decode.py), run on a GPU machine.

Each candidate (BLOCK_N, num_warps, num_stages) of `flash_decode_split` (BLOCK_M is the packed
row tile, 16) is JIT-compiled, its occupancy taken from the compiled kernel (shared memory and
registers per CTA), the number of KV splits chosen as cpp/cuda_launch.cc does (the fewest splits
within 85% of the best wave efficiency), and split + combine timed with triton.testing.do_bench
(median, warm-up) on decode shapes (fp16, Hq 32, Hkv 8, d 128, Sq 1). Reports the effective KV
read bandwidth and writes JSON with the GPU, the Triton version and the date; copy winners into
aot/variants.py (get_fwd_config, kind "decode") by hand and record the run in docs/perf-notes.md.

    python aot/tune_decode.py [--shapes 1x4096,1x32768,8x131072,32x32768] [--out tune-decode.json]
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

from flash_decode import flash_decode_combine, flash_decode_split  # noqa: E402
from tune import save  # noqa: E402

CANDIDATES = [dict(BLOCK_N=n, num_warps=w, num_stages=s)
              for n, w, s in itertools.product((32, 64, 128), (4, 8), (2, 3, 4))]
BLOCK_M = 16
MAX_SPLITS, MIN_SPLIT_KEYS = 128, 128  # cpp/cuda_launch.cc


def blocks_per_sm(kernel, num_warps: int) -> int:
    props = torch.cuda.get_device_properties(0)
    smem = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    regs = getattr(props, "regs_per_multiprocessor", 65536)
    by_smem = smem // (kernel.metadata.shared + 1024) if kernel.metadata.shared else 32
    by_regs = regs // max(1, kernel.n_regs * 32 * num_warps)
    return max(1, min(by_smem, by_regs, 32))


def choose_splits(ctas: int, skv: int, block_n: int, slots: int) -> int:
    most = max(1, min(MAX_SPLITS, -(-skv // block_n), skv // MIN_SPLIT_KEYS))

    def eff(s):
        waves = ctas * s / slots
        return waves / math.ceil(waves)

    best = max(eff(s) for s in range(1, most + 1))
    s = 1
    while s < most and eff(s) < 0.85 * best:
        s += 1
    return s


def run(q, k, v, y, lse, opart, lpart, splits, cfg):
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    dummy = torch.empty(1, dtype=torch.int8, device=q.device)
    seqlens = torch.empty(1, dtype=torch.int64, device=q.device)
    kern = flash_decode_split[(splits, b * hkv, triton.cdiv(sq * hq // hkv, BLOCK_M))](
        q, k, v, y, lse, dummy, seqlens, opart, lpart, 1.0 / math.sqrt(d), 0.0,
        hq, hq // hkv, sq, skv, d, d, skv - sq, 1, -1, -1, skv, 0, 1, splits,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *y.stride()[:3], 0, 0, 0,
        BLOCK_M=BLOCK_M, BLOCK_N=cfg["BLOCK_N"], BLOCK_D=d, BLOCK_DV=d, EVEN_D=True,
        MASK_KIND=0, EXTRAS=False, DOT_PRECISION="tf32",
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if splits > 1:
        flash_decode_combine[(b * hq * sq,)](opart, lpart, y, lse, hq, sq, d, splits, 1,
                                             *y.stride()[:3], BLOCK_DV=d, BLOCK_S=16, num_warps=4)
    return kern


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x4096,1x32768,8x131072,32x32768", help="BxCACHE list")
    ap.add_argument("--out", default="tune-decode.json")
    args = ap.parse_args(argv)
    hq, hkv, d, sq = 32, 8, 128, 1
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for shape in args.shapes.split(","):
        b, skv = map(int, shape.split("x"))
        q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.float16) for _ in range(2))
        y = torch.empty_like(q)
        lse = torch.empty(b, hq, sq, device="cuda", dtype=torch.float32)
        opart = torch.empty(b * hq * sq * MAX_SPLITS * d, device="cuda", dtype=torch.float32)
        lpart = torch.empty(b * hq * sq * MAX_SPLITS, device="cuda", dtype=torch.float32)
        nbytes = 2 * b * hkv * skv * d * 2
        timed = []
        for cfg in CANDIDATES:
            try:
                kern = run(q, k, v, y, lse, opart, lpart, 1, cfg)
                slots = blocks_per_sm(kern, cfg["num_warps"]) * sms
                ctas = b * hkv * triton.cdiv(sq * hq // hkv, BLOCK_M)
                splits = choose_splits(ctas, skv, cfg["BLOCK_N"], slots)
                ms = triton.testing.do_bench(lambda: run(q, k, v, y, lse, opart, lpart, splits, cfg),
                                             warmup=25, rep=100, return_mode="median")
            except Exception as e:  # out of shared memory, etc.
                print(f"  skip {cfg}: {type(e).__name__}: {str(e)[:100]}", file=sys.stderr)
                continue
            timed.append(dict(cfg, splits=splits, slots=slots, tbps=nbytes / ms / 1e9))
        timed.sort(key=lambda t: -t["tbps"])
        print(f"B{b} cache {skv}: best {timed[0]['tbps']:.2f} TB/s {timed[0]}; "
              f"runner-up {timed[1]['tbps']:.2f} {timed[1]}", flush=True)
        results.append(dict(batch=b, cache=skv, hq=hq, hkv=hkv, d=d, all=timed))
        save(args.out, results)  # after each shape: a timeout keeps what was measured
    return 0


if __name__ == "__main__":
    sys.exit(main())
