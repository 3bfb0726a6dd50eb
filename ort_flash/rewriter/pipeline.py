"""What ``rewrite()`` does, in order: the fusions, then the refinements, then the gate.

    result = rewrite("model.onnx")
    result.save("model.flash.onnx")  # + model.flash.onnx.data where the weights are external
    print(result.report.format_table())

A model of any size: large external-data weights stay in their files (``external_data``); the
rules work on the graph and read a weight only where they change it (packed QKV). ``result.model``
then refers to the input's data files by their names relative to ``result.base_dir``; ``save``
writes the output with a data file of its own (``onnx.save`` serves a model with no external data).

Two stages, each a set of onnxscript pattern rules (pattern / check / rewrite, one per file):

1. Fusions (``fusions/``) create a FlashAttention node from an attention subgraph or node:
   ``sdpa_attention`` (torch's SDPA decomposition), ``matmul_softmax_attention`` (eager
   attention), ``onnx_attention`` (ONNX Attention 23-25), ``ms_multihead_attention`` (ORT's
   com.microsoft.MultiHeadAttention). The node first takes the mask exactly as the model
   computed it, in the BNSH layout. ``group_query_attention`` swaps ORT's
   com.microsoft.GroupQueryAttention (ONNX Runtime GenAI's LLMs) for ``ort_flash.GroupQueryAttention``,
   the same interface; refinements leave that node alone.
2. Refinements (``refinements/``) prove cheaper forms of each new node: ``repeat_kv`` (K/V keep
   their Hkv heads), ``kv_cache`` (a KV cache's Concat(past, new) becomes the op's past_key /
   past_value inputs and present_key / present_value outputs), ``causal_mask`` (a materialized
   causal / padding mask becomes is_causal and a (B, 1, 1, S) mask, proven by the mask prover,
   ``mask_prover/``), ``layout_3d`` (the head split/merge Transposes become the
   op's 3-D layout), ``packed_qkv`` (self-attention's three projections of one input become one
   MatMul whose output the op reads as packed QKV), ``bias_fold`` (a packed QKV's K bias goes and
   its V bias moves into the output projection's, so that only Q keeps a bias Add; the op reads
   K and V as packed KV), ``merge_reshape`` (Reshapes after the node that give back its Y's shape
   go, with the shape arithmetic that fed them).

The input is never changed: the rules run on a copy (carrying inferred shapes, which the
rules need to prove a fusion safe), and the output keeps the original graph inputs, outputs,
value_info, ir_version and names; only the fused subgraphs (and what fed nothing else) are
replaced, and the opset import ("ort_flash", 1) is added when something was fused. All of
this holds in every graph: If branches and Loop/Scan bodies are inferred, fused and restored
each on its own (``subgraphs``). Last, ``output_check`` gates the output: it must pass
onnx.checker (full check) and load in an ONNX Runtime CPU session, else ``rewrite`` raises
``RewriteRefusedError`` with the reason and returns nothing. The report
counts what each rule did, describes every fused node, and gives the reason for every Softmax
(or attention node) left unfused and every refinement declined. With
``attention_precision="fp8"`` the fused float16 / bfloat16 nodes are stamped for FP8 attention
before the gate, and the report names them.
"""

from __future__ import annotations

import dataclasses
import os

import onnx
import onnx_ir as ir
from onnxscript.rewriter import pattern

from ort_flash.rewriter import external_data, flash_op
from ort_flash.rewriter.diagnose import structural_reason
from ort_flash.rewriter.fusions import (
    group_query_attention, matmul_softmax_attention, ms_multihead_attention, onnx_attention,
    sdpa_attention,
)
from ort_flash.rewriter.model_io import load
from ort_flash.rewriter.onnxscript_api import RULE_NAME_TAG
from ort_flash.rewriter.output_check import check_output
from ort_flash.rewriter.refinements import (
    bias_fold, causal_mask, kv_cache, layout_3d, merge_reshape, packed_qkv, repeat_kv,
)
from ort_flash.rewriter.report import RewriteReport, UnfusedSoftmax
from ort_flash.rewriter.shapes import infer_shapes
from ort_flash.rewriter.subgraphs import graph_labels, qualified, subgraphs

# Fusion rules, in the order they are tried; each module's rules() gives its variants. Each
# creates FlashAttention nodes from an attention subgraph (or an attention node).
FUSIONS = (sdpa_attention, matmul_softmax_attention, onnx_attention, ms_multihead_attention,
           group_query_attention)
# Refinements, applied in this order to every FlashAttention node: each proves a cheaper form
# (fewer K/V heads, is_causal instead of a materialized mask, no transposes) of the same function.
REFINEMENTS = (repeat_kv, kv_cache, causal_mask, layout_3d, packed_qkv, bias_fold, merge_reshape)
# The families whose rules() take exact_masked_rows (rewrite's option of the same name).
_EXACT_OPTION = (matmul_softmax_attention, causal_mask)
# ORT_FLASH_GQA_CUDA's values, the default of rewrite's gqa_cuda.
_GQA_CUDA_ENV = {"1": "all", "0": "none"}
# rewrite's attention_precision: "fp8" stamps the attribute of that name on the fused nodes whose
# attention runs in one of FP8_DTYPES (the op's FP8 prefill kernels take those).
ATTENTION_PRECISIONS = ("model", "fp8")
PRECISION_ATTRIBUTE = "attention_precision"
FP8_DTYPES = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
# The ort_flash op types an attention_precision applies to.
_PRECISION_OPS = (flash_op.OP_TYPE, group_query_attention.OP_TYPE)


def _family_rules(family, exact_masked_rows: bool, gqa_cuda: str = "measured") -> list:
    """A family's rule instances, given rewrite's exact_masked_rows and gqa_cuda where the family
    takes them."""
    if family in _EXACT_OPTION:
        return family.rules(exact_masked_rows=exact_masked_rows)
    if family is group_query_attention:
        return family.rules(cuda_policy=gqa_cuda)
    return family.rules()


@dataclasses.dataclass
class RewriteResult:
    model: onnx.ModelProto
    report: RewriteReport
    base_dir: str = ""  # the folder the model's external data locations are relative to
    external: bool = False  # the input kept its weights as external data: so does the output

    def save(self, path: str | os.PathLike) -> str | None:
        """Write the model (``external_data.save_atomic``): one file, or with ``path + ".data"``
        where its weights are external or it would pass 2 GB. Atomic: both files are written as
        temp files in ``path``'s folder and take their names once complete, so a failure leaves
        no new or half-written file and an existing output as it was. Returns the data file's
        path, or None. Afterwards ``model`` refers to the written data file (after a failure, to
        the weights it referred to before)."""
        path = os.fspath(path)
        data = external_data.save_atomic(self.model, path, self.base_dir, external=self.external)
        if data is not None:
            self.base_dir = os.path.dirname(os.path.abspath(path))
        return data


def rewrite(
    model_or_path: onnx.ModelProto | str | os.PathLike | bytes, *, exact_masked_rows: bool = True,
    fp32_precision: str = "ieee", gqa_cuda: str | None = None, attention_precision: str = "model",
    base_dir: str | os.PathLike | None = None, progress=None,
) -> RewriteResult:
    """Fuse every provable attention of the model; see the module docstring.

    ``exact_masked_rows`` (default True): keep causal + key-padding masks with a finite mask
    value (eager attention's finfo.min) materialized, so that every output row, including query
    rows with no visible key (left-padded positions), is the same function, and leave eager
    masked_fill with float16's finfo.min (-65504) unfused. False turns such masks into
    is_causal + a (B, 1, 1, S) mask (much faster), and fuses that masked_fill as -inf; then
    query rows with no visible key differ (they average over their causal window instead of over
    all keys; a masked_fill row gives 0), and the report's notes say which nodes that affects.

    ``fp32_precision``: how float32 attention multiplies on the GPU. "ieee" (default) keeps
    float32 accuracy; "tf32" opts in to TF32 tensor-core dots (about 1e-3 relative error),
    stamped on every fused node as the op's ``fp32_precision`` attribute.

    ``gqa_cuda``: which float16 / bfloat16 ``com.microsoft.GroupQueryAttention`` nodes (they run on
    CUDA) become ort_flash's: "measured" (head sizes where ort_flash's op was measured faster than
    ONNX Runtime's), "all" or "none"; None takes ``ORT_FLASH_GQA_CUDA`` (1: all, 0: none, unset:
    measured). float32 nodes (the CPU EP) are mapped whatever it says.

    ``attention_precision``: "model" (default) computes attention in each node's dtype; "fp8" opts
    in to FP8 (e4m3) attention, stamped as the op's ``attention_precision`` attribute on every
    fused FlashAttention and GroupQueryAttention node whose attention runs in float16 or bfloat16
    (the op runs them on its FP8 kernels for prefill on sm_90 GPUs, elsewhere in the node's dtype);
    the report names those nodes and says how many float32 nodes keep their dtype.

    ``base_dir``: where a given ModelProto's external data lies (default: the model file's
    folder for a path, else the current directory). ``progress``: called as
    ``progress(stage, done, total)`` as the work goes (stage "shapes", "fusing", "refining",
    "checking"; done/total count fused attention nodes while fusing, else None).

    Raises ``ModelLoadError`` for an input that is not a valid ONNX model and
    ``RewriteRefusedError`` where the rewritten model would not load (``output_check``).
    """
    if fp32_precision not in ("ieee", "tf32"):
        raise ValueError(f"fp32_precision must be 'ieee' or 'tf32', not {fp32_precision!r}")
    if attention_precision not in ATTENTION_PRECISIONS:
        raise ValueError(f"attention_precision must be one of {', '.join(ATTENTION_PRECISIONS)}, "
                         f"not {attention_precision!r}")
    if gqa_cuda is None:
        gqa_cuda = _GQA_CUDA_ENV.get(os.environ.get("ORT_FLASH_GQA_CUDA", ""), "measured")
    if gqa_cuda not in group_query_attention.CUDA_POLICIES:
        raise ValueError(f"gqa_cuda must be one of {', '.join(group_query_attention.CUDA_POLICIES)}, "
                         f"not {gqa_cuda!r}")
    tell = progress or (lambda stage, done=None, total=None: None)
    if base_dir is None:
        base_dir = (os.path.dirname(os.path.abspath(model_or_path))
                    if isinstance(model_or_path, (str, os.PathLike)) else "")
    base_dir = os.fspath(base_dir)
    original, external = load(model_or_path)
    tell("shapes")
    inferred, shape_inference = infer_shapes(original)
    model = ir.from_proto(inferred)
    del inferred
    # A rule that reads a weight's values (packed_qkv) maps it from its file.
    ir.external_data.set_base_dir(model.graph, os.path.abspath(base_dir or "."))

    # onnxscript's rule sets recurse into subgraphs (If branches, Loop/Scan bodies) themselves;
    # ``where`` follows which graph a rule is looking at, for the report.
    where = _Where(graph_labels(model))
    graphs = list(where.labels)
    dead_before = {n for g in graphs for n in _dead_nodes(g)}
    used_initializers = {g: {n for n, v in g.initializers.items() if v.uses()} for g in graphs}
    initial_initializers = {g: set(g.initializers) for g in graphs}
    fusions = [inst for family in FUSIONS for inst in _family_rules(family, exact_masked_rows, gqa_cuda)]
    where.tell = lambda: tell("fusing", sum(len(i.fused) for i in fusions), candidates)
    candidates = sum(1 for n in _all_nodes(model) if n.op_type == "Softmax"
                     or (n.domain, n.op_type) in _ATTENTION_NODES)
    tell("fusing", 0, candidates)
    count = pattern.RewriteRuleSet([_as_rule(i, where) for i in fusions],
                                   commute=True).apply_to_model(model)
    where.tell = None
    tell("refining")
    refinements = []
    where.fused = {qualified(f.graph, f.fused_node) for inst in fusions for f in inst.fused}
    for family in REFINEMENTS:
        # What the previous rules left dead would look like other uses of the values they read.
        _remove_new_dead_nodes(model, dead_before, used_initializers)
        # In order: a family's first rules prepare the next.
        for inst in _family_rules(family, exact_masked_rows):
            pattern.RewriteRuleSet([_as_rule(inst, where)]).apply_to_model(model)
            _remove_new_dead_nodes(model, dead_before, used_initializers)
            if inst.family == family.FAMILY:
                refinements.append(inst)
    _remove_new_dead_nodes(model, dead_before, used_initializers)
    # Initializers a rule wrote that a later rule replaced (packed_qkv's packed weights after bias_fold).
    for graph, names in initial_initializers.items():
        for name in [n for n, v in graph.initializers.items() if n not in names and not v.uses()
                     and not v.is_graph_input() and not v.is_graph_output()]:
            graph.initializers.pop(name)

    report = _report(model, fusions, refinements, where)
    report.shape_inference = shape_inference
    assert report.total_fused == count, (report.total_fused, count)
    if attention_precision != "model":
        _stamp_precision(model, attention_precision, report, where)
    out = ir.to_proto(model)
    for value in (v for g in graphs for v in g.initializers.values()):
        if isinstance(value.const_value, ir.ExternalTensor):
            value.const_value.release()  # unmap the weights a rule read
    del model
    _restore_interface(out, original)
    if count:
        _ensure_opset(out, flash_op.DOMAIN, flash_op.VERSION)
    if fp32_precision != "ieee":
        for node in (n for _, graph in subgraphs(out.graph) for n in graph.node):
            if node.domain == flash_op.DOMAIN and node.op_type == flash_op.OP_TYPE:
                node.attribute.append(onnx.helper.make_attribute("fp32_precision", fp32_precision))
    tell("checking")
    check_output(out, original, base_dir)
    return RewriteResult(model=out, report=report, base_dir=base_dir, external=external)


class _Where:
    """The graph the rule being applied looks at, and per rule what it did there: sibling
    subgraphs may hold nodes of the same name, so the rules' own name-keyed records are
    re-keyed by ``qualified(graph, node)`` as they happen."""

    def __init__(self, labels: dict[ir.Graph, str]) -> None:
        self.labels = labels
        self.graph = ""
        self.applied: dict[int, list[tuple[str, dict]]] = {}  # id(rule) -> (node key, changes)
        self.declined: dict[int, dict[str, str]] = {}  # id(rule) -> node key -> reason
        self.tell = None  # progress: called after each fusion
        # Node keys of the FlashAttention nodes this run's fusions wrote: refinements touch only
        # those (a node an earlier rewrite wrote is left as it is, and not in the report).
        self.fused: set[str] | None = None

    def label(self, graph) -> str:
        return self.labels.get(graph, getattr(graph, "name", None) or "<function>")


def _as_rule(instance: pattern.RewriteRuleClassBase, where: _Where) -> pattern.RewriteRule:
    """Like ``RuleClass.rule()``, but on an instance whose state (counts, reasons) we keep,
    tagged with the graph each thing happened in."""

    def check(context, **bindings):
        where.graph = where.label(context.graph_or_function)
        records = getattr(instance, "declined", None)
        node = instance.flash_node(context) if records is not None else None
        if node is not None and where.fused is not None and qualified(where.graph, node.name) not in where.fused:
            return pattern.MatchResult().fail("not fused by this rewrite", node)
        if node is not None:
            records.pop(node.name, None)
        result = instance.check(context, **bindings)
        if node is not None:
            mine = where.declined.setdefault(id(instance), {})
            key = qualified(where.graph, node.name)
            if node.name in records:
                mine[key] = records[node.name]
            elif result:
                mine.pop(key, None)
        return result

    def rewrite(op, **bindings):
        fused, applied = getattr(instance, "fused", []), getattr(instance, "applied", [])
        n_fused, n_applied = len(fused), len(applied)
        out = instance.rewrite(op, **bindings)
        for entry in fused[n_fused:]:
            entry.graph = where.graph
        if where.tell is not None and len(fused) > n_fused:
            where.tell()
        where.applied.setdefault(id(instance), []).extend(
            (qualified(where.graph, name), changes) for name, changes in applied[n_applied:])
        return out

    return pattern.RewriteRule(
        instance.pattern, rewrite, check, name=instance.name,
        remove_nodes=instance.remove_nodes, graph_pre_visitor=instance.setup,
        graph_post_visitor=instance.cleanup, as_function=instance.as_function,
    )


def _report(model: ir.Model, fusions: list, refinements: list, where: _Where) -> RewriteReport:
    report = RewriteReport()
    for family in (*FUSIONS, *REFINEMENTS):
        report.counts[family.FAMILY] = 0
    for inst in fusions:
        for fused in inst.fused:
            report.counts[fused.rule] += 1
            report.fused.append(fused)
    by_node = {qualified(f.graph, f.fused_node): f for f in report.fused}
    done = {}  # family -> nodes it refined (by any of its variants)
    for inst in refinements:
        done.setdefault(inst.family, set()).update(k for k, _ in where.applied.get(id(inst), []))
    for inst in refinements:
        for node_key, changes in where.applied.get(id(inst), []):
            report.counts[inst.family] += 1
            entry = by_node[node_key]
            for key, value in changes.items():
                if key == "note" and entry.note:  # a fusion's note stays beside a refinement's
                    value = f"{entry.note}; {value}"
                setattr(entry, key, value)
            entry.refined_by.append(inst.family)
        for node_key, reason in where.declined.get(id(inst), {}).items():
            if (node_key in by_node and node_key not in done[inst.family]
                    and _worth_reporting(inst.family, reason)):
                report.declined.setdefault(node_key, {})[inst.family] = reason
    for i, node in enumerate(n for n in _all_nodes(model) if n.op_type == "Softmax"):
        reasons = [inst.failures[node] for inst in fusions if node in inst.failures]
        reason = max(reasons, key=lambda r: r[0])[1] if reasons else structural_reason(node)
        report.unfused.append(UnfusedSoftmax(node=node.name or f"<unnamed Softmax {i}>",
                                             reason=reason, graph=where.label(node.graph)))
    for node in _all_nodes(model):
        if (node.domain, node.op_type) in _ATTENTION_NODES:  # node-level inputs left alone
            reasons = [inst.failures[node] for inst in fusions if node in inst.failures]
            reason = reasons[0][1] if reasons else "no rule matched"
            report.unfused.append(UnfusedSoftmax(node=node.name or node.op_type, reason=reason,
                                                 graph=where.label(node.graph)))
        node.metadata_props.pop(RULE_NAME_TAG, None)
    return report


def _stamp_precision(model: ir.Model, precision: str, report: RewriteReport, where: _Where) -> None:
    """``attention_precision=precision`` on every ort_flash attention node of every graph (the
    nodes fp32_precision is stamped on, and GroupQueryAttention's) whose attention runs in
    FP8_DTYPES; the report names them and says how many others keep their dtype. A node's
    attention dtype is Q's (or the packed QKV's), else Y's."""
    report.attention_precision = precision
    others: dict[str, int] = {}
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.domain != flash_op.DOMAIN or node.op_type not in _PRECISION_OPS:
            continue
        dtype = node.inputs[0].dtype if node.inputs and node.inputs[0] is not None else None
        if dtype is None and node.outputs:
            dtype = node.outputs[0].dtype
        if dtype not in FP8_DTYPES:
            name = "float32" if dtype == ir.DataType.FLOAT else dtype.name.lower() if dtype else "unknown-dtype"
            others[name] = others.get(name, 0) + 1
            continue
        node.attributes[PRECISION_ATTRIBUTE] = ir.AttrString(PRECISION_ATTRIBUTE, precision)
        report.fp8_nodes.append(qualified(where.label(node.graph), node.name))
    if others:
        counted = ", ".join(f"{n} {name}" for name, n in others.items())
        report.notes.append(f"{counted} attention node(s) not stamped for FP8 keep their dtype: the FP8 "
                            "path takes float16 / bfloat16 attention")


_ATTENTION_NODES = {("", "Attention"), ("ai.onnx", "Attention"),
                    ("com.microsoft", "MultiHeadAttention"), ("com.microsoft", "GroupQueryAttention")}


def _worth_reporting(family: str, reason: str) -> bool:
    """A refinement that had nothing to do is not a decline."""
    if family == packed_qkv.FAMILY:
        return not reason.startswith(packed_qkv.NOTHING_TO_DO)
    if family == bias_fold.FAMILY:
        return not reason.startswith(bias_fold.NOTHING_TO_DO)
    if family == merge_reshape.FAMILY:  # declined, the Reshapes stay: views, on the GPU no kernel
        return False
    return not (family == causal_mask.FAMILY and reason in (
        "the node is already causal", "the mask is already a compact key-padding mask"))


def _all_nodes(model: ir.Model):
    yield from ir.traversal.RecursiveGraphIterator(model.graph)
    for function in model.functions.values():
        yield from ir.traversal.RecursiveGraphIterator(function)


def _dead_nodes(graph: ir.Graph) -> list[ir.Node]:
    return [
        n for n in graph
        if n.outputs and all(not o.uses() and not o.is_graph_output() for o in n.outputs)
    ]


def _remove_new_dead_nodes(model: ir.Model, dead_before: set[ir.Node],
                           used: dict[ir.Graph, set[str]]) -> None:
    """Drop what fed only the replaced subgraphs (a scale Constant or initializer), in every
    graph; keep the rest."""
    for graph, names in used.items():
        while True:
            dead = [n for n in _dead_nodes(graph) if n not in dead_before]
            if not dead:
                break
            graph.remove(dead, safe=True)
        for name in names:
            value = graph.initializers.get(name)
            if value is None:
                continue
            if not value.uses() and not value.is_graph_input() and not value.is_graph_output():
                graph.initializers.pop(name)


def _restore_interface(out: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """Inputs, outputs and value_info exactly as the user's model had them (not the inferred),
    in the main graph and in every subgraph: a graph the original lacks keeps none."""
    originals = dict(subgraphs(original.graph))
    for key, graph in subgraphs(out.graph):
        source = originals.get(key, onnx.GraphProto())
        for field in ("input", "output"):
            by_name = {v.name: v for v in getattr(source, field)}
            for value in getattr(graph, field):
                if value.name in by_name:
                    value.CopyFrom(by_name[value.name])
        produced = {o for n in graph.node for o in n.output}
        kept = [v for v in source.value_info if v.name in produced]
        graph.ClearField("value_info")
        graph.value_info.extend(kept)
    out.ir_version = original.ir_version


def _ensure_opset(out: onnx.ModelProto, domain: str, version: int) -> None:
    for opset in out.opset_import:
        if opset.domain == domain:
            opset.version = version
            return
    out.opset_import.append(onnx.helper.make_opsetid(domain, version))
