# Rule: the three projections of one input into Q, K and V packed into one MatMul, whose output
# FlashAttention reads in place (the self-attention of BERT, ViT, T5 and BART: ONNX
# Runtime's Attention op packs its QKV weights the same way); and (PackedSplit) Q, K and V that
# are one Split of such a tensor (GPT-2's c_attn) read from the tensor itself.
#
#   Q = Add(MatMul(x, Wq), bq)   K = Add(MatMul(x, Wk), bk)   V = Add(MatMul(x, Wv), bv)   (any Add may be absent)
#   Y = ort_flash.FlashAttention(Q, K, V, mask..., q_num_heads = Hq, kv_num_heads = Hkv)    (3-D)
#
# becomes
#
#   QKV = Add(MatMul(x, [Wq | Wk | Wv]), [bq | bk | bv])       (B, S, (Hq + 2 Hkv) * D)
#                                          (zeros for a missing bias; no Add where none has one)
#   Y = ort_flash.FlashAttention(QKV, , , mask..., q_num_heads = Hq, kv_num_heads = Hkv)
#
# The op's packed form (K and V omitted) reads Q, K and V as views into each token's row, so the
# three GEMMs become one and the three bias Adds one, and nothing is copied. Every output element
# of the packed MatMul is the dot product one of the three MatMuls computed (the weights' columns
# side by side).
# Proven: x is the same value for all three, the weights and biases are constants (initializers
# that are not graph inputs, or Constant nodes) of shapes (hidden, H * D) and (H * D,), every intermediate feeds only its
# successor here, and D is a multiple of 8 (the packed layout's alignment). Self-attention only:
# K and V must be the same tokens as Q, which the shared x proves.
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ort_flash.rewriter.onnxscript_api import fail
from ort_flash.rewriter.refinements.base import Refinement, flash_pattern
from ort_flash.rewriter.shapes import attr

FAMILY = "packed_qkv"
_PARTS = ("Q", "K", "V")
# Reasons that say the node is not a packable self-attention at all (cross-attention, a cache,
# inputs that are no projections): not reported as declines, as a rule with nothing to do.
NOTHING_TO_DO = ("the node has a KV cache", "Q, K and V are not in the 3-D layout",
                 "Q, K and V are projections of different inputs", "Q is not a MatMul projection",
                 "K is not a MatMul projection", "V is not a MatMul projection")


class PackedQkv(Refinement):
    family = FAMILY

    def __init__(self) -> None:
        super().__init__()
        self._count = 0

    def pattern(self, op, q, k, v):
        return flash_pattern(op, q, k, v)

    def analyze(self, context, node, q, k, v, **_):
        hq, hkv = _packable_heads(node)
        projections = [_projection(value, name) for value, name in zip((q, k, v), _PARTS)]
        x = projections[0][0]
        if any(p[0] is not x for p in projections[1:]):
            fail("Q, K and V are projections of different inputs (not self-attention)")
        widths = [p[1].shape[1] for p in projections]
        _head_size(widths, hq, hkv, "projection widths")
        if len({p[1].dtype for p in projections}) != 1:
            fail("the projection weights differ in type")
        biased = [p[2] for p in projections if p[2] is not None]
        if any(b.dtype != projections[0][1].dtype for b in biased):
            fail("a bias differs in type from the weights")
        # A projection without a bias gets zeros in the packed bias: x + 0 = x.
        return {"node": node, "x": x, "w": [p[1] for p in projections],
                "b": [p[2] for p in projections] if biased else None, "width": sum(widths)}

    def rewrite(self, op, **_):
        plan, self._plan = self._plan, None
        node = plan["node"]
        base = f"{node.name}_qkv"
        w = np.concatenate([t.numpy() for t in plan["w"]], axis=1)
        packed = op.MatMul(plan["x"], op.initializer(ir.tensor(w), name=f"{base}_weight_{self._unique()}"))
        packed.producer().name = f"{base}_MatMul"
        if plan["b"] is not None:
            b = np.concatenate([np.zeros(part.shape[1], w.dtype) if t is None else t.numpy()
                                for t, part in zip(plan["b"], plan["w"])], axis=0)
            packed = op.Add(packed, op.initializer(ir.tensor(b), name=f"{base}_bias_{self._unique()}"))
            packed.producer().name = f"{base}_Add"
        x_shape = plan["x"].shape
        if x_shape is not None and len(x_shape) == 3:
            packed.shape = ir.Shape([x_shape[0], x_shape[1], plan["width"]])
        packed.type = node.inputs[0].type
        return self.emit(op, node, {"Q": packed, "K": None, "V": None}, {}, {"layout": "packed"})

    def _unique(self) -> int:
        self._count += 1
        return self._count


class PackedSplit(Refinement):
    """Q, K and V as the three outputs of one Split of x's last axis (GPT-2's c_attn projects once,
    then splits): the op reads x itself as packed QKV, and the Split's copy goes."""
    family = FAMILY

    def __init__(self) -> None:
        super().__init__("split")

    def pattern(self, op, x):
        q, k, v = op.Split(x, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=3)
        return flash_pattern(op, q, k, v)

    def analyze(self, context, node, x, **_):
        hq, hkv = _packable_heads(node)
        split = node.inputs[0].producer()
        if list(split.outputs) != list(node.inputs[:3]):
            fail("Q, K and V are not the Split's outputs in order")
        for value, name in zip(split.outputs, _PARTS):
            if len(value.uses()) != 1 or value.is_graph_output():
                fail(f"the Split's {name} output has other uses")
        xd = x.shape
        if xd is None or len(xd) != 3:
            fail("the split input is not 3-D")
        axis = attr(split, "axis", 0)
        if axis not in (2, -1):
            fail(f"the Split is along axis {axis}, not the last")
        _head_size(_split_sizes(split, xd, hq, hkv), hq, hkv, "split sizes")
        return {"node": node, "x": x}

    def rewrite(self, op, **_):
        plan, self._plan = self._plan, None
        return self.emit(op, plan["node"], {"Q": plan["x"], "K": None, "V": None}, {}, {"layout": "packed"})


def rules() -> list:
    return [PackedQkv(), PackedSplit()]


def _packable_heads(node: ir.Node) -> tuple[int, int]:
    """(Hq, Hkv) of a node the packed form can take: the 3-D layout and no KV cache."""
    if len(node.inputs) > 4 and any(i is not None for i in node.inputs[4:6]):
        fail("the node has a KV cache (past_key / past_value)")
    hq, hkv = attr(node, "q_num_heads"), attr(node, "kv_num_heads")
    if not hq or not hkv:
        fail("Q, K and V are not in the 3-D layout (no q_num_heads / kv_num_heads)")
    return hq, hkv


def _head_size(widths: list[int], hq: int, hkv: int, what: str) -> int:
    """D for Q, K, V widths (Hq * D, Hkv * D, Hkv * D), D a multiple of 8 (the packed layout's
    alignment)."""
    d = widths[0] // hq
    if widths[0] % hq or widths[1] != widths[2] or widths[1] != hkv * d:
        fail(f"{what} {widths} are not ({hq}, {hkv}, {hkv}) heads of one size")
    if d % 8:
        fail(f"head size {d} is not a multiple of 8 (the packed layout's alignment)")
    return d


def _split_sizes(split: ir.Node, x_shape, hq: int, hkv: int) -> list[int]:
    """The Split's three sizes: its constant split input (opset 13+), its split attribute, or
    three equal parts of a static last axis (num_outputs)."""
    if len(split.inputs) > 1 and split.inputs[1] is not None:
        tensor = _constant(split.inputs[1])
        if tensor is None:
            fail("the Split's sizes are not a constant")
        sizes = [int(n) for n in tensor.numpy().reshape(-1)]
    elif attr(split, "split") is not None:
        sizes = [int(n) for n in attr(split, "split")]
    else:
        width = x_shape[2]
        if not isinstance(width, int) or width % 3 or hq != hkv:
            fail("the Split has no sizes and the packed width is not three equal static parts")
        sizes = [width // 3] * 3
    if len(sizes) != 3:
        fail(f"the Split has {len(sizes)} sizes, not 3")
    return sizes


def _projection(value: ir.Value, name: str):
    """(x, W, b or None) for value = Add(MatMul(x, W), b) or MatMul(x, W), each step
    used only by the next, W and b constants."""
    producer = value.producer()
    bias = None
    if producer is not None and producer.op_type == "Add" and producer.domain in ("", "ai.onnx"):
        if len(value.uses()) != 1 or value.is_graph_output():
            fail(f"{name}'s bias Add has other uses")
        a, c = producer.inputs
        mm, bias = (a, c) if _constant(c) is not None else (c, a)
        bias = _constant(bias)
        if bias is None:
            fail(f"{name}'s Add has no constant bias")
        value, producer = mm, mm.producer()
    if producer is None or producer.op_type != "MatMul" or producer.domain not in ("", "ai.onnx"):
        fail(f"{name} is not a MatMul projection (or its bias Add)")
    if len(value.uses()) != 1 or value.is_graph_output():
        fail(f"{name}'s MatMul has other uses")
    x, w_value = producer.inputs
    w = _constant(w_value)
    if w is None or len(w.shape) != 2:
        fail(f"{name}'s MatMul weight is not a constant matrix")
    if bias is not None and (len(bias.shape) != 1 or bias.shape[0] != w.shape[1]):
        fail(f"{name}'s bias of shape {list(bias.shape)} is not one value per output column")
    if bias is not None and bias.dtype != w.dtype:
        fail(f"{name}'s bias and weight differ in type")
    return x, w, bias


def _constant(value: ir.Value | None):
    """The tensor of an initializer that is not a graph input (so the user cannot feed another) or
    of a Constant node, through Identity nodes (torch.onnx.export shares equal weights so), else
    None."""
    while value is not None and value.producer() is not None and value.producer().op_type == "Identity":
        value = value.producer().inputs[0]
    if value is None or value.is_graph_input():
        return None
    producer = value.producer()
    if producer is not None:  # a Constant node's tensor
        if producer.op_type == "Constant" and producer.domain in ("", "ai.onnx") and "value" in producer.attributes:
            return producer.attributes["value"].value
        return None
    return value.const_value
