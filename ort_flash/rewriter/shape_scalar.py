"""A value computed at run time only from constants and static dims, evaluated once.

Exporters of ``F.scaled_dot_product_attention`` with ``scale=None`` (torch's SDPA
decomposition, Optimum's GPT-2) write the scale as ``Sqrt(1 / Sqrt(Cast(Shape(q)[-1])))`` on Q
and on Kᵀ; eager code writes ``Div(scores, Sqrt(Cast(Shape(q)[-1])))``. Once the inferred shapes
say the head dim is a number, such a value is a constant: ``evaluate`` computes it with numpy in
the graph's own dtypes (IEEE-exact for the ops here, as ONNX Runtime computes them), or returns
None where any input is neither a constant nor a static dim.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

_MAX_DEPTH = 24
_MAX_SIZE = 64


def evaluate(value: ir.Value | None, depth: int = 0) -> np.ndarray | None:
    if value is None or value.is_graph_input() or depth > _MAX_DEPTH:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is not None:
        array = tensor.numpy()
        return array if array.size <= _MAX_SIZE else None
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Shape":
        return _shape(node)
    handler = _OPS.get(node.op_type)
    if handler is None:
        return None
    args = [None if i is None else evaluate(i, depth + 1) for i in node.inputs]
    if any(a is None and i is not None for a, i in zip(args, node.inputs)):
        return None
    try:
        out = handler(node, *args)
    except (ValueError, IndexError, TypeError):
        return None
    if out is None or np.asarray(out).size > _MAX_SIZE:
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


def _attr(node, name, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def _cast(node, x):
    if x.dtype == object and any(v is None for v in x.reshape(-1)):
        return None
    return x.astype(ir.DataType(_attr(node, "to")).numpy())


def _binary(fn):
    def op(node, a, b):
        if a.dtype != b.dtype or a.dtype == object:
            return None
        return fn(a, b).astype(a.dtype)
    return op


def _gather(node, data, idx):
    return np.take(data, idx.astype(np.int64), axis=_attr(node, "axis", 0))


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
    return tuple(int(a) for a in (axes if axes is not None else _attr(node, "axes", [])))


_OPS = {
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
    "Concat": lambda node, *xs: np.concatenate(xs, axis=_attr(node, "axis", 0)),
    "ConstantOfShape": _constant_of_shape,
}
