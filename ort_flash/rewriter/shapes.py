"""Shape facts the rules rely on (the rewriter's helper module, shared by every room):

- ``infer_shapes``: types and shapes inferred on a copy of the model;
- ``dims`` / ``known_int`` / ``same_dim`` / ``dim_text`` / ``report_int``: a value's dims as
  inferred (ints or named symbolic dims) and what can be said of them;
- ``value_dims`` / ``equal`` / ``is_one``: the same dims as sympy expressions, so that an equality
  such as ``2*batch == batch + batch`` is proven, never assumed; ``Unprovable`` where it cannot be;
- ``static_value``: a value computed at run time only from constants and static dims, evaluated
  once. Exporters of ``F.scaled_dot_product_attention`` with ``scale=None`` (torch's SDPA
  decomposition, Optimum's GPT-2) write the scale as ``Sqrt(1 / Sqrt(Cast(Shape(q)[-1])))`` on Q
  and on Kᵀ; eager code writes ``Div(scores, Sqrt(Cast(Shape(q)[-1])))``. Once the inferred
  shapes say the head dim is a number, such a value is a constant: ``static_value`` computes it
  with numpy in the graph's own dtypes (IEEE-exact for the ops here, as ONNX Runtime computes
  them), or returns None where any input is neither a constant nor a static dim;
- ``attr``: a node's attribute value, or a default.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import sympy as sp

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


def attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


# ---------------------------------------------------------------- symbolic dims


class Unprovable(Exception):
    """A fact (a dim equality, a mask's formula) could not be established; ``str(e)`` says where."""


def sym(dim) -> Any:
    """A dim as a sympy expression: symbolic shape inference names dims like "2*batch"."""
    if isinstance(dim, int):
        return sp.Integer(dim)
    if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
        return _parse_dim(dim.value)
    return None


@functools.lru_cache(maxsize=4096)
def _parse_dim(text: str) -> Any:
    """Names are positive integers; ``floor`` (of a quotient, as symbolic shape inference
    writes a Reshape's -1: "floor(64*batch*(p + s)/(32*p + 32*s))") is simplified inside."""
    names = set(re.findall(r"[A-Za-z_][A-Za-z_0-9.]*", text)) - {"floor"}
    symbols = {n: sp.Symbol(n, integer=True, positive=True) for n in names}
    if not names or not re.fullmatch(r"[A-Za-z_0-9.*+\-/ ()]+", text):
        return sp.Symbol(text, integer=True, positive=True)
    if "/" in text and "floor(" not in text:  # a bare quotient: not an integer dim we can read
        return sp.Symbol(text, integer=True, positive=True)
    try:
        expr = sp.sympify(text, locals={**symbols, "floor": sp.floor})
    except (sp.SympifyError, SyntaxError, TypeError):
        return sp.Symbol(text, integer=True, positive=True)
    return expr.replace(sp.floor, lambda arg: sp.floor(sp.cancel(arg)))


def value_dims(value: ir.Value) -> tuple:
    if value.shape is None:
        raise Unprovable(f"the shape of {value.name!r} is unknown")
    dims = tuple(sym(d) for d in value.shape.dims)
    if any(d is None for d in dims):
        raise Unprovable(f"a dim of {value.name!r} is unknown ({value.shape})")
    return dims


def equal(a, b) -> bool:
    return a is not None and b is not None and sp.simplify(a - b) == 0


def is_one(d) -> bool:
    return equal(d, sp.Integer(1))


# ---------------------------------------------------------------- static values


_STATIC_DEPTH = 24
_STATIC_SIZE = 64


def static_value(value: ir.Value | None, depth: int = 0) -> np.ndarray | None:
    """``value``'s contents where it is computed only from constants and static dims (the
    module docstring), else None."""
    if value is None or value.is_graph_input() or depth > _STATIC_DEPTH:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is not None:
        array = tensor.numpy()
        return array if array.size <= _STATIC_SIZE else None
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Shape":
        return _shape(node)
    handler = _STATIC_OPS.get(node.op_type)
    if handler is None:
        return None
    args = [None if i is None else static_value(i, depth + 1) for i in node.inputs]
    if any(a is None and i is not None for a, i in zip(args, node.inputs)):
        return None
    try:
        out = handler(node, *args)
    except (ValueError, IndexError, TypeError):
        return None
    if out is None or np.asarray(out).size > _STATIC_SIZE:
        return None
    out = np.asarray(out)
    if out.dtype == object:  # slices of a shape: known only if every dim is
        return out if any(v is None for v in out.reshape(-1)) else out.astype(np.int64)
    return out


def _shape(node: ir.Node) -> np.ndarray | None:
    shape = node.inputs[0].shape
    if shape is None:
        return None
    dims = list(shape.dims)
    start, end = (node.attributes.get(n) for n in ("start", "end"))
    dims = dims[slice(start.as_int() if start else None, end.as_int() if end else None)]
    if all(isinstance(d, int) for d in dims):
        return np.array(dims, np.int64)
    # symbolic dims as None: a Slice / Gather may drop them; any arithmetic on one fails
    return np.array([d if isinstance(d, int) else None for d in dims], object)


def _cast(node, x):
    if x.dtype == object and any(v is None for v in x.reshape(-1)):
        return None
    return x.astype(ir.DataType(attr(node, "to")).numpy())


def _binary(fn):
    def op(node, a, b):
        if a.dtype != b.dtype or a.dtype == object:
            return None
        return fn(a, b).astype(a.dtype)
    return op


def _gather(node, data, idx):
    return np.take(data, idx.astype(np.int64), axis=attr(node, "axis", 0))


def _slice(node, data, starts, ends, axes=None, steps=None):
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * data.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[int(a)] = slice(int(s), int(min(e, 2**62)) if e >= 0 else int(e), int(st))
    return data[tuple(index)]


def _constant_of_shape(node, shape):
    attr = node.attributes.get("value")
    fill = attr.as_tensor().numpy().reshape(-1)[0] if attr is not None else np.float32(0)
    return np.full([int(d) for d in shape], fill, dtype=np.asarray(fill).dtype)


def _axes(node, axes):
    return tuple(int(a) for a in (axes if axes is not None else attr(node, "axes", [])))


_STATIC_OPS = {
    "Identity": lambda node, x: x,
    "Cast": _cast,
    "Sqrt": lambda node, x: np.sqrt(x) if x.dtype.kind == "f" else None,
    "Reciprocal": lambda node, x: (np.ones((), x.dtype) / x).astype(x.dtype),
    "Neg": lambda node, x: -x,
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Div": _binary(lambda a, b: np.divide(a, b) if a.dtype.kind == "f" else None),
    "Pow": lambda node, a, b: np.power(a, b.astype(a.dtype)).astype(a.dtype),
    "Gather": _gather,
    "Slice": _slice,
    "Squeeze": lambda node, x, axes=None: np.squeeze(x, _axes(node, axes) or None),
    "Unsqueeze": lambda node, x, axes=None: np.expand_dims(x, _axes(node, axes)),
    "Reshape": lambda node, x, shape: x.reshape([int(s) for s in shape]),
    "Concat": lambda node, *xs: np.concatenate(xs, axis=attr(node, "axis", 0)),
    "ConstantOfShape": _constant_of_shape,
}
