"""The error an FP8 (e4m3) attention forward would make, emulated on the CPU before any kernel is
written: which quantization scheme meets the FP8 goal's RMSE on FlashAttention-3's outlier inputs.

Inputs as FlashAttention-3's paper measures its FP8 error: Q, K, V with N(0, 1) entries, 0.1 % of
them drawn from N(0, 10) instead. Per (head, length): the output's RMSE against a float64
reference, for

- ``fp16``: Q, K, V rounded to float16, float32 accumulation (the fp16 kernels' floor);
- ``fp8-tensor``: one scale per tensor (max |x| / 448), Q·Kᵀ on e4m3 values, P (the softmax
  numerator, in [0, 1]) and V in e4m3 for P·V, float32 accumulation;
- ``fp8-block``: one scale per block of BLOCK rows of Q, K and V (the tiles a kernel loads);
- ``fp8-block-hadamard``: fp8-block after Q and K are both multiplied by one random orthogonal
  matrix (a Hadamard matrix times random signs: Q·Kᵀ is unchanged in exact arithmetic, the
  outliers are spread over the head dimension before rounding: "incoherent processing");
- ``fp8-block-hadamard-smooth``: and K less its mean over keys (which softmax cannot see: every
  score of a row moves by the same amount);
- ``fp8-qk-block-hadamard``: Q·Kᵀ as fp8-block-hadamard, P·V in float16 (half the GEMMs in FP8:
  which of the two products carries the error);
- ``fp8-pv-block``: Q·Kᵀ in float16, P·V as fp8-block (the other half);
- ``fp8-token-hadamard``: fp8-block-hadamard with one scale per row of Q and of K (per token: a
  kernel multiplies the score tile by the outer product of the two scale vectors), V per block.

P is quantized as the kernel would hold it: exp(s - m) with m the row's maximum, in [0, 1], by a
fixed scale of 448 (so its largest values use e4m3's range; the normalization divides by the sum
of the unquantized P in float32).

  python lab/experiments/fp8_error.py --head-dims 64 128 --seqlens 512 2048 --out fp8-error.json

No GPU; numpy and ml_dtypes. This is a prediction for the kernel design (docs/perf-notes.md),
not a measurement of a kernel.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

E4M3_MAX = 448.0
SCHEMES = ("fp16", "fp8-tensor", "fp8-block", "fp8-block-hadamard", "fp8-block-hadamard-smooth",
           "fp8-qk-block-hadamard", "fp8-pv-block", "fp8-token-hadamard")


def outlier_inputs(rng: np.random.Generator, shape, frac: float = 1e-3) -> np.ndarray:
    """N(0, 1) entries of `shape`, a fraction ``frac`` of them N(0, 10) instead."""
    x = rng.standard_normal(shape)
    hit = rng.random(shape) < frac
    x[hit] = 10.0 * rng.standard_normal(int(hit.sum()))
    return x


def e4m3(x: np.ndarray) -> np.ndarray:
    """x rounded to float8 e4m3 (finite, saturating at ±448) and back to float64."""
    import ml_dtypes

    return np.clip(x, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


def quantize(x: np.ndarray, block: int | None) -> np.ndarray:
    """x (n, d) through e4m3 with one scale per tensor (block None) or per block of rows, and
    back (the dequantized values the fp32 accumulation sees)."""
    if block is None:
        s = max(np.abs(x).max(), 1e-30) / E4M3_MAX
        return e4m3(x / s) * s
    out = np.empty_like(x)
    for i in range(0, x.shape[0], block):
        part = x[i:i + block]
        s = max(np.abs(part).max(), 1e-30) / E4M3_MAX
        out[i:i + block] = e4m3(part / s) * s
    return out


def hadamard(d: int, rng: np.random.Generator) -> np.ndarray:
    """A d x d orthogonal matrix: Sylvester's Hadamard matrix / sqrt(d) times random signs (d a power of 2)."""
    if d & (d - 1):
        raise ValueError(f"head size {d} is not a power of two")
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(d)) * rng.choice([-1.0, 1.0], size=d)[None, :]


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    s = (q @ k.T) / np.sqrt(q.shape[1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape, bool)), s, -np.inf)
    p = np.exp(s - s.max(1, keepdims=True))
    return (p @ v) / p.sum(1, keepdims=True)


def emulate(q, k, v, scheme: str, causal: bool, rng: np.random.Generator, block: int = 128) -> np.ndarray:
    """The output of attention computed as ``scheme`` would compute it (float32 accumulation)."""
    d = q.shape[1]
    if scheme == "fp16":
        q16, k16, v16 = (x.astype(np.float16).astype(np.float32) for x in (q, k, v))
        s = (q16 @ k16.T) / np.float32(np.sqrt(d))
        if causal:
            s = np.where(np.tril(np.ones(s.shape, bool)), s, -np.inf)
        p = np.exp(s - s.max(1, keepdims=True))
        return ((p.astype(np.float16).astype(np.float32) @ v16) / p.sum(1, keepdims=True)).astype(np.float64)
    per = None if scheme == "fp8-tensor" else block
    if "hadamard" in scheme:
        m = hadamard(d, rng)
        q, k = q @ m, k @ m
    if "smooth" in scheme:
        k = k - k.mean(0, keepdims=True)
    qk_block = 1 if scheme.startswith("fp8-token") else per
    if scheme.startswith("fp8-pv"):
        qq, kq = q.astype(np.float16), k.astype(np.float16)
    else:
        qq, kq = quantize(q, qk_block), quantize(k, qk_block)
    s = (qq.astype(np.float32) @ kq.astype(np.float32).T) / np.float32(np.sqrt(d))
    if causal:
        s = np.where(np.tril(np.ones(s.shape, bool)), s, -np.inf)
    p = np.exp(s - s.max(1, keepdims=True)).astype(np.float64)
    if scheme.startswith("fp8-qk"):
        pq, vq = p.astype(np.float16), v.astype(np.float16)
    else:
        pq, vq = e4m3(p * E4M3_MAX) / E4M3_MAX, quantize(v, per)
    return (pq.astype(np.float32) @ vq.astype(np.float32)) / p.sum(1, keepdims=True).astype(np.float32)


def rmse(a, b) -> float:
    """The root-mean-square difference, in float64."""
    return float(np.sqrt(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)))


def run(head_dims, seqlens, heads: int, causal_modes, seed: int) -> list[dict]:
    rows = []
    for d in head_dims:
        for n in seqlens:
            for causal in causal_modes:
                errs = {sch: [] for sch in SCHEMES}
                for h in range(heads):
                    rng = np.random.default_rng([seed, d, n, h])
                    q, k, v = (outlier_inputs(rng, (n, d)) for _ in range(3))
                    want = reference(q, k, v, causal)
                    for sch in SCHEMES:
                        errs[sch].append(rmse(emulate(q, k, v, sch, causal, np.random.default_rng([seed, h])), want))
                rows.append({"d": d, "n": n, "causal": causal, "heads": heads,
                             "rmse": {sch: float(np.sqrt(np.mean(np.square(e)))) for sch, e in errs.items()}})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--heads", type=int, default=4, help="independent heads per shape (the RMSE is over all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = run(args.head_dims, args.seqlens, args.heads, (False, True), args.seed)
    print(f"{'d':>4} {'N':>6} {'causal':>6} " + " ".join(f"{s:>26}" for s in SCHEMES))
    for r in rows:
        print(f"{r['d']:>4} {r['n']:>6} {str(r['causal']):>6} " + " ".join(f"{r['rmse'][s]:>26.3e}" for s in SCHEMES))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps({"schemes": SCHEMES, "rows": rows}, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
