"""What the rewriter does with each file of the Optimum family: the rows of the Optimum section of
docs/rewriter-coverage.md (written by ``python lab/models/coverage.py``, or its ``--section optimum``).

For each spec of ``lab/models/optimum_family.py`` and each file Optimum writes: the attention sites
(Softmax / Attention nodes, inside If branches too), how many ``ort_flash.rewrite`` fused (the
fast mask mapping, as the tests use), how many became causal and read the KV cache as the op's
past/present against how many the architecture has, the masks left materialized, the reasons
the report gives for what it left, whether the rewritten file passes ``onnx.checker`` (full)
and loads in ONNX Runtime, and ``ort_flash.verify`` on the CPU EP.
"""

from __future__ import annotations

import collections
import pathlib
import re
import subprocess
import sys

import onnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from lab.models.optimum_family import (  # noqa: E402
    FAMILIES, ExportFailure, OptimumSpec, attention_sites, export, venv_dir,
)

# The section's first line: ``coverage.py --section optimum`` replaces the file from here on.
HEADING = "## Optimum exports"


NOTES = [
    "T5's masks stay whole by nature: its relative position bias is a (B, H, S, S) tensor with the "
    "causal and padding terms added in, which the op takes as its additive mask (it has no "
    "position-bias input); tests/test_rewrite_optimum.py counts that as a limit, not a gap.",
    "Export failures are Optimum's own: GPT-2 and Whisper in float16 with sdpa write a file that "
    "ONNX Runtime refuses (LayerNormalization bound to float and float16), the cause of the "
    "families' TorchScript sdpa float16 failures above (Optimum exports with the TorchScript exporter). "
    "A spec fails whole where Optimum's own export step fails (Whisper: its encoder too).",
    "Every file shown with a site unfused, a mask left or a cache not absorbed (T5's masks "
    "aside) is a strict xfail in `GAPS` of tests/test_rewrite_optimum.py, with the rewriter's reason.",
]


def count_sites(graph: onnx.GraphProto) -> int:
    """Softmax and ONNX Attention nodes of ``graph`` and of every subgraph (If / Loop bodies)."""
    count = sum(n.op_type in ("Softmax", "Attention") for n in graph.node)
    for node in graph.node:
        for a in node.attribute:
            bodies = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            count += sum(count_sites(g) for g in bodies)
    return count


def compact(mask: str) -> bool:
    """A fused node's mask (as the report describes it) is "none" or a (B, 1, 1, Skv) padding
    mask: "additive (B,1,1,Skv)", "bool (batch_size,1,1,sequence_length)"."""
    dims = re.search(r"\((.*)\)", mask)
    return mask == "none" or bool(dims) and dims.group(1).split(",")[1:3] == ["1", "1"]


def load_error(model: onnx.ModelProto) -> str | None:
    """Why a rewritten model fails the full ONNX check or ONNX Runtime's session creation (CPU,
    with the ort_flash ops), or None where it loads."""
    import onnxruntime as ort

    import ort_flash

    try:
        onnx.checker.check_model(model, full_check=True)
        ort.InferenceSession(model.SerializeToString(), ort_flash.session_options(),
                             providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - the checker's and ORT's errors share no base class
        return f"{type(e).__name__}: {' '.join(str(e).split())}"[:400]
    return None


def verify_options(spec: OptimumSpec) -> dict:
    """``verify``'s arguments for ``spec``: ViT/CLIP's pixel_values at the model's own image size
    (B 2, 3 channels). A merged decoder needs none: verify runs each use_cache_branch value."""
    if spec.family not in ("vit", "clip"):
        return {}
    config = FAMILIES[spec.family][2]
    size = config.get("image_size") or config["vision_config"]["image_size"]
    return dict(shapes={"pixel_values": (2, 3, size, size)})


def branches(check) -> int:
    """How many runs a VerifyResult holds (one per If-condition value)."""
    return 1 + len(check.more)


def row(spec: OptimumSpec, name: str) -> dict:
    from ort_flash.rewriter import rewrite
    from ort_flash.verify import verify

    base = dict(id=spec.id, family=spec.family, task=spec.task, dtype=spec.dtype, attn=spec.attn,
                file=name, **{f"want_{k}": v for k, v in attention_sites(spec, name).items()})
    try:
        model = onnx.load(export(spec, name))
    except ExportFailure as e:
        return {**base, "export_error": str(e).split(": ", 1)[-1]}
    result = rewrite(model, exact_masked_rows=False)
    report = result.report
    out = {
        **base,
        "sites": count_sites(model.graph),
        "fused": report.total_fused,
        "causal": sum(f.causal for f in report.fused),
        "cached": sum(f.cache == "past/present" for f in report.fused),
        "masks_left": dict(collections.Counter(f.mask for f in report.fused if not compact(f.mask))),
        "unfused": dict(collections.Counter(u.reason for u in report.unfused)),
        "declined": dict(collections.Counter(f"{rule}: {reason}" for d in report.declined.values()
                                             for rule, reason in d.items())),
        "load_error": load_error(result.model),
    }
    if out["load_error"] is None:
        try:
            check = verify(model, result.model, seed=0, **verify_options(spec))
            out["verify_passed"] = check.passed
            out["verify_max_abs"] = max(o.max_abs for c in (check, *check.more) for o in c.outputs)
            out["verify_branches"] = branches(check)
        except Exception as e:  # noqa: BLE001 - verify's own failure to run is a finding too
            out["verify_error"] = f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]
    return out


def markdown(rows: list[dict], seconds: float, commit: str) -> str:
    import onnxruntime

    pins = ", ".join(_pinned_versions())
    lines = [
        HEADING, "",
        f"Generated by `python lab/models/coverage.py --section optimum` at {commit} in {seconds:.0f} s "
        f"(onnxruntime {onnxruntime.__version__} checks; exporter environment: {pins}). Models: the "
        "tiny random configurations of `lab/models/optimum_family.py`, saved with `save_pretrained` and "
        "exported from the folder with Optimum's `main_export` (opset 18); `attn` `default` is what "
        "transformers picks (sdpa where the model has it; T5 has eager only). One row per file "
        "Optimum writes. `sites` counts Softmax / Attention nodes, inside `If` branches too (a "
        "merged decoder holds both decoders); `causal` and `past` are got / the architecture's "
        "(causal self-attentions; self-attentions reading a KV cache input); `masks left`: the "
        "(S × S) masks still materialized; `loads`: the rewritten file passes `onnx.checker` "
        "(full) and ONNX Runtime creates a session; `verify`: `ort_flash.verify` on the CPU EP "
        "(seed 0; a merged decoder once per `use_cache_branch` value, ViT/CLIP with `--shape pixel_values=2,3,32,32`), largest absolute error. Rewrites use the fast mask mapping "
        "(`exact_masked_rows=False`).",
        "",
        "| family | task | dtype | attn | file | sites | fused | causal | past | masks left "
        "| left / declined (reason) | loads | verify |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        head = f"| {r['family']} | {r['task']} | {r['dtype']} | {r['attn']} | {r['file']} "
        if "export_error" in r:
            lines.append(head + f"| {r['want_sites']} | — | — | — | — | export failed: "
                         f"{_cell(r['export_error'])} | — | — |")
            continue
        masks = ", ".join(f"{k} ×{n}" for k, n in r["masks_left"].items()) or "none"
        reasons = [f"unfused ×{n}: {k}" for k, n in r["unfused"].items()]
        reasons += [f"×{n} {k}" for k, n in r["declined"].items()]
        loads = "yes" if r["load_error"] is None else f"**no**: {_cell(r['load_error'][:200])}"
        if "verify_passed" in r:
            verdict = ("pass" if r["verify_passed"] else "**FAIL**") + f" ({r['verify_max_abs']:.2g})"
        else:
            verdict = "—" if "verify_error" not in r else f"cannot run: {_cell(r['verify_error'][:160])}"
        sites = str(r["sites"]) + ("" if r["sites"] == r["want_sites"] else f" (want {r['want_sites']})")
        lines.append(
            head + f"| {sites} | {r['fused']} | {r['causal']}/{r['want_causal']} "
            f"| {r['cached']}/{r['want_cached']} | {_cell(masks)} "
            f"| {'; '.join(_cell(x) for x in reasons) or 'none'} | {loads} | {verdict} |")
    lines += ["", "Notes:", ""] + [f"- {note}" for note in NOTES]
    return "\n".join(lines) + "\n"


def _pinned_versions() -> list[str]:
    """The exporter environment's versions as installed (read from its Python, not assumed)."""
    python = venv_dir() / "bin" / "python"
    code = ("import importlib.metadata as m; print(' '.join(f'{p} {m.version(p)}' for p in "
            "('optimum-onnx', 'optimum', 'transformers', 'torch', 'onnx')))")
    try:
        text = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                              check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return ["(not built)"]
    return [f"{a} {b}" for a, b in zip(text[::2], text[1::2])]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:400]
