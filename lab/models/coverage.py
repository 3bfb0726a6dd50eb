"""Rewrite every model family configuration and record what was fused: docs/rewriter-coverage.md.

    . .venv/bin/activate
    python lab/models/coverage.py                 # exports what the cache lacks (minutes), then writes
    python lab/models/coverage.py --json out.json # also the raw rows
    python lab/models/coverage.py --section optimum  # only the Optimum section (the rest kept)

For each family × exporter × attn_implementation × dtype of ``lab/models/families.py``, without and
with a KV cache: the attention layers the model has, how many the rewriter fused, how many became
causal, how many read the cache as the op's past/present, K/V heads, layout, the mask kinds left,
every Softmax (or ONNX Attention node) left unfused with its reason, and ``ort_flash.verify`` on
the CPU EP (largest absolute error against the original). Export failures are listed with the
exporter's message. The Optimum section (``lab/models/optimum_coverage.py``): each file of each
Optimum export of ``lab/models/optimum_family.py``.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import time

import onnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from lab.models import optimum_coverage, optimum_family  # noqa: E402
from lab.models.families import ExportFailure, export, specs  # noqa: E402
from ort_flash.rewriter import rewrite  # noqa: E402
from ort_flash.verify import verify  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parents[2] / "docs" / "rewriter-coverage.md"
KNOWN_CAUSES = {
    "Scale has inconsistent type": "TorchScript exporter, float16, `sdpa` with a bool mask: "
    "torch's `scaled_dot_product_attention` symbolic adds a float32 `Where(mask, 0, -inf)` to "
    "the float16 scores, so the attention (and, for BERT, GPT-2, BART and Whisper, the "
    "LayerNormalization after it) is typed float32 against float16 weights; the exported model "
    "fails ONNX shape inference and ONNX Runtime refuses it. (LLaMA and Qwen2 export valid "
    "mixed-precision graphs, which the rewriter fuses: `sdpa_attention[...,upcast]`.)",
    "GuardOnDataDependentSymNode": "dynamo exporter (opset 18 and 23), BART in float16: "
    "`BartEncoderLayer.forward` branches on `torch.isfinite(hidden_states).all()` for float16, "
    "a data-dependent condition torch.export cannot trace (the cached decoder step has no "
    "encoder layer and exports).",
    "RotaryEmbedding": "dynamo exporter at opset 23, LLaMA and Qwen2 in float32: the exporter's "
    "optimizer fuses RoPE into the ONNX `RotaryEmbedding` op with cos/sin caches that ONNX "
    "Runtime 1.31's CPU kernel rejects on the traced inputs themselves (\"expected to have the "
    "same shape as input 'x'\"); in float16 the RoPE stays unfused and the models run.",
}


NOTES = [
    "KV cache (`+kv`): the `kv_cache` rule turns each self-attention's `Concat(past, new)` of K "
    "and V into the op's `past_key`/`past_value` inputs; the op's `present_key`/`present_value` "
    "(past ++ new along the sequence axis, the same tensor) replace the Concat outputs, so the "
    "graph's `present_*` outputs keep their names. Then `causal_mask` proves the mask's causal "
    "term `key <= query + past_length` against the op's bottom-right `is_causal` (offset = the "
    "past length). The cross-attention reads its cached K/V as plain K/V.",
    "The dynamo exporter names a cached step's attention-mask length with a symbol of its own "
    "(torch.export cannot derive it as past + sequence); `lab/models/families.py` names it "
    "`past_sequence + sequence`, as the TorchScript export's dynamic axes do. Without that name "
    "the rewriter cannot prove the mask's length equal to the keys' and keeps the mask whole.",
    "`nonpad_kv_seqlen` is not emitted (a deliberate decision, see the README's rewriter "
    "section): a 0/1 `attention_mask` input is not provably a right-padded prefix; the op's "
    "`is_causal` counts from `nonpad_kv_seqlen - Sq`, which differs from the exported causal + "
    "padding mask for right-padded prefill; and it cannot be combined with `past_key`. Padding "
    "stays a compact (B,1,1,Skv) mask.",
]


def row(spec) -> dict:
    base = dict(family=spec.family + ("+kv" if spec.cache else ""), exporter=spec.exporter,
                attn=spec.attn, dtype=spec.dtype, layers=spec.layers)
    try:
        model = onnx.load(export(spec))
    except ExportFailure as e:
        return {**base, "export_error": str(e).split(": ", 1)[1]}
    result = rewrite(model, exact_masked_rows=False)  # the mapping `--fast-padded-rows` enables
    report = result.report
    check = verify(model, result.model, seed=0)
    exact = rewrite(model).report  # the default
    transposes = sum(n.op_type == "Transpose" for n in result.model.graph.node)
    return {
        **base,
        "fused": report.total_fused,
        "causal": sum(f.causal for f in report.fused),
        "cache": sum(f.cache == "past/present" for f in report.fused),
        "causal_default": sum(f.causal for f in exact.fused),
        "fused_default": exact.total_fused,
        "kv_heads": sorted({f"{f.heads}/{f.kv_heads}" for f in report.fused}),
        "layouts": dict(collections.Counter(f.layout for f in report.fused)),
        "masks": dict(collections.Counter(f.mask for f in report.fused)),
        "rules": {r: n for r, n in report.counts.items() if n},
        "unfused": [f"{u.node}: {u.reason}" for u in report.unfused],
        "transposes_left": transposes,
        "verify_passed": check.passed,
        "verify_max_abs": max(o.max_abs for o in check.outputs),
        "shape_inference": report.shape_inference,
    }


def markdown(rows: list[dict], seconds: float) -> str:
    import onnxruntime
    import torch
    import transformers

    lines = [
        "# Rewriter coverage on real exporters",
        "",
        "Generated by `python lab/models/coverage.py` (do not edit by hand) in "
        f"{seconds:.0f} s with torch {torch.__version__}, transformers {transformers.__version__}, "
        f"onnxruntime {onnxruntime.__version__}. Models: the tiny random configurations of "
        "`lab/models/families.py` (TorchScript exporter at opset 17, dynamo exporter at opset 18, and "
        "`dynamo23`: the dynamo exporter at opset 23, which writes SDPA as ONNX `Attention`); "
        "`+kv` is one decoding step with a KV cache (flat `past_key_i`/`past_value_i` inputs, "
        "`present_key_i`/`present_value_i` outputs; for BART and Whisper the decoder alone, whose "
        "cross-attention reads cached K/V). "
        "`fused` counts attention subgraphs (or ONNX Attention nodes) replaced by "
        "`ort_flash.FlashAttention` out of the "
        "model's attention layers (self + cross); `past` how many read the cache as the op's "
        "`past_key`/`past_value` with `present_key`/`present_value` outputs (the Concat absorbed); "
        "`causal` how many got `is_causal` instead of a "
        "mask with `--fast-padded-rows` (`rewrite(..., exact_masked_rows=False)`), and in brackets "
        "with the default, which keeps finite (finfo.min) causal + padding masks whole so that "
        "left-padded query rows stay exact; `heads q/kv` after repeat_kv is absorbed; `BSD` how many use the 3-D layout (no "
        "Transposes around the op), in brackets how many of those read packed QKV (one MatMul of "
        "the three projections, `packed_qkv`) or, Q apart, packed KV (K's bias dropped and V's folded "
        "into the output projection's, `bias_fold`); `verify` is `ort_flash.verify` on the CPU EP (seed 0, batch "
        "2, sequence 37, past 12, right-padded masks), largest absolute error over all outputs.",
        "",
        "| family | exporter | attn | dtype | attention layers | fused | past | causal | heads q/kv "
        "| BSD | masks left | unfused (reason) | verify |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        head = f"| {r['family']} | {r['exporter']} | {r['attn']} | {r['dtype']} | {r['layers']} "
        if "export_error" in r:
            lines.append(head + f"| — | — | — | — | — | — | export failed: {_cell(r['export_error'])} | — |")
            continue
        masks = ", ".join(f"{k} ×{n}" for k, n in r["masks"].items())
        unfused = "; ".join(_cell(u) for u in r["unfused"]) or "none"
        verdict = ("pass" if r["verify_passed"] else "FAIL") + f" ({r['verify_max_abs']:.2g})"
        lines.append(head + f"| {r['fused']} | {r['cache']} | {r['causal']} ({r['causal_default']}) | {', '.join(r['kv_heads'])} "
                     f"| {_three_d(r['layouts'])} | {masks} | {unfused} | {verdict} |")
    lines += ["", "## Notes", ""] + [f"- {n}" for n in NOTES]
    failed = [r for r in rows if "export_error" in r]
    if failed:
        lines += ["", "## Export failures", ""]
        lines += [f"- `{r['family']}-{r['exporter']}-{r['attn']}-{r['dtype']}`: "
                  f"{_cell(r['export_error'])}" for r in failed]
        lines += ["", "Known causes (read from the exported graphs and the models' code):", ""]
        lines += [f"- {cause}" for key, cause in KNOWN_CAUSES.items()
                  if any(key in r["export_error"] for r in failed)]
    return "\n".join(lines) + "\n"


def _three_d(layouts: dict) -> str:
    """The 3-D layout count, packed QKV and packed KV (themselves 3-D) in brackets where any."""
    packed, kv = layouts.get("packed", 0), layouts.get("packed KV", 0)
    total = layouts.get("BSD", 0) + packed + kv
    parts = [f"{packed} packed QKV" if packed else "", f"{kv} packed KV" if kv else ""]
    inner = ", ".join(p for p in parts if p)
    return f"{total} ({inner})" if inner else str(total)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:400]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--section", choices=("all", "families", "optimum"), default="all",
                        help="regenerate one section and keep the other as the file has it")
    args = parser.parse_args(argv)
    old = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
    kept_families, _, kept_optimum = old.partition(optimum_coverage.HEADING)
    rows, optimum_rows = [], []
    start = time.time()
    if args.section != "optimum":
        for spec in specs() + specs(cache=True):
            rows.append(row(spec))
            r = rows[-1]
            print(f"{spec.id}: " + ("export failed" if "export_error" in r else
                                    f"{r['fused']}/{r['layers']} fused, verify "
                                    f"{'pass' if r['verify_passed'] else 'FAIL'}"), flush=True)
        families_text = markdown(rows, time.time() - start)
    else:
        families_text = kept_families.rstrip() + "\n"
    start = time.time()
    if args.section != "families":
        wanted = optimum_family.specs()
        optimum_family.export_all(wanted)
        for spec in wanted:
            for name in spec.files:
                optimum_rows.append(optimum_coverage.row(spec, name))
                r = optimum_rows[-1]
                print(f"{spec.id}/{name}: " + ("export failed" if "export_error" in r else
                                               f"{r['fused']}/{r['sites']} fused"), flush=True)
        optimum_text = optimum_coverage.markdown(optimum_rows, time.time() - start, _commit())
    else:
        optimum_text = (optimum_coverage.HEADING + kept_optimum) if kept_optimum else ""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(families_text + ("\n" + optimum_text if optimum_text else ""),
                        encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(dict(families=rows, optimum=optimum_rows), indent=2) + "\n",
                             encoding="utf-8")
    print(f"wrote {args.out}")
    return 0 if all(r.get("verify_passed", True) for r in rows) else 1


def _commit() -> str:
    import subprocess

    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=OUT.parent, text=True,
                         capture_output=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           cwd=OUT.parent, text=True, capture_output=True).stdout.strip()
    return (run.stdout.strip() or "an unknown commit") + (" (with uncommitted changes)" if dirty else "")


if __name__ == "__main__":
    raise SystemExit(main())
