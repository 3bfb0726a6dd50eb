"""Shape facts the rules rely on: inference on a copy, and provable dim equality."""

from __future__ import annotations

import logging

import onnx
import onnx_ir as ir

from ort_flash.rewriter.subgraphs import rename, subgraphs, unique_names

_log = logging.getLogger(__name__)


def infer_shapes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """A copy of ``model`` whose values carry inferred types and shapes, and how they were got.

    ONNX Runtime's symbolic shape inference (sympy) names dims consistently across
    Reshape/Concat/Shape arithmetic, which is what proves that a mask broadcasts. First it runs
    with ``auto_merge=False``, assuming nothing. Real exports often stop it early (BERT adds
    position embeddings sliced to ``Min(512, sequence)`` to ``sequence``-long ones), so next it
    runs with ``auto_merge=True``, which takes two symbolic dims that the model broadcasts
    against each other to be equal (as ONNX Runtime's own transformer fusions do); the report
    says so. Last comes ONNX's inference with data propagation, whose dims are often unnamed,
    so fewer fusions can be proven.

    Each subgraph is inferred on its own: the tools run on a copy whose subgraph values have
    names unique in the model (``subgraphs.unique_names``; ONNX's data propagation keeps one
    table by name, so sibling If branches that share names read each other's shapes), and only
    the types and shapes come back, into a copy of ``model`` with its own nodes and names.
    """
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    inverse = unique_names(renamed)
    inferred, how = _infer(renamed)
    _take_types(renamed, inferred)
    rename(renamed, inverse)
    return renamed, how


def _infer(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    for auto_merge in (False, True):
        try:
            inferred, complete, merged = _symbolic_shapes(model, auto_merge)
        except Exception as e:  # the tool raises bare Exceptions for what it cannot handle
            _log.info("symbolic shape inference (auto_merge=%s) failed: %s", auto_merge, e)
            continue
        if complete:
            assumed = ", ".join(f"{a} = {b}" for a, b in merged.items())
            return inferred, f"symbolic, assuming {assumed}" if assumed else "symbolic"
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True), "onnx"
    except Exception as e:
        _log.info("onnx shape inference failed (%s); shapes stay as given", e)
        return model, "none"


def _take_types(model: onnx.ModelProto, inferred: onnx.ModelProto) -> None:
    """Give every value ``model`` computes (in any graph) its type from ``inferred``, whose names
    are unique in the model; the tools may reorder or copy nodes, so nothing else is taken."""
    if inferred is model:
        return
    facts: dict[str, onnx.ValueInfoProto] = {}
    for _, graph in subgraphs(inferred.graph):
        for v in (*graph.value_info, *graph.output, *graph.input):
            if v.type.WhichOneof("value") is not None:
                facts.setdefault(v.name, v)
    for key, graph in subgraphs(model.graph):
        produced = [o for n in graph.node for o in n.output if o]
        given = {v.name: v for v in graph.value_info}
        infos = [facts.get(n) or given.get(n) for n in produced]
        graph.ClearField("value_info")
        graph.value_info.extend(v for v in infos if v is not None)
        for value in (*graph.output, *(graph.input if key else ())):
            if value.name in facts:
                value.type.CopyFrom(facts[value.name].type)


def _symbolic_shapes(model: onnx.ModelProto, auto_merge: bool) -> tuple[onnx.ModelProto, bool, dict]:
    """``SymbolicShapeInference.infer_shapes`` without its side effects: where inference is
    incomplete (an op it does not know, such as a custom one) the tool raises after writing
    ``sym_shape_infer_temp.onnx`` plus external data into the current directory, and it logs
    warnings. Here it returns the partial result, whether it is complete and the dims it
    merged (taken as equal); nothing is written or printed."""
    from onnxruntime.tools import symbolic_shape_infer as ssi

    tool_log = logging.getLogger(ssi.__name__)
    level = tool_log.level
    tool_log.setLevel(logging.CRITICAL)
    try:
        inference = ssi.SymbolicShapeInference(
            int_max=2**31 - 1, auto_merge=auto_merge, guess_output_rank=False, verbose=0
        )
        inference._preprocess(model)  # works on a copy
        complete = False
        while inference.run_:
            complete = inference._infer_impl()
        inference._update_output_from_vi()
        merged = {str(a): str(b) for a, b in inference.suggested_merge_.items() if a != b}
        return inference.out_mp_, bool(complete), merged
    finally:
        tool_log.setLevel(level)


def known_int(dim: int | ir.SymbolicDim | None) -> int | None:
    return dim if isinstance(dim, int) else None


def same_dim(a: int | ir.SymbolicDim | None, b: int | ir.SymbolicDim | None) -> bool:
    """True only when ``a`` and ``b`` are provably the same size at run time."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, ir.SymbolicDim) and isinstance(b, ir.SymbolicDim):
        return a.value is not None and a.value == b.value
    return False


def dim_text(dim: int | ir.SymbolicDim | None) -> str:
    if isinstance(dim, int):
        return str(dim)
    if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
        return dim.value
    return "?"


def dims(value: ir.Value | None) -> tuple | None:
    """The dims of ``value`` as a tuple (ints or SymbolicDims), or None if the rank is unknown."""
    if value is None or value.shape is None:
        return None
    return tuple(value.shape.dims)


def report_int(dim: int | ir.SymbolicDim | None) -> int | str:
    """An int for the report where the dim is a known number, else "?"."""
    return dim if isinstance(dim, int) else "?"
