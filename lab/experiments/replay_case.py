"""Replay one op-test case (tests/cases.py) with the seed a failure printed, and show where it
differs: the output rows and softmax_lse rows furthest from the float64 reference, with what the
row sees (keys the causal rule allows, and of those the keys the mask leaves visible).

    python lab/experiments/replay_case.py packed_gqa_causal_hf_mask-bfloat16 8673294701807701590 --provider cuda
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", help="case id as the test names it, e.g. packed_gqa_causal_hf_mask-bfloat16")
    ap.add_argument("seed", type=int)
    ap.add_argument("--provider", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--rows", type=int, default=8, help="rows to show")
    args = ap.parse_args()

    from _onnx_models import flash_attention_model, run_model
    from cases import CASES, DEFAULTS, DTYPES, case_id, make_inputs, qkv

    from ort_flash.reference import attention_reference

    case = next((c for c in CASES if case_id(c) == args.case), None)
    if case is None:
        print(f"no case {args.case}; ids look like {case_id(CASES[0])}")
        return 2
    c = {**DEFAULTS, **case}
    feeds, attrs, ref_kwargs = make_inputs(case, np.random.default_rng(args.seed))
    q, k, v = qkv(c, feeds)
    ref_y, _, _, ref_lse = attention_reference(q, k, v, **ref_kwargs)
    specs = {"Y": (ref_y.shape, DTYPES[c["dtype"]]), "softmax_lse": (ref_lse.shape, np.float32)}
    model = flash_attention_model(feeds, {n: s[1] for n, s in specs.items()}, **attrs)
    provider = "CUDAExecutionProvider" if args.provider == "cuda" else "CPUExecutionProvider"
    out = run_model(model, feeds, specs, [provider])

    lse = out["softmax_lse"].astype(np.float64)
    finite = np.isfinite(ref_lse)
    rel = np.where(finite, np.abs(lse - ref_lse) / np.maximum(1.0, np.abs(ref_lse)), 0.0)
    y = out["Y"].astype(np.float64)
    y4 = y if y.ndim == 4 else y.reshape(c["b"], c["sq"], c["hq"], -1).transpose(0, 2, 1, 3)
    r4 = ref_y if ref_y.ndim == 4 else ref_y.reshape(c["b"], c["sq"], c["hq"], -1).transpose(0, 2, 1, 3)
    yerr = np.abs(y4 - r4).max(-1)
    mask = feeds.get("attn_mask")
    sq, skv = c["sq"], c["past"] + c["skv"]
    print(f"{args.case} seed={args.seed} on {provider}: max lse rel error {rel.max():.3g}, max |Y - ref| "
          f"{yerr.max():.3g}; rows with lse -inf: reference {int((~finite).sum())}, ours {int(np.isneginf(lse).sum())}")
    print(" b  h    i  ref lse       ours lse      rel err   |Y-ref|  causal keys  visible by mask")
    for flat in np.argsort(rel, axis=None)[::-1][:args.rows]:
        b, h, i = np.unravel_index(flat, rel.shape)
        causal = min(skv, i + (skv - sq) + 1) if c.get("causal") else skv
        visible = "-"
        if mask is not None:
            m = np.broadcast_to(mask, (c["b"], c["hq"], sq, mask.shape[-1]))[b, h, i, :causal]
            visible = int((m > -1e4).sum()) if m.dtype != np.bool_ else int(m.sum())
        print(f"{b:2d} {h:2d} {i:4d}  {ref_lse[b, h, i]:12.5g}  {lse[b, h, i]:12.5g}  {rel[b, h, i]:8.3g}  "
              f"{yerr[b, h, i]:7.3g}  {causal:11d}  {visible}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
