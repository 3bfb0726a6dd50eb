"""Tile tuning for aot/variants.py, run on a GPU machine (Triton JIT, torch tensors).

AOT builds cannot autotune at run time, so the tiles in `get_fwd_config` are chosen here:
every candidate (BLOCK_M, BLOCK_N, num_warps, num_stages) is timed with triton.testing.do_bench
(median, warm-up, fresh random inputs) on the benchmark grid's shapes (batch x seqlen = 16k
tokens, hidden 2048), and the best per (dtype, head dim, causal, sequence bucket) is printed and
written as JSON with the GPU, the Triton version and the date. Copy the winners into
aot/variants.py by hand and record the run in docs/perf-notes.md.

    python aot/tune.py [--dtypes fp16,bf16] [--head-dims 64,128] [--seqs 1024,8192] [--out tune.json]
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

from flash_fwd import flash_fwd  # noqa: E402

CANDIDATES = [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s)
              for m, n, w, s in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4))
              if not (m == 64 and w == 8)]
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def launch(q, k, v, y, lse, causal, cfg):
    b, h, s, d = q.shape
    grid = (triton.cdiv(s, cfg["BLOCK_M"]), b * h)
    dummy = torch.empty(1, dtype=torch.int8, device=q.device)
    seqlens = torch.empty(1, dtype=torch.int64, device=q.device)
    flash_fwd[grid](
        q, k, v, y, lse, dummy, seqlens, 1.0 / math.sqrt(d), 0.0,
        h, 1, s, s, d, d, 0, int(causal), -1, -1, s, 0, 1,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *y.stride()[:3], 0, 0, 0,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=d, BLOCK_DV=d, EVEN_D=True,
        MASK_KIND=0, EXTRAS=False, DOT_PRECISION="tf32",
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def save(path, results: list) -> None:
    """The results as JSON with the GPU, the Triton version and the date (also used by
    aot/levers.py and aot/tune_decode.py)."""
    meta = dict(gpu=torch.cuda.get_device_name(), triton=triton.__version__,
                date=datetime.date.today().isoformat())
    Path(path).write_text(json.dumps(dict(meta=meta, results=results), indent=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="fp16")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seqs", default="1024,8192")
    ap.add_argument("--out", default="tune.json")
    args = ap.parse_args(argv)
    results = []
    for dt, d, s in itertools.product(args.dtypes.split(","), map(int, args.head_dims.split(",")),
                                      map(int, args.seqs.split(","))):
        h, b = 2048 // d, max(1, 16384 // s)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=TORCH_DTYPES[dt]) for _ in range(3))
        y = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        for causal in (False, True):
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            timed = []
            for cfg in CANDIDATES:
                try:
                    ms = triton.testing.do_bench(lambda: launch(q, k, v, y, lse, causal, cfg),
                                                 warmup=25, rep=100, return_mode="median")
                except Exception as e:  # out of shared memory, etc.
                    print(f"  skip {cfg}: {type(e).__name__}", file=sys.stderr)
                    continue
                timed.append((flops / ms / 1e9, cfg))
            timed.sort(key=lambda t: -t[0])
            best_tflops, best = timed[0]
            print(f"{dt} d{d} S{s} B{b} H{h} causal={int(causal)}: best {best_tflops:.0f} TFLOP/s {best}; "
                  f"runner-up {timed[1][0]:.0f} {timed[1][1]}")
            results.append(dict(dtype=dt, head_dim=d, seq=s, batch=b, heads=h, causal=causal,
                                best=best, tflops=best_tflops,
                                all=[dict(cfg, tflops=t) for t, cfg in timed]))
    save(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
