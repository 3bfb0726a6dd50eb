"""Shapes read through the head split / repeat around a FlashAttention node.

Exporters read sizes of the head-split Q/K/V (``Shape(Transpose(Reshape(x)))``), of repeated
K/V and of the 4-D attention output to build later shapes. Those reads would keep the Reshape /
Transpose / Expand chains alive beside a refined node, so ``HeadSplitShape`` computes each such
Shape from the unsplit tensor instead, exactly:

    Shape(Transpose(t, p))                          = Shape(t) permuted by p
    Shape(Reshape(x (B, S, H·D), (B, S, H, D)))     = (B, S, H, D): B, S read from x, H, D constants
    Shape(Reshape(Expand(Unsqueeze(x, 2)), ...))    = (B, Hkv·n, S, D): B, S, D read from x
    Shape(Y4 = FlashAttention(Q, ...))              = (B, Hq, Sq, Dv) from Q's, Dv a constant

(with Shape's start/end applied to the list). It runs before repeat_kv and layout_3d.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from ort_flash.rewriter.refinements.base import Refinement
from ort_flash.rewriter.shapes import Unprovable, equal, value_dims


class HeadSplitShape(Refinement):
    """Shape(v) for v a head-split Q/K/V (Reshape or Transpose) or a 4-D FlashAttention output,
    computed from the unsplit input instead: exporters read these sizes, which would keep the
    Reshape/Transpose chain alive beside the 3-D node. Shape(Transpose(t, p)) is Shape(t)
    permuted by p; Shape(Reshape(x (B, S, H·D), (B, S, H, D))) is (B, S, H, D) with B, S read
    from x and H, D constants; Y4 is (B, Hq, Sq, Dv)."""

    family = "head_split_shape"

    def pattern(self, op, t):
        return op.Shape(t, _allow_other_attributes=True)

    def check(self, context, t, **_):
        elements = _elements(t) if _near_flash(t) else None
        if elements is None or any(e[0] == "dim" and e[1] is t for e in elements):
            return pattern.MatchResult().fail("not the shape of a head split around FlashAttention")
        start, end = (context.root.attributes.get(n) for n in ("start", "end"))
        self._plan = elements[slice(start.value if start else None, end.value if end else None)]
        return pattern.MatchResult()

    def rewrite(self, op, t, **_):
        elements, self._plan = self._plan, None
        parts = []
        for element in elements:
            if element[0] == "const":
                parts.append(op.Constant(value=ir.tensor(np.array([element[1]], np.int64))))
            else:
                index = op.Constant(value=ir.tensor(np.array([element[2]], np.int64)))
                parts.append(op.Gather(op.Shape(element[1]), index, axis=0))
        return parts[0] if len(parts) == 1 else op.Concat(*parts, axis=0)


def _near_flash(t: ir.Value, depth: int = 2) -> bool:
    """t feeds a FlashAttention node through head-split ops, is one's output, or is another
    Transpose of a tensor that does (the exporter's original Kᵀ, kept alive by a Shape)."""
    node = t.producer()
    if node is None or depth < 0:
        return False
    if node.op_type == "FlashAttention":
        return True
    users = [u.node for u in t.uses()]
    if any(u.op_type == "FlashAttention" for u in users):
        return True
    if node.op_type == "Reshape":
        return any(u.op_type == "Transpose" and _near_flash(u.outputs[0], depth - 1) for u in users)
    if node.op_type == "Transpose":
        siblings = [u.node for u in node.inputs[0].uses() if u.node is not node]
        return any(s.op_type == "Transpose" and _near_flash(s.outputs[0], depth - 1) for s in siblings)
    return False


def _elements(t: ir.Value) -> list | None:
    """t's dims as ("dim", value, axis) / ("const", n), reading through head splits."""
    node = t.producer()
    try:
        td = value_dims(t)
    except Unprovable:
        return None
    own = [("dim", t, i) for i in range(len(td))]
    if node is None or node.domain not in ("", "ai.onnx", "ort_flash"):
        return own
    if node.op_type == "Transpose" and node.attributes.get("perm") is not None:
        inner = _elements(node.inputs[0])
        return [inner[p] for p in node.attributes["perm"].as_ints()] if inner else own
    if node.op_type == "Reshape":
        try:
            xd = value_dims(node.inputs[0])
        except Unprovable:
            return own
        if (len(xd), len(td)) == (3, 4) and td[2].is_Integer and td[3].is_Integer and equal(
                td[0], xd[0]) and equal(td[1], xd[1]) and equal(xd[2], td[2] * td[3]):
            x = node.inputs[0]
            return [("dim", x, 0), ("dim", x, 1), ("const", int(td[2])), ("const", int(td[3]))]
        return _repeated(node, td) or own
    if node.op_type == "FlashAttention" and len(td) == 4 and td[3].is_Integer:
        q = _elements(node.inputs[0])
        if q and len(q) == 4:
            return [q[0], q[1], q[2], ("const", int(td[3]))]
    return own


def _repeated(reshape: ir.Node, td: tuple) -> list | None:
    """Elements of Reshape(Expand(Unsqueeze(x, 2), (B, Hkv, n, S, D)), (B, Hkv·n, S, D))."""
    expand = reshape.inputs[0].producer()
    if expand is None or expand.op_type != "Expand":
        return None
    unsqueeze = expand.inputs[0].producer()
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze":
        return None
    x = unsqueeze.inputs[0]
    try:
        xd, ed = value_dims(x), value_dims(expand.outputs[0])
    except Unprovable:
        return None
    if (len(xd), len(ed), len(td)) != (4, 5, 4) or not td[1].is_Integer:
        return None
    if not (equal(ed[0], xd[0]) and equal(ed[1], xd[1]) and equal(ed[3], xd[2]) and equal(ed[4], xd[3])
            and equal(td[0], xd[0]) and equal(td[1], ed[1] * ed[2]) and equal(td[2], xd[2])
            and equal(td[3], xd[3])):
        return None
    return [("dim", x, 0), ("const", int(td[1])), ("dim", x, 2), ("dim", x, 3)]
