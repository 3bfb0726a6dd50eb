"""Attention over a 3-D (N, S, D) view, N = B·H (nn.MultiheadAttention's bmm path, baddbmm),
fused by matmul_softmax_attention as the op's 4-D form with batch 1 and N heads:

    Q (N, Sq, D)  Kᵀ (N, D, Skv)  V (N, Skv, Dv)  [M rank 3 (N|1, Sq|1, Skv)]
    Y = Squeeze(FlashAttention(Unsqueeze(Q, 0), Unsqueeze(K, 0), Unsqueeze(V, 0)
                               [, Unsqueeze(M, 0)]), 0)

Each of the N slices is its own attention in both forms (the op's heads do not mix), so this is
the same function; Unsqueeze / Squeeze only add or drop a size-1 axis.
"""

from __future__ import annotations

import onnx_ir as ir
import numpy as np


def key_source(kt: ir.Value) -> tuple[ir.Value, list[int] | None]:
    """K (N, Skv, D) for Kᵀ (N, D, Skv): Transpose(K, [0, 2, 1])'s input, else a new Transpose."""
    node = kt.producer()
    if node is not None and node.op_type == "Transpose" and node.domain == "" and len(kt.uses()) == 1:
        perm = node.attributes.get("perm")
        if perm is not None and list(perm.as_ints()) == [0, 2, 1]:
            return node.inputs[0], None
    return kt, [0, 2, 1]


def unsqueeze(op, value: ir.Value, name: str) -> ir.Value:
    axes = op.Constant(value=ir.tensor(np.array([0], np.int64)))
    axes.producer().name, axes.name = name + "_axes", name + "_axes_output_0"
    out = op.Unsqueeze(value, axes)
    out.producer().name, out.name = name, name + "_output_0"
    out.type = value.type
    if value.shape is not None:
        out.shape = ir.Shape([1, *value.shape.dims])
    return out


def squeeze(op, y: ir.Value, like: ir.Value, name: str) -> ir.Value:
    axes = op.Constant(value=ir.tensor(np.array([0], np.int64)))
    axes.producer().name, axes.name = name + "_axes", name + "_axes_output_0"
    out = op.Squeeze(y, axes)
    out.producer().name = name
    out.shape, out.type = like.shape, like.type
    return out


def lift(op, value: ir.Value | None, name: str) -> ir.Value | None:
    """A rank-3 mask term (N|1, Sq|1, Skv) as rank 4; lower ranks broadcast as they are."""
    if value is None or value.shape is None or len(value.shape) != 3:
        return value
    return unsqueeze(op, value, name)
