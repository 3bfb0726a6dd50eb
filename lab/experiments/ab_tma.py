"""A/B of the sm_90 TMA-descriptor kernels against the pointer kernels they replace, through the
built library (ort_flash._C.run_cuda, the launcher ONNX Runtime uses) on the GPU machine.

ORT_FLASH_TMA is read once per process, so this runs itself twice (ORT_FLASH_TMA=0 and unset)
and prints, per shape, each side's median time (triton.testing.do_bench, fresh inputs per
shape), TFLOP/s and the ratio. Shapes cover what models send: the benchmark grid's unmasked and
causal prefill, and the masked forms the rewriter emits (additive (B,1,S,S) and (B,1,1,S), bool).

    python lab/experiments/ab_tma.py [--out ab-tma.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

SHAPES = [  # b, h, s, d, causal, mask: None | "add_bss" | "add_b1s" | "bool_bss"
    (2, 16, 8192, 128, False, None), (2, 16, 8192, 128, True, None),
    (16, 16, 1024, 128, False, None), (16, 16, 1024, 128, True, None),
    (2, 32, 8192, 64, False, None), (2, 32, 8192, 64, True, None),
    (16, 32, 1024, 64, True, None),
    (8, 2, 2048, 64, False, "add_bss"), (8, 12, 2048, 64, False, "add_bss"),
    (8, 12, 2048, 64, True, "add_b1s"), (4, 16, 4096, 128, True, "add_b1s"),
    (4, 16, 2048, 128, False, "bool_bss"),
]


def measure() -> list[dict]:
    import torch
    import triton.testing

    from ort_flash import _C
    dev = torch.device("cuda")
    rows = []
    for b, h, s, d, causal, mask in SHAPES:
        q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.float16) for _ in range(3))
        y = torch.empty_like(q)
        p = _C.FlashParams()
        p.dtype = _C.DType.float16
        p.q, p.k, p.v, p.y = q.data_ptr(), k.data_ptr(), v.data_ptr(), y.data_ptr()
        p.batch, p.hq, p.hkv, p.sq, p.skv, p.d, p.dv = b, h, h, s, s, d, d
        p.q_stride, p.k_stride, p.v_stride, p.y_stride = (list(t.stride()[:3]) for t in (q, k, v, y))
        p.scale = 1 / math.sqrt(d)
        p.causal = causal
        m = None
        if mask == "add_bss":
            m = torch.randn(b, 1, s, s, device=dev, dtype=torch.float16)
        elif mask == "add_b1s":
            m = torch.zeros(b, 1, 1, s, device=dev, dtype=torch.float16)
            m[:, :, :, : s // 8] = float("-inf")
        elif mask == "bool_bss":
            m = torch.rand(b, 1, s, s, device=dev) > 0.2
        if m is not None:
            p.mask_kind = _C.MaskKind.bool if m.dtype == torch.bool else _C.MaskKind.add
            p.mask = m.data_ptr()
            p.mask_stride = [0 if m.shape[i] == 1 else m.stride(i) for i in range(3)] + [1]
            p.mask_len = s
        stream = torch.cuda.current_stream().cuda_stream
        kind = _C.launch_plan(p)[0]
        ms = triton.testing.do_bench(lambda: _C.run_cuda(p, stream), warmup=25, rep=100, return_mode="median")
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        rows.append(dict(b=b, h=h, s=s, d=d, causal=causal, mask=mask, kind=kind, ms=ms, tflops=flops / ms / 1e9))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="ab-tma.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure()))
        return 0
    sides = {}
    for name, value in (("pointer", "0"), ("tma", None)):
        env = {k: v for k, v in os.environ.items() if k != "ORT_FLASH_TMA"}
        if value is not None:
            env["ORT_FLASH_TMA"] = value
        r = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr[-3000:], file=sys.stderr)
            return 1
        sides[name] = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"{'shape':44s} {'pointer':>16s} {'tma':>16s}  tma/pointer")
    out = []
    for a, t in zip(sides["pointer"], sides["tma"]):
        shape = f"B{a['b']} H{a['h']} S{a['s']} d{a['d']}{' causal' if a['causal'] else ''} {a['mask'] or ''}"
        print(f"{shape:44s} {a['tflops']:7.0f} ({a['kind']:7s}) {t['tflops']:7.0f} ({t['kind']:7s})  "
              f"{a['ms'] / t['ms']:.2f}x")
        out.append(dict(pointer=a, tma=t, speedup=a["ms"] / t["ms"]))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
