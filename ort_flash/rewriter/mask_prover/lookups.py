"""Lookups and index tensors in mask subgraphs: Flatten / Gather / GatherND of a mask input,
Concat of index columns, ScatterND over every index (the ``Lookups`` part of evaluator's
Evaluator; it calls ``self(value)`` to evaluate inputs)."""

from __future__ import annotations

import onnx_ir as ir
import sympy as sp

from ort_flash.rewriter.mask_prover.domain import (
    AV, Aff, Flat, Nonzero, Stack, Val, Vec, aff_index, broadcast_to, const_like, is_const,
    nonzero_coefs,
)
from ort_flash.rewriter.shapes import Unprovable, equal, is_one, value_dims


class Lookups:
    def _op_Flatten(self, node, out):
        x = self(node.inputs[0])
        if is_const(x.c):
            return AV(value_dims(out), const_like(x.c, 2))
        axis = _attr(node, "axis", 1) % (len(x.dims) + 1)
        identity = tuple(aff_index(k, len(x.dims)) for k in range(len(x.dims)))
        if len(x.dims) == 2 and axis == 2 and isinstance(x.c, (Val, Nonzero)) and x.c.index == identity:
            return AV(value_dims(out), Flat(x.c.name, x.dims, isinstance(x.c, Nonzero)))
        raise Unprovable("Flatten of this form is not modelled")

    def _op_Concat(self, node, out):
        parts = [self(i) for i in node.inputs]
        dims = value_dims(out)
        axis = _attr(node, "axis") % len(dims)
        if all(isinstance(p.c, Vec) for p in parts):
            return AV(dims, Vec(tuple(i for p in parts for i in p.c.items)))
        if axis == len(dims) - 1 and all(is_one(p.dims[-1]) for p in parts):
            items = []
            for p in parts:
                lead = broadcast_to(AV(p.dims[:-1], _drop_last(p)), dims[:-1])
                if not isinstance(lead, Aff):
                    raise Unprovable("Concat of non-integer index tensors")
                items.append(lead)
            return AV(dims, Stack(tuple(items)))
        raise Unprovable("Concat of this form is not modelled")

    def _op_Gather(self, node, out):
        data, idx = self(node.inputs[0]), self(node.inputs[1])
        axis = _attr(node, "axis", 0)
        if is_const(data.c) and not isinstance(data.c, Vec):
            dims = value_dims(out)
            return AV(dims, const_like(data.c, len(dims)))
        if isinstance(data.c, Vec) and isinstance(idx.c, (Aff, Vec)):
            items = data.c.items
            picks = [idx.c.const] if isinstance(idx.c, Aff) else list(idx.c.items)
            if isinstance(idx.c, Aff) and any(nonzero_coefs(idx.c.coefs)):
                raise Unprovable("Gather of a shape at a varying index")
            if not all(-len(items) <= int(i) < len(items) for i in picks):
                raise Unprovable("Gather index out of range")
            got = [items[int(i)] for i in picks]
            return AV(idx.dims, Aff(got[0], ()) if isinstance(idx.c, Aff) else Vec(tuple(got)))
        if isinstance(data.c, Flat) and axis == 0 and isinstance(idx.c, Aff):
            rows, cols = data.c.dims
            lookup = _split_flat_index(idx, rows, cols)
            index = tuple(Aff(a.const, a.coefs + (sp.Integer(0),)) for a in lookup)
            cls = Nonzero if data.c.nonzero else Val
            return AV(idx.dims + (sp.Integer(1),), cls(data.c.name, index))
        raise Unprovable("Gather of this form is not modelled")

    def _op_GatherND(self, node, out):
        data, idx = self(node.inputs[0]), self(node.inputs[1])
        if is_const(data.c):
            dims = value_dims(out)
            return AV(dims, const_like(data.c, len(dims)))
        identity = tuple(aff_index(k, len(data.dims)) for k in range(len(data.dims)))
        if (_attr(node, "batch_dims", 0) == 0 and isinstance(data.c, (Val, Nonzero))
                and data.c.index == identity and isinstance(idx.c, Stack)
                and len(idx.c.items) == len(data.dims)):
            for item, bound in zip(idx.c.items, data.dims):
                _check_in_range(item, idx.dims[:-1], bound)
            return AV(value_dims(out), type(data.c)(data.c.name, idx.c.items))
        raise Unprovable("GatherND of this form is not modelled")

    def _op_ScatterND(self, node, out):
        """ScatterND whose indices are every position of the data, in order, is its updates
        (transformers' causal_mask[..., :L] = ... with L the whole key length)."""
        data, idx, updates = (self(i) for i in node.inputs[:3])
        reduction = _attr(node, "reduction", "none")
        if reduction not in ("none", b"none") or not isinstance(idx.c, Stack):
            raise Unprovable("ScatterND of this form is not modelled")
        rank = len(data.dims)
        lead = idx.dims[:-1]
        if len(idx.c.items) != rank or len(lead) != rank:
            raise Unprovable("ScatterND that writes slices, not elements, is not modelled")
        for k, (item, d, n) in enumerate(zip(idx.c.items, data.dims, lead)):
            position = Aff(sp.Integer(0), (sp.Integer(0),) * rank) if is_one(d) else aff_index(k, rank)
            if not (isinstance(item, Aff) and _same_aff(item, position) and equal(d, n)):
                raise Unprovable("ScatterND that writes part of the tensor or reorders it")
        return AV(data.dims, broadcast_to(updates, data.dims))


def _attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    if a is None:
        return default
    return a.value if a.type != ir.AttributeType.INTS else list(a.as_ints())


def _drop_last(av: AV):
    c = av.c
    if isinstance(c, Aff):
        return Aff(c.const, c.coefs[:-1])
    raise Unprovable("Concat of non-integer tensors")


def _check_in_range(index: Aff, dims: tuple, bound) -> None:
    """``index`` is x[k] for one axis k whose dim is provably ``bound`` (so it stays in range)."""
    big = [k for k, c in enumerate(index.coefs) if not equal(c, sp.Integer(0))]
    if not (equal(index.const, sp.Integer(0)) and len(big) <= 1):
        raise Unprovable("a lookup index is not a plain position")
    if big and not (equal(index.coefs[big[0]], sp.Integer(1)) and equal(dims[big[0]], bound)):
        raise Unprovable(f"a lookup index does not provably span the input's dim {bound}")


def _split_flat_index(idx: AV, rows, cols) -> tuple[Aff, Aff]:
    """idx = cols·x[b] + x[j] with x[b] < rows and x[j] < cols: the (row, col) it addresses."""
    c = idx.c
    big = [k for k, v in enumerate(c.coefs) if not equal(v, sp.Integer(0))]
    if not equal(c.const, sp.Integer(0)) or len(big) != 2:
        raise Unprovable("a flat lookup index is not row·cols + col")
    one = [k for k in big if equal(c.coefs[k], sp.Integer(1))]
    stride = [k for k in big if equal(c.coefs[k], cols)]
    if len(one) != 1 or len(stride) != 1 or one == stride:
        raise Unprovable("a flat lookup index is not row·cols + col")
    r, q = stride[0], one[0]
    if not (equal(idx.dims[r], rows) and equal(idx.dims[q], cols)):
        raise Unprovable("a flat lookup index does not provably stay within its row")
    rank = len(c.coefs)
    return aff_index(r, rank), aff_index(q, rank)


def _same_aff(a: Aff, b: Aff) -> bool:
    return equal(a.const, b.const) and all(equal(p, q) for p, q in zip(a.coefs, b.coefs))
