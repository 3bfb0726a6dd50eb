# Rule: the head split / merge around attention absorbed into FlashAttention's 3-D layout, so no
# Transpose is left around the op (BERT, GPT-2, ViT, BART, Whisper, T5: every attention whose Q
# is not rotated in the BNSH layout).
#
#   xq (B, Sq, Hq·D)   xk (B, Skv, Hkv·D)   xv (B, Skv, Hkv·Dv)
#   Reshape(·, (B, S, H, D)) → Transpose(perm=[0, 2, 1, 3])            for each of the three
#   Y4 = ort_flash.FlashAttention(Q, K, V, ...)                        (B, Hq, Sq, Dv)
#   T = Transpose(Y4 | Reshape(Y4, its own shape), perm=[0, 2, 1, 3])  (B, Sq, Hq, Dv)
#
# becomes
#
#   Y = ort_flash.FlashAttention(xq, xk, xv, ..., q_num_heads = Hq, kv_num_heads = Hkv)
#   T = Reshape(Y, [0, 0, Hq, Dv])                                     (a view, no copy)
#
# A KV-cache node (kv_cache: past_key/past_value in, present_key/present_value out) takes the
# same rewrite: ONNX Attention keeps past and present 4-D (B, Hkv, S, D) whatever the layout of
# K and V, and present = past ++ (K split to heads), so only the new K/V change form.
#
# The op's 3-D form is defined as exactly this split (reshape to (B, S, H, D), heads to axis 1)
# and its 3-D output as the merge (B, Sq, Hq, Dv) -> (B, Sq, Hq·Dv), so T is Y viewed with the
# heads split again; whatever reshaped T (to (B, Sq, Hq·Dv) or (B·Sq, Hq·Dv)) reads the same
# elements in the same order. Every dim is proven from the inferred shapes (the Reshape targets
# only split the last axis), and a mask keeps broadcasting to (B, Hq, Sq, Skv) unchanged.
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ort_flash.rewriter.onnxscript_api import fail
from ort_flash.rewriter.refinements.base import Refinement, flash_pattern
from ort_flash.rewriter.refinements.head_shapes import HeadSplitShape
from ort_flash.rewriter.shapes import Unprovable, equal, value_dims

FAMILY = "layout_3d"
_HEADS_TO_AXIS1 = [0, 2, 1, 3]


class Layout3d(Refinement):
    family = FAMILY
    has_present_variant = True

    def __init__(self, *, same_shape_reshape: bool, present: bool = False) -> None:
        super().__init__("reshape" if same_shape_reshape else "", present=present)
        self.same_shape_reshape = same_shape_reshape

    def pattern(self, op, xq, xk, xv, sq, sk, sv, sy):
        q = op.Transpose(op.Reshape(xq, sq, _allow_other_attributes=True), perm=_HEADS_TO_AXIS1)
        k = op.Transpose(op.Reshape(xk, sk, _allow_other_attributes=True), perm=_HEADS_TO_AXIS1)
        v = op.Transpose(op.Reshape(xv, sv, _allow_other_attributes=True), perm=_HEADS_TO_AXIS1)
        y = flash_pattern(op, q, k, v, present=self.present)
        if self.present:
            y, present_key, present_value = y
        if self.same_shape_reshape:  # HF's SDPA path reshapes Y to its own shape first
            y = op.Reshape(y, sy, _allow_other_attributes=True)
        t = op.Transpose(y, perm=_HEADS_TO_AXIS1)
        return (t, present_key, present_value) if self.present else t

    def analyze(self, context, node, xq, xk, xv, **_):
        try:
            hq, d = _split(node.inputs[0], xq, "Q")
            hk, dk = _split(node.inputs[1], xk, "K")
            hv, dv = _split(node.inputs[2], xv, "V")
            xqd = value_dims(xq)
        except Unprovable as e:
            fail(str(e))
        if hk != hv:
            fail(f"K has {hk} heads and V {hv}")
        if d != dk:
            fail(f"head dims of Q ({d}) and K ({dk}) differ")
        out_t = _output_transpose(context, node)
        if self.same_shape_reshape:
            same = out_t.inputs[0]
            try:
                before, after = value_dims(same.producer().inputs[0]), value_dims(same)
            except Unprovable as e:
                fail(str(e))
            if len(before) != len(after) or not all(equal(a, b) for a, b in zip(before, after)):
                fail(f"the Reshape of Y {list(before)} -> {list(after)} changes its shape")
        y = node.outputs[0]
        y3 = ir.Value(shape=ir.Shape([_dim(xqd[0]), _dim(xqd[1]), hq * dv]), type=y.type)
        return {"node": node, "hq": hq, "hkv": hk, "dv": dv, "y3": y3,
                "t": out_t.outputs[0]}

    def rewrite(self, op, xq, xk, xv, **_):
        plan, self._plan = self._plan, None
        y = self.emit(op, plan["node"], {"Q": xq, "K": xk, "V": xv},
                      {"q_num_heads": plan["hq"], "kv_num_heads": plan["hkv"]},
                      {"layout": "BSD"}, output=plan["y3"])
        presents = ()
        if self.present:
            y, *presents = y
        shape = op.Constant(value=ir.tensor(np.array([0, 0, plan["hq"], plan["dv"]], np.int64)))
        shape.producer().name = plan["node"].name + "_heads"
        t = op.Reshape(y, shape)
        t.producer().name = plan["node"].name + "_split_heads"
        t.shape, t.type = plan["t"].shape, plan["t"].type
        return (t, *presents) if self.present else t


def rules() -> list:
    """The Shape rewrite first (so the Transposes have no other uses), then the layout."""
    return [HeadSplitShape()] + [Layout3d(same_shape_reshape=same, present=p)
                                 for same in (True, False) for p in (False, True)]


def _output_transpose(context, node: ir.Node) -> ir.Node:
    """The matched Transpose that merges Y's heads (after the same-shape Reshape, if any)."""
    y = node.outputs[0]
    for n in context.nodes:
        if n.op_type != "Transpose" or not n.inputs or n.inputs[0] is None:
            continue
        src = n.inputs[0]
        if src is y or (src.producer() is not None and src.producer().op_type == "Reshape"
                        and src.producer().inputs[0] is y):
            return n
    fail("no Transpose of Y in the match")


def _split(bnsh: ir.Value, x: ir.Value, name: str) -> tuple[int, int]:
    """(H, D) for bnsh = Transpose(Reshape(x (B, S, H·D), (B, S, H, D)), [0, 2, 1, 3])."""
    reshaped = bnsh.producer().inputs[0]
    xd, rd = value_dims(x), value_dims(reshaped)
    if len(xd) != 3 or len(rd) != 4:
        fail(f"{name} is split from rank {len(xd)} to rank {len(rd)}, not 3 to 4")
    h, d = rd[2], rd[3]
    if not (h.is_Integer and d.is_Integer):
        fail(f"{name}'s heads ({h}) or head dim ({d}) is not a constant")
    if not (equal(rd[0], xd[0]) and equal(rd[1], xd[1]) and equal(xd[2], h * d)):
        fail(f"{name}'s Reshape {list(xd)} -> {list(rd)} is not a split of the last axis")
    return int(h), int(d)


def _dim(d):
    return int(d) if d.is_Integer else str(d)
