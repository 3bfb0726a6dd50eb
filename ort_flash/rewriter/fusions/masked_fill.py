"""The masked_fill form of a mask, as eager attention writes it (GPT-2, DistilBERT):

    S' = Where(keep, S, c)   or   Where(hide, c, S)        (c = finfo.min or -inf)

inside matmul_softmax_attention's chain (flag ``fill``), before any additive mask. The fused op
gets the additive mask ``Where(keep, 0, c)`` (``Where(hide, c, 0)``) instead: its hidden scores
become s + c, and in the op's float32 arithmetic s + c rounds to c itself for every score with
|s| < 2^103 (c = float32 min; and exactly for c = -inf), so the score matrix the softmax sees is
the original's, an added mask included (c + m is c or -inf either way).

A larger finite c (float16's -65504) does not absorb the scores: a row whose every key is hidden
averages V over its keys in the original and would not in the op, so by default such a form is
declined with that reason. With ``exact_masked_rows=False`` a c at or below -65504 is taken as
-inf (the op's mask hides those keys outright): a row with a visible key whose largest visible
score m exceeds c + 104 is the same function (the original's hidden weights exp(c - m) are 0 in
float32, as the op's are), and a row whose every key is hidden gives 0 (the op's rule) instead of
the original's average; the fused node's note says so.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from ort_flash.rewriter.onnxscript_api import MatchFailureError

ABSORBS = -1.0e30  # at or below: s + c == c in float32 for any score the op can see
LOWEST_FAST = float(np.finfo(np.float16).min)  # at or below: -inf with exact_masked_rows=False
FAST = "exact_masked_rows=False takes it as -inf"  # the opt-in, as the report names it (CLI_WORDS)


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


def note(c: float) -> str:
    """What differs where a fill ``c`` was taken as -inf (the fused node's report note)."""
    return (f"masked_fill value {c:g} taken as -inf (exact_masked_rows=False): query rows whose "
            "every key is hidden give 0, where the original averages V over the hidden keys")


def fill_value(cond: ir.Value | None, fill: ir.Value | None, *,
               exact_masked_rows: bool = True) -> tuple[float, float]:
    """(c of the Where, the value the op's mask gets for it), checked; cond must be a bool tensor."""
    if cond is None or cond.dtype != ir.DataType.BOOL:
        raise MatchFailureError("the masked_fill condition is not a bool tensor")
    tensor = None if fill is None or fill.is_graph_input() else ir.convenience.get_const_tensor(fill)
    if tensor is None or tensor.numpy().size != 1:
        raise MatchFailureError("the masked_fill value is not a constant scalar")
    c = float(tensor.numpy().reshape(()))
    if c == -math.inf or c <= ABSORBS:
        return c, c
    if c <= LOWEST_FAST and not exact_masked_rows:
        return c, -math.inf
    why = (f"the masked_fill value {c:g} does not absorb the scores (s + c != c in float32): "
           "rows whose every key is hidden would differ")
    if c <= LOWEST_FAST:
        raise MatchFailureError(f"{why} (kept by default; {FAST})")
    raise MatchFailureError(f"{why}; a value above {LOWEST_FAST:g} is not taken as -inf even "
                            "with exact_masked_rows=False")


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
