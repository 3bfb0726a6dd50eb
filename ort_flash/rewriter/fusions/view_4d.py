"""Attention computed on 3-D (N, S, D) views, N = B·H, whose scores are viewed as 4-D
(B, H, Sq, Skv) around the Softmax (BLOOM: ``alibi.baddbmm(q, kᵀ)``, ``.view(B, H, Sq, Skv)``,
masked_fill, softmax, ``.view(B·H, Sq, Skv)``, ``bmm(·, v)``); matmul_softmax_attention's flag
``view4d`` matches

    S3 = MatMul(Q3, Kᵀ3) [scale] [+ A3]     Reshape(S3, (B, H, Sq, Skv)) [fill] [+ M4]
    P3 = Reshape(Softmax(·), (N, Sq, Skv))  Y3 = MatMul(P3, V3)

and fuses it on 4-D views of its inputs with the static head count H:

    X4 = Reshape(X3, (-1, H, S, D)) for Q, K, V;  A4 = the same view of A3 (or Unsqueeze(A3, 0)
    for a bias shared by all N);  Y3 = Reshape(FlashAttention(Q4, K4, V4, A4 + M4), (-1, Sq, Dv))

A row-major Reshape of (N, ...) to (B, H, ...) with N = B·H maps slice n to (n // H, n % H), the
same for the scores, the inputs and the output, so each slice's attention is unchanged.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ort_flash.rewriter.onnxscript_api import MatchFailureError
from ort_flash.rewriter.shapes import Unprovable, equal, is_one, value_dims


def check(scores3: ir.Value, scores4: ir.Value, probs3: ir.Value) -> int:
    """H, where the view is (N, Sq, Skv) -> (B, H, Sq, Skv) -> (N, Sq, Skv) with N = B·H."""
    try:
        s3, s4, p3 = value_dims(scores3), value_dims(scores4), value_dims(probs3)
    except Unprovable as e:
        raise MatchFailureError(str(e)) from e
    if (len(s3), len(s4), len(p3)) != (3, 4, 3):
        raise MatchFailureError(f"the 4-D view of the scores has ranks {len(s3)}/{len(s4)}/{len(p3)}")
    if not (equal(s4[0] * s4[1], s3[0]) and equal(s4[2], s3[1]) and equal(s4[3], s3[2])
            and all(equal(a, b) for a, b in zip(p3, s3))):
        raise MatchFailureError(f"the scores' 4-D view {list(s3)} -> {list(s4)} -> {list(p3)} "
                                "is not (B·H, Sq, Skv) -> (B, H, Sq, Skv) and back")
    if not s4[1].is_Integer:
        raise MatchFailureError(f"the head count of the 4-D view ({s4[1]}) is not a number")
    return int(s4[1])


def check_bias(bias: ir.Value, n) -> None:
    try:
        d = value_dims(bias)
    except Unprovable as e:
        raise MatchFailureError(str(e)) from e
    if len(d) == 3 and not (equal(d[0], n) or is_one(d[0])):
        raise MatchFailureError(f"the 3-D bias's first dim {d[0]} is neither B·H ({n}) nor 1")


def _const(op, array, name: str) -> ir.Value:
    value = op.Constant(value=ir.tensor(np.array(array, np.int64)))
    value.producer().name, value.name = name, name + "_output_0"
    return value


def _reshape(op, x: ir.Value, lead: list[int], keep: tuple[int, int], name: str, shape=None):
    tail = op.Shape(x, start=keep[0], end=keep[1])
    tail.producer().name, tail.name = name + "_tail", name + "_tail_output_0"
    target = op.Concat(_const(op, lead, name + "_lead"), tail, axis=0)
    target.producer().name, target.name = name + "_shape", name + "_shape_output_0"
    out = op.Reshape(x, target)
    out.producer().name, out.name = name, name + "_output_0"
    out.type = x.type
    if shape is not None:
        out.shape = shape
    return out


def to_4d(op, x: ir.Value, heads: int, name: str, like4: tuple | None = None) -> ir.Value:
    """(N, S, D) as (N / H, H, S, D); a 3-D term with N = 1 as (1, 1, S, D)."""
    d = list(x.shape.dims) if x.shape is not None else None
    if d is not None and len(d) == 3 and d[0] == 1:
        axes = _const(op, [0], name + "_axes")
        out = op.Unsqueeze(x, axes)
        out.producer().name, out.name = name, name + "_output_0"
        out.type, out.shape = x.type, ir.Shape([1, *d])
        return out
    shape = ir.Shape([like4[0], heads, *d[1:]]) if d is not None and like4 is not None else None
    return _reshape(op, x, [-1, heads], (1, 3), name, shape)


def to_3d(op, y4: ir.Value, like3: ir.Value, name: str) -> ir.Value:
    out = _reshape(op, y4, [-1], (2, 4), name, like3.shape)
    out.type = like3.type
    return out
