"""Abstract evaluation of the ONNX ops that exporters build attention masks from (lookups and
index tensors in lookups).

``Evaluator(graph_inputs)(value)`` returns the ``AV`` (domain) of ``value`` by evaluating
its producers; any op or form it does not model raises ``Unprovable`` with the reason.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import sympy as sp

from ort_flash.rewriter.mask_prover import values as mask_values
from ort_flash.rewriter.mask_prover.combine import combine
from ort_flash.rewriter.mask_prover.domain import (
    AV, TRUE, Aff, All, AnyOf, Flattened, Le, Not, Nonzero, Select, Val, Vec, aff_index,
    broadcast_to, const_like, const_value, fl, is_const, is_pred, le_of, nonzero_coefs, remap,
    select_to_pred, shift,
)
from ort_flash.rewriter.mask_prover.lookups import Lookups, _attr
from ort_flash.rewriter.shapes import Unprovable, equal, is_one, value_dims


class Evaluator(Lookups):
    def __init__(self, graph_inputs: set[str]) -> None:
        self.graph_inputs = graph_inputs
        self.memo: dict[ir.Value, AV] = {}

    def __call__(self, value: ir.Value) -> AV:
        if value not in self.memo:
            self.memo[value] = self._eval(value)
        return self.memo[value]

    def _eval(self, value: ir.Value) -> AV:
        tensor = ir.convenience.get_const_tensor(value)
        if tensor is not None and not value.is_graph_input():
            return _constant(tensor.numpy(), value)
        node = value.producer()
        if node is None:
            if value.name in self.graph_inputs:
                dims = value_dims(value)
                return AV(dims, Val(value.name, tuple(aff_index(k, len(dims)) for k in range(len(dims)))))
            raise Unprovable(f"{value.name!r} is neither a graph input nor a constant")
        handler = getattr(self, f"_op_{node.op_type}", None)
        if node.domain not in ("", "ai.onnx") or handler is None:
            raise Unprovable(f"the mask is built with {node.op_type}, which the analysis does not model")
        return handler(node, value)

    # ---- structure

    def _op_Identity(self, node, out):
        return self(node.inputs[0])

    def _op_Shape(self, node, out):
        dims = value_dims(node.inputs[0])
        start, end = _attr(node, "start", 0), _attr(node, "end", None)
        return AV((sp.Integer(len(dims[start:end])),), Vec(dims[start:end]))

    def _op_Cast(self, node, out):
        x = self(node.inputs[0])
        to = ir.DataType(_attr(node, "to"))
        c = x.c
        value = mask_values.cast_value(c, node.inputs[0].dtype, to)
        if value is not None:
            return AV(x.dims, value)
        if to == ir.DataType.BOOL:
            if is_const(c):
                return AV(x.dims, TRUE if const_value(c) != 0 else AnyOf(()))
            if isinstance(c, Val):
                return AV(x.dims, Nonzero(c.name, c.index))
            if isinstance(c, Select):
                return AV(x.dims, select_to_pred(c))
            if is_pred(c):
                return x
        elif to.is_floating_point():
            if isinstance(c, Aff) and is_const(c):
                return AV(x.dims, Select(TRUE, float(const_value(c)), float(const_value(c))))
            if is_pred(c):
                return AV(x.dims, Select(c, 1.0, 0.0))
            if isinstance(c, Select):
                dtype = to.numpy()
                return AV(x.dims, Select(c.pred, float(np.array(c.a).astype(dtype)),
                                         float(np.array(c.b).astype(dtype)), c.merged))
        elif isinstance(c, (Aff, Vec, Val)):
            return x
        raise Unprovable(f"Cast of a {type(c).__name__} to {to} is not modelled")

    def _op_Unsqueeze(self, node, out):
        x = self(node.inputs[0])
        dims = value_dims(out)
        if isinstance(x.c, Aff) and not x.dims and len(dims) == 1:
            return AV(dims, Vec((x.c.const,)))
        axes = [a % len(dims) for a in _axes(node)]
        mapping = [k for k in range(len(dims)) if k not in axes]
        return AV(dims, remap(x.c, mapping, len(dims)))

    def _op_Squeeze(self, node, out):
        x = self(node.inputs[0])
        dims = value_dims(out)
        if isinstance(x.c, Vec) and len(x.c.items) == 1 and not dims:
            return AV((), Aff(x.c.items[0], ()))
        axes = _axes(node)
        axes = [a % len(x.dims) for a in axes] if axes else [k for k, d in enumerate(x.dims) if is_one(d)]
        mapping, n = [], 0
        for k in range(len(x.dims)):
            if k in axes:
                mapping.append(None)
            else:
                mapping.append(n)
                n += 1
        return AV(dims, remap(x.c, mapping, len(dims)))

    def _op_Expand(self, node, out):
        x = self(node.inputs[0])
        dims = value_dims(out)
        return AV(dims, broadcast_to(x, dims))

    def _op_Reshape(self, node, out):
        x = self(node.inputs[0])
        dims = value_dims(out)
        if is_const(x.c):
            return AV(dims, const_like(x.c, len(dims)))
        if isinstance(x.c, Flattened):
            x = AV(x.c.dims, x.c.inner)
        mapping = _squeeze_mapping(x.dims, dims)
        if mapping is not None:
            return AV(dims, remap(x.c, mapping, len(dims)))
        if len(dims) == 1:
            return AV(dims, Flattened(x.c, x.dims))
        raise Unprovable(f"Reshape {list(x.dims)} -> {list(dims)} reorders elements")

    def _op_Tile(self, node, out):
        """Tile that only repeats size-1 axes is a broadcast."""
        x = self(node.inputs[0])
        dims = value_dims(out)
        if len(dims) != len(x.dims):
            raise Unprovable("Tile changes the rank")
        for d, o in zip(x.dims, dims):
            if not (equal(d, o) or is_one(d)):
                raise Unprovable("Tile repeats an axis longer than 1")
        return AV(dims, broadcast_to(x, dims))

    def _op_Slice(self, node, out):
        """Slices with constant, non-negative starts and unit steps shift the index."""
        x = self(node.inputs[0])
        if is_const(x.c) and not isinstance(x.c, Vec):
            dims = value_dims(out)
            return AV(dims, const_like(x.c, len(dims)))
        args = [self(i).c if i is not None else None for i in node.inputs[1:5]]
        starts, _, axes, steps = (args + [None] * 4)[:4]
        if isinstance(x.c, Vec):
            if not (isinstance(starts, Vec) and isinstance(args[1], Vec) and len(x.dims) == 1):
                raise Unprovable("Slice of a shape with non-constant bounds")
            a, b = int(starts.items[0]), int(min(args[1].items[0], 2**62))
            return AV(value_dims(out), Vec(x.c.items[a:b]))
        if not isinstance(starts, Vec) or (steps is not None and any(
                not equal(v, 1) for v in getattr(steps, "items", [None]))):
            raise Unprovable("Slice with non-constant starts or steps other than 1")
        rank = len(x.dims)
        axes = [int(a) % rank for a in axes.items] if isinstance(axes, Vec) else list(range(len(starts.items)))
        by = [sp.Integer(0)] * rank
        for axis, start in zip(axes, starts.items):
            if not sp.ask(sp.Q.nonnegative(start)):
                raise Unprovable("Slice with a negative start")
            by[axis] = start
        return AV(value_dims(out), shift(x.c, by))

    def _op_Range(self, node, out):
        start, _, delta = (self(i) for i in node.inputs)
        for v in (start, delta):
            if not isinstance(v.c, Aff) or v.dims:
                raise Unprovable("Range with a non-scalar start or delta")
        return AV(value_dims(out), Aff(start.c.const, (delta.c.const,)))

    def _op_ConstantOfShape(self, node, out):
        attr = node.attributes.get("value")
        array = attr.as_tensor().numpy() if attr is not None else np.zeros(1, np.float32)
        dims = value_dims(out)
        return AV(dims, const_like(_constant(array.reshape(()), out).c, len(dims)))

    def _op_Trilu(self, node, out):
        x = self(node.inputs[0])
        k = self(node.inputs[1]).c.const if len(node.inputs) > 1 and node.inputs[1] is not None else 0
        if not (isinstance(x.c, Select) and x.c.pred == TRUE and x.c.a == x.c.b):
            raise Unprovable("Trilu of a tensor that is not constant")
        r = len(x.dims)
        i, j = aff_index(r - 2, r), aff_index(r - 1, r)
        if _attr(node, "upper", 1):  # keep j >= i + k  <=>  i - j + k <= 0
            keep = Le(tuple(a - b for a, b in zip(i.coefs, j.coefs)), sp.sympify(k))
        else:  # keep j <= i + k  <=>  j - i - k <= 0
            keep = Le(tuple(b - a for a, b in zip(i.coefs, j.coefs)), -sp.sympify(k))
        return AV(x.dims, Select(keep, x.c.a, 0.0))

    # ---- arithmetic and logic

    def _binary(self, node, out):
        dims = value_dims(out)
        a, b = (self(i) for i in node.inputs[:2])
        vecs = [isinstance(x.c, Vec) for x in (a, b)]
        if all(vecs) or (any(vecs) and not any(isinstance(x.c, Aff) and x.c.coefs and
                                               any(nonzero_coefs(x.c.coefs)) for x in (a, b))):
            return AV(dims, _vec_arith(node.op_type, a.c, b.c))
        a, b = (_vec1_as_aff(x) for x in (a, b))
        return dims, broadcast_to(a, dims), broadcast_to(b, dims)

    def _op_Add(self, node, out):
        return self._arith(node, out, lambda p, q: p + q)

    def _op_Sub(self, node, out):
        return self._arith(node, out, lambda p, q: p - q)

    def _op_Mul(self, node, out):
        return self._arith(node, out, lambda p, q: p * q)

    def _op_Div(self, node, out):
        return self._arith(node, out, lambda p, q: p / q)

    def _arith(self, node, out, fn):
        r = self._binary(node, out)
        if isinstance(r, AV):
            return r
        dims, a, b = r
        if isinstance(a, Aff) and isinstance(b, Aff):
            if node.op_type in ("Add", "Sub"):
                return AV(dims, Aff(fn(a.const, b.const), tuple(fn(p, q) for p, q in zip(a.coefs, b.coefs))))
            if node.op_type == "Mul":
                const, other = (a, b) if not any(nonzero_coefs(a.coefs)) else (b, a)
                if any(nonzero_coefs(const.coefs)):
                    raise Unprovable("product of two index tensors")
                return AV(dims, Aff(other.const * const.const, tuple(c * const.const for c in other.coefs)))
        if isinstance(a, Select) and isinstance(b, Select):
            if b.pred == TRUE and b.a == b.b:
                return AV(dims, Select(a.pred, fl(fn, a.a, b.a), fl(fn, a.b, b.a), a.merged))
            if a.pred == TRUE and a.a == a.b:
                return AV(dims, Select(b.pred, fl(fn, a.a, b.a), fl(fn, a.a, b.b), b.merged))
        value = mask_values.arith(node.op_type, a, b)
        if value is None and isinstance(a, Select) and isinstance(b, Select):
            value = combine(lambda p, q: fl(fn, p, q), a, b)
        if value is not None:
            return AV(dims, value)
        raise Unprovable(f"{node.op_type} of {type(a).__name__} and {type(b).__name__} is not modelled")

    def _compare(self, node, out, lhs_minus_rhs_plus):
        r = self._binary(node, out)
        if isinstance(r, AV):
            raise Unprovable("comparison of shape vectors")
        dims, a, b = r
        if not (isinstance(a, Aff) and isinstance(b, Aff)):
            raise Unprovable(f"{node.op_type} of non-index tensors")
        return AV(dims, lhs_minus_rhs_plus(a, b))

    def _op_LessOrEqual(self, node, out):  # a <= b
        return self._compare(node, out, lambda a, b: le_of(a, b, 0))

    def _op_Less(self, node, out):  # a < b  <=>  a - b + 1 <= 0
        return self._compare(node, out, lambda a, b: le_of(a, b, 1))

    def _op_GreaterOrEqual(self, node, out):
        return self._compare(node, out, lambda a, b: le_of(b, a, 0))

    def _op_Greater(self, node, out):
        return self._compare(node, out, lambda a, b: le_of(b, a, 1))

    def _op_Equal(self, node, out):
        value = mask_values.sum_is_zero(self, node, value_dims(out))
        if value is not None:
            return AV(value_dims(out), value)
        r = self._binary(node, out)
        if isinstance(r, AV):
            raise Unprovable("Equal of shape vectors")
        dims, a, b = r
        if isinstance(a, Aff) and isinstance(b, Aff):
            return AV(dims, All((le_of(a, b, 0), le_of(b, a, 0))))
        if isinstance(b, Select) and b.pred == TRUE and isinstance(a, Select):
            a, b = b, a
        if isinstance(a, Select) and a.pred == TRUE and isinstance(b, Select):
            c = a.a
            if b.a == c and b.b != c:
                return AV(dims, b.pred)
            if b.b == c and b.a != c:
                return AV(dims, Not(b.pred))
        value = combine(lambda p, q: p == q, a, b) if isinstance(a, Select) else None
        if value is None:
            value = mask_values.equal_const(a, b)
        if value is not None:
            return AV(dims, value)
        raise Unprovable("Equal of this form is not modelled")

    def _logic(self, node, out, cls):
        dims = value_dims(out)
        terms = [broadcast_to(self(i), dims) for i in node.inputs]
        if not all(is_pred(t) for t in terms):
            raise Unprovable(f"{node.op_type} of non-boolean tensors")
        return AV(dims, cls(tuple(terms)))

    def _op_And(self, node, out):
        return self._logic(node, out, All)

    def _op_Or(self, node, out):
        return self._logic(node, out, AnyOf)

    def _op_Not(self, node, out):
        x = self(node.inputs[0])
        if not is_pred(x.c):
            raise Unprovable("Not of a non-boolean tensor")
        return AV(x.dims, Not(x.c))

    def _op_Where(self, node, out):
        dims = value_dims(out)
        cond, a, b = (broadcast_to(self(i), dims) for i in node.inputs)
        if isinstance(a, Select) and isinstance(b, Select) and is_pred(cond):
            if a.pred == TRUE and a.a == a.b and b.pred == TRUE and b.a == b.b:
                return AV(dims, Select(cond, a.a, b.a))
        if is_pred(a) and is_pred(b) and is_pred(cond):
            return AV(dims, AnyOf((All((cond, a)), All((Not(cond), b)))))
        value = mask_values.where(cond, a, b) if is_pred(cond) else None
        if value is None and is_pred(cond):
            value = combine(lambda c, p, q: p if c else q, cond, a, b)
        if value is not None:
            return AV(dims, value)
        raise Unprovable("Where of this form is not modelled")

# ---------------------------------------------------------------- helpers


def _axes(node: ir.Node) -> list[int]:
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        t = ir.convenience.get_const_tensor(node.inputs[1])
        if t is None:
            raise Unprovable(f"{node.op_type} axes are not constant")
        return [int(a) for a in t.numpy().reshape(-1)]
    return list(_attr(node, "axes", []) or [])


def _constant(array: np.ndarray, value: ir.Value) -> AV:
    dims = tuple(sp.Integer(d) for d in array.shape)
    if array.dtype == np.bool_:
        if array.size and (array.all() or not array.any()):
            return AV(dims, TRUE if array.all() else AnyOf(()))
        return AV(dims, select_to_pred(_table(array.astype(np.float64), dims)))
    elif np.issubdtype(array.dtype, np.integer):
        if array.ndim == 0:
            return AV(dims, Aff(sp.Integer(int(array)), ()))
        if array.ndim == 1:
            return AV(dims, Vec(tuple(sp.Integer(int(i)) for i in array)))
    elif np.issubdtype(array.dtype, np.floating) or array.dtype.kind == "V":
        flat = array.astype(np.float64).reshape(-1)
        if flat.size and (flat == flat[0]).all():
            return AV(dims, Select(TRUE, float(flat[0]), float(flat[0])))
        return AV(dims, _table(array.astype(np.float64), dims))
    raise Unprovable(f"constant {value.name!r} of shape {list(array.shape)} is not modelled")


def _table(array: np.ndarray, dims: tuple):
    """A constant 2-D (or broadcast) table that is a lower-triangular select of two values."""
    if array.ndim < 2:
        raise Unprovable("a non-uniform constant vector is not modelled")
    square = array.reshape(array.shape[-2:]) if array.size == array.shape[-1] * array.shape[-2] else None
    if square is None:
        raise Unprovable("a constant table with more than two non-unit dims is not modelled")
    n, m = square.shape
    lower = np.tril(np.ones((n, m), bool))
    inside, outside = square[lower], square[~lower]
    if inside.size and outside.size and (inside == inside[0]).all() and (outside == outside[0]).all():
        r = len(dims)
        i, j = aff_index(r - 2, r), aff_index(r - 1, r)
        keep = Le(tuple(b - a for a, b in zip(i.coefs, j.coefs)), sp.Integer(0))
        return Select(keep, float(inside[0]), float(outside[0]))
    raise Unprovable("a constant table that is not lower-triangular is not modelled")


def _vec1_as_aff(av: AV) -> AV:
    """A one-entry shape vector as a rank-1 constant, so it broadcasts against index tensors."""
    if isinstance(av.c, Vec):
        if len(av.c.items) != 1:
            raise Unprovable("arithmetic of a shape vector and an index tensor")
        return AV((sp.Integer(1),), Aff(av.c.items[0], (sp.Integer(0),)))
    return av


def _vec_arith(op: str, a, b) -> Vec:
    def items(c):
        if isinstance(c, Vec):
            return list(c.items)
        if isinstance(c, Aff) and not c.coefs:
            return [c.const]
        raise Unprovable("shape arithmetic with a non-constant tensor")

    x, y = items(a), items(b)
    if len(x) == 1:
        x = x * len(y)
    if len(y) == 1:
        y = y * len(x)
    fn = {"Add": lambda p, q: p + q, "Sub": lambda p, q: p - q, "Mul": lambda p, q: p * q}.get(op)
    if fn is None or len(x) != len(y):
        raise Unprovable(f"shape arithmetic {op} is not modelled")
    return Vec(tuple(fn(p, q) for p, q in zip(x, y)))


def _squeeze_mapping(src: tuple, dst: tuple) -> list | None:
    """For a Reshape that only inserts or removes size-1 axes: where each source axis goes."""
    src_big = [k for k, d in enumerate(src) if not is_one(d)]
    dst_big = [k for k, d in enumerate(dst) if not is_one(d)]
    if len(src_big) != len(dst_big) or not all(equal(src[s], dst[t]) for s, t in zip(src_big, dst_big)):
        return None
    mapping = [None] * len(src)
    for s, t in zip(src_big, dst_big):
        mapping[s] = t
    return mapping


# ---------------------------------------------------------------- classification
