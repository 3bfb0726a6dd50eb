"""A mask input's values turned into floats, as transformers' padding masks do it.

``Where(Cast(bool, 1 - Cast(float, mask)), finfo.min, 0)`` hides key j where
``float(mask[b, j]) - 1 != 0``, that is where ``mask[b, j] != 1``. These helpers give the
evaluator (evaluator.py) that meaning exactly, for any input values (not only 0/1):

- ``Cast(float, input)`` is ``FDiff(value=0)`` (exact for an integer or bool input, and for a
  float input cast to a type at least as wide);
- ``c - x``, ``x - c``, ``x + c`` of that are ``FDiff(value=c | c | -c)``: an IEEE sum or
  difference of two floats is zero exactly where they are equal;
- ``Cast(bool, FDiff)`` is ``Not(Eq(input, value))``; ``Where(that, c, FDiff)`` (torch's
  ``inverted.masked_fill(inverted.bool(), min)``) is ``Select(that, c, 0)``, as the FDiff is 0
  wherever the condition is false; ``Equal(x + float(input), 0)`` for a two-valued x
  (transformers' ``(causal_mask + attention_mask[:, None, None, :]) == 0``) is
  ``input == -x`` in each branch of x (an IEEE sum is zero exactly where its terms are
  opposite); any other use of an ``FDiff``'s value (a product, a second sum) is not modelled.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from ort_flash.rewriter.mask_prover.domain import (
    TRUE, All, AnyOf, Eq, FDiff, Not, Select, Val, broadcast_to, is_const,
)
from ort_flash.rewriter.shapes import Unprovable

_WIDTH = {ir.DataType.FLOAT16: 16, ir.DataType.BFLOAT16: 16, ir.DataType.FLOAT: 32,
          ir.DataType.DOUBLE: 64}


def cast_value(c, src: ir.DataType | None, to: ir.DataType):
    """Cast(to) of the input's values ``c`` (a Val or FDiff) from ``src``, or None."""
    if not isinstance(c, (Val, FDiff)):
        return None
    if to == ir.DataType.BOOL:
        return Not(Eq(c.name, c.index, c.value)) if isinstance(c, FDiff) else None
    if not to.is_floating_point() or src is None:
        return None
    exact = (src.is_integer() or src == ir.DataType.BOOL) if isinstance(c, Val) else False
    if not exact and _WIDTH.get(src, 99) > _WIDTH.get(to, 0):
        raise Unprovable(f"Cast of a mask input's values from {src} to {to} narrows them")
    return FDiff(c.name, c.index, c.value) if isinstance(c, FDiff) else FDiff(c.name, c.index, 0.0)


def arith(op_type: str, a, b):
    """``a op b`` where one side is an FDiff of value 0 and the other a constant, or None."""
    x, k = (a, b) if isinstance(a, FDiff) else (b, a)
    if not (isinstance(x, FDiff) and isinstance(k, Select) and k.pred == TRUE and k.a == k.b):
        return None
    if op_type not in ("Add", "Sub"):
        raise Unprovable(f"{op_type} of a mask input's values is not modelled (its result is "
                         "a mask only for some values of the input)")
    if x.value != 0.0:
        raise Unprovable("a second sum with a mask input's values is not modelled")
    c = k.a
    if not math.isfinite(c):
        raise Unprovable(f"{op_type} of a mask input's values and {c} is not modelled")
    if op_type == "Sub":
        return FDiff(x.name, x.index, c)  # c - x and x - c are zero where x == c
    return FDiff(x.name, x.index, -c)


def where(cond, a, b):
    """Where(cond, a, b) with an FDiff branch taken only where it is zero, or None."""
    for branch, other, taken_when in ((b, a, False), (a, b, True)):
        if not (isinstance(branch, FDiff) and isinstance(other, Select) and other.pred == TRUE
                and other.a == other.b):
            continue
        zero_where = Eq(branch.name, branch.index, branch.value)
        if cond == (zero_where if taken_when else Not(zero_where)):
            return Select(cond, 0.0, other.a) if taken_when else Select(cond, other.a, 0.0)
    return None


def sum_is_zero(evaluate, node, dims):
    """Equal(Add(x, float(input)), 0) (either order) as a predicate, or None."""
    for add_value, zero in (node.inputs, node.inputs[::-1]):
        z = evaluate(zero).c
        add = add_value.producer()
        if add is None or add.op_type != "Add" or not (is_const(z) and getattr(z, "a", None) == 0.0):
            continue
        a, b = (broadcast_to(evaluate(i), dims) for i in add.inputs)
        x, f = (a, b) if isinstance(b, FDiff) else (b, a)
        if not (isinstance(f, FDiff) and f.value == 0.0 and isinstance(x, Select)):
            continue
        if is_const(x):
            return Eq(f.name, f.index, -x.a)
        return AnyOf((All((x.pred, Eq(f.name, f.index, -x.a))),
                      All((Not(x.pred), Eq(f.name, f.index, -x.b)))))
    return None


def equal_const(a, b):
    """Equal(input, c) (DistilBERT's ``mask == 0``) as Eq(input, c), or None."""
    x, k = (a, b) if isinstance(a, Val) else (b, a)
    if not isinstance(x, Val):
        return None
    if isinstance(k, Select) and k.pred == TRUE and k.a == k.b:
        return Eq(x.name, x.index, float(k.a))
    if type(k).__name__ == "Aff" and not any(k.coefs):
        return Eq(x.name, x.index, float(k.const))
    return None
