"""The masked_fill form of a mask, as eager attention writes it (GPT-2, DistilBERT):

    S' = Where(keep, S, c)   or   Where(hide, c, S)        (c = finfo(float32).min or -inf)

inside matmul_softmax_attention's chain (flag ``fill``), before any additive mask. The fused op
gets the additive mask ``Where(keep, 0, c)`` (``Where(hide, c, 0)``) instead: its hidden scores
become s + c, and in the op's float32 arithmetic s + c rounds to c itself for every score with
|s| < 2^103 (c = float32 min; and exactly for c = -inf), so the score matrix the softmax sees is
the original's, an added mask included (c + m is c or -inf either way). A larger c (float16's
-65504) does not absorb the scores: rows whose every key is hidden would differ, so such a form
is declined with that reason.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchFailureError

ABSORBS = -1.0e30  # at or below: s + c == c in float32 for any score the op can see


def fill_pattern(op, scores, cond, fill, cond_x, shaped):
    """Also DistilBERT's Where(Cast(Expand(x, Shape(S)), bool), c, S) (``expand_as(scores)``):
    the Shape of the scores is then part of the match (``shaped`` must be S: checked), and the
    op gets x, which broadcasts."""
    expanded = op.Cast(op.Expand(cond_x, op.Shape(shaped)), to=ir.DataType.BOOL)
    return pattern.OrValue(  # the longer forms first: the first that matches is kept
        [op.Where(expanded, scores, fill), op.Where(expanded, fill, scores),
         op.Where(cond, scores, fill), op.Where(cond, fill, scores)],
        tag_var="fill_side", tag_values=["keep_expanded", "hide_expanded", "keep", "hide"])


def condition(cond: ir.Value | None, cond_x: ir.Value | None, side: str) -> ir.Value | None:
    """The condition the op's mask uses: cond, or the unexpanded x of an expanded one."""
    return cond_x if side.endswith("_expanded") else cond


def fill_value(cond: ir.Value | None, fill: ir.Value | None) -> float:
    """The value c of the Where, checked; cond must be a bool tensor."""
    if cond is None or cond.dtype != ir.DataType.BOOL:
        raise MatchFailureError("the masked_fill condition is not a bool tensor")
    tensor = None if fill is None or fill.is_graph_input() else ir.convenience.get_const_tensor(fill)
    if tensor is None or tensor.numpy().size != 1:
        raise MatchFailureError("the masked_fill value is not a constant scalar")
    c = float(tensor.numpy().reshape(()))
    if not (c == -math.inf or c <= ABSORBS):
        raise MatchFailureError(
            f"the masked_fill value {c:g} does not absorb the scores (s + c != c in float32): "
            "rows whose every key is hidden would differ")
    return c


def fill_mask(op, cond: ir.Value, c: float, side: str, dtype: ir.DataType, prefix: str) -> ir.Value:
    """Where(keep, 0, c) or Where(hide, c, 0) in ``dtype``: the additive form of the fill."""
    zero = op.Constant(value=ir.tensor(np.array(0, dtype.numpy())))
    hidden = op.Constant(value=ir.tensor(np.array(c, dtype.numpy())))
    for value, name in ((zero, "fill_zero"), (hidden, "fill_hidden")):
        value.producer().name = prefix + name
        value.name = prefix + name + "_output_0"
    keep = side.startswith("keep")
    mask = op.Where(cond, zero, hidden) if keep else op.Where(cond, hidden, zero)
    mask.producer().name = prefix + "fill_mask"
    mask.name = prefix + "fill_mask_output_0"
    mask.type = ir.TensorType(dtype)
    if cond.shape is not None:
        mask.shape = cond.shape
    return mask


def broadcast_shape(a: ir.Shape | None, b: ir.Shape | None) -> ir.Shape | None:
    """The numpy broadcast of two shapes where every pair of dims is equal or 1, else None."""
    if a is None or b is None:
        return None
    da, db = list(a.dims), list(b.dims)
    n = max(len(da), len(db))
    da, db = [1] * (n - len(da)) + da, [1] * (n - len(db)) + db
    out = []
    for x, y in zip(da, db):
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        else:
            return None
    return ir.Shape(out)
