"""Rewrite attention subgraphs of an ONNX model into ``ort_flash.FlashAttention``.

    result = ort_flash.rewriter.rewrite("model.onnx")
    onnx.save(result.model, "model.flash.onnx")
    print(result.report.format_table())

The input is never changed: the rules run on a copy (carrying inferred shapes, which the
rules need to prove a fusion safe), and the output keeps the original graph inputs, outputs,
value_info, ir_version and names; only the fused subgraphs (and constants that fed nothing
else) are replaced, and the opset import ("ort_flash", 1) is added when something was fused.
"""

from __future__ import annotations

import dataclasses
import os

import onnx
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._rewrite_rule import RULE_NAME_TAG

from ort_flash.rewriter import flash_op, matmul_softmax_attention
from ort_flash.rewriter.diagnose import structural_reason
from ort_flash.rewriter.model_io import ModelLoadError, load_model
from ort_flash.rewriter.report import FusedSubgraph, RewriteReport, UnfusedSoftmax
from ort_flash.rewriter.shapes import infer_shapes

__all__ = [
    "FusedSubgraph", "ModelLoadError", "RewriteReport", "RewriteResult", "UnfusedSoftmax",
    "load_model", "rewrite",
]

# Every rule family, in the order they are tried; each module's rules() gives its variants.
RULE_FAMILIES = (matmul_softmax_attention,)


@dataclasses.dataclass
class RewriteResult:
    model: onnx.ModelProto
    report: RewriteReport


def rewrite(model_or_path: onnx.ModelProto | str | os.PathLike | bytes) -> RewriteResult:
    original = load_model(model_or_path)
    inferred, shape_inference = infer_shapes(original)
    model = ir.from_proto(inferred)

    instances = [inst for family in RULE_FAMILIES for inst in family.rules()]
    dead_before = set(_dead_nodes(model.graph))
    used_initializers = {n for n, v in model.graph.initializers.items() if v.uses()}
    count = pattern.RewriteRuleSet([_as_rule(i) for i in instances], commute=True).apply_to_model(
        model
    )
    _remove_new_dead_nodes(model.graph, dead_before, used_initializers)

    report = _report(model, instances)
    report.shape_inference = shape_inference
    assert report.total_fused == count, (report.total_fused, count)
    out = ir.to_proto(model)
    _restore_interface(out, original)
    if count:
        _ensure_opset(out, flash_op.DOMAIN, flash_op.VERSION)
    return RewriteResult(model=out, report=report)


def _as_rule(instance: pattern.RewriteRuleClassBase) -> pattern.RewriteRule:
    """Like ``RuleClass.rule()``, but on an instance whose state (counts, reasons) we keep."""
    return pattern.RewriteRule(
        instance.pattern, instance.rewrite, instance.check, name=instance.name,
        remove_nodes=instance.remove_nodes, graph_pre_visitor=instance.setup,
        graph_post_visitor=instance.cleanup, as_function=instance.as_function,
    )


def _report(model: ir.Model, instances: list) -> RewriteReport:
    report = RewriteReport()
    for family in RULE_FAMILIES:
        report.counts[family.FAMILY] = 0
    for inst in instances:
        for fused in inst.fused:
            report.counts[fused.rule] = report.counts.get(fused.rule, 0) + 1
            report.fused.append(fused)
    for i, node in enumerate(n for n in _all_nodes(model) if n.op_type == "Softmax"):
        reasons = [inst.failures[node] for inst in instances if node in inst.failures]
        reason = max(reasons, key=lambda r: r[0])[1] if reasons else structural_reason(node)
        report.unfused.append(UnfusedSoftmax(node=node.name or f"<unnamed Softmax {i}>",
                                             reason=reason))
    for node in _all_nodes(model):
        if node.domain == flash_op.DOMAIN or node.name.endswith("FlashAttention_key"):
            node.metadata_props.pop(RULE_NAME_TAG, None)
    return report


def _all_nodes(model: ir.Model):
    yield from ir.traversal.RecursiveGraphIterator(model.graph)
    for function in model.functions.values():
        yield from ir.traversal.RecursiveGraphIterator(function)


def _dead_nodes(graph: ir.Graph) -> list[ir.Node]:
    return [
        n for n in graph
        if n.outputs and all(not o.uses() and not o.is_graph_output() for o in n.outputs)
    ]


def _remove_new_dead_nodes(graph: ir.Graph, dead_before: set[ir.Node], used: set[str]) -> None:
    """Drop what fed only the replaced subgraphs (a scale Constant or initializer); keep the rest."""
    while True:
        dead = [n for n in _dead_nodes(graph) if n not in dead_before]
        if not dead:
            break
        graph.remove(dead, safe=True)
    for name in used:
        value = graph.initializers[name]
        if not value.uses() and not value.is_graph_input() and not value.is_graph_output():
            graph.initializers.pop(name)


def _restore_interface(out: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """Inputs, outputs and value_info exactly as the user's model had them (not the inferred)."""
    for field in ("input", "output"):
        by_name = {v.name: v for v in getattr(original.graph, field)}
        for value in getattr(out.graph, field):
            if value.name in by_name:
                value.CopyFrom(by_name[value.name])
    produced = {o for n in out.graph.node for o in n.output}
    kept = [v for v in original.graph.value_info if v.name in produced]
    out.graph.ClearField("value_info")
    out.graph.value_info.extend(kept)
    out.ir_version = original.ir_version


def _ensure_opset(out: onnx.ModelProto, domain: str, version: int) -> None:
    for opset in out.opset_import:
        if opset.domain == domain:
            opset.version = version
            return
    out.opset_import.append(onnx.helper.make_opsetid(domain, version))
