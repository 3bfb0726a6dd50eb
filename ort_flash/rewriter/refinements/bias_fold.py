# Rule: the K and V biases of a packed QKV projection taken out of the attention's input, so that
# only Q keeps a bias Add (a third of the packed one's memory traffic).
#
#   QKV = Add(MatMul(x, [Wq | Wk | Wv]), [bq | bk | bv])              (packed_qkv's form)
#   Y   = ort_flash.FlashAttention(QKV, , , mask...)
#   out = (Reshape*)(Y) -> MatMul(., Wo) -> Add(., bo) | SkipLayerNormalization(., skip, g, b, bo)
#
# becomes
#
#   Q   = Add(MatMul(x, Wq), bq)        (no Add where bq is zero)
#   KV  = MatMul(x, [Wk | Wv])          (B, S, 2 Hkv * D): the op's packed KV form (V omitted)
#   Y'  = ort_flash.FlashAttention(Q, KV, , mask...)
#   out = (Reshape*)(Y') -> MatMul(., Wo) -> Add(., bo + bv' Wo) | SkipLayerNormalization(..., bo + bv' Wo)
#
# Why it is the same function:
# * K's bias adds q_i . bk to every score of query i: the same constant for all of i's keys,
#   which softmax does not see. So it goes, provided nothing else reads the scores: no softcap
#   (tanh is not shift-invariant) and no softmax_lse output (the refinement base requires Y alone).
# * V's bias adds bv to every value row; the weights of a row sum to one, so Y = Y' + bv (bv'
#   is bv repeated for the query heads of each KV head, in Y's head order). The output
#   projection is linear: (Y' + bv') Wo + bo = Y' Wo + (bo + bv' Wo), folded into its bias in
#   float64, then rounded once to the bias's type. The weights sum to one wherever a row attends
#   a key; rows attend none only through a bool mask, nonpad_kv_seqlen, a window or an all -inf
#   additive row, so the rule declines bool masks, key lengths and windows (an additive row that
#   is -inf on every key is NaN in the unfused model too; finite masks such as the rewriter's
#   -1e4 or finfo.min leave every row's weights summing to one).
# * The Reshapes between Y and the projection keep each token's row of Hq * D values in order:
#   Wo has Hq * D rows, so the MatMul contracts exactly that row.
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ort_flash.rewriter import flash_op
from ort_flash.rewriter.onnxscript_api import fail
from ort_flash.rewriter.refinements import packed_qkv
from ort_flash.rewriter.refinements.base import Refinement
from ort_flash.rewriter.shapes import attr

FAMILY = "bias_fold"
# Nodes that are not packed QKV with a bias Add: nothing to do, not a decline.
NOTHING_TO_DO = ("the node is not packed QKV", "the packed QKV has no bias Add")
MS_DOMAIN = "com.microsoft"


class BiasFold(Refinement):
    family = FAMILY

    def __init__(self) -> None:
        super().__init__()
        self._count = 0

    def pattern(self, op, qkv):
        return op.FlashAttention(qkv, _domain=flash_op.DOMAIN, _allow_other_inputs=True,
                                 _allow_other_attributes=True)

    def analyze(self, context, node, qkv, **_):
        inputs = list(node.inputs) + [None] * (7 - len(node.inputs))  # trailing omitted inputs are dropped
        if inputs[1] is not None or inputs[2] is not None:
            fail("the node is not packed QKV")
        producer = qkv.producer()
        if producer is None or producer.op_type != "Add" or producer.domain not in ("", "ai.onnx"):
            fail("the packed QKV has no bias Add")
        x, w, b = packed_qkv._projection(qkv, "QKV")
        if b is None:
            fail("the packed QKV has no bias Add")
        hq, hkv = attr(node, "q_num_heads"), attr(node, "kv_num_heads")
        d = w.shape[1] // (hq + 2 * hkv)
        if attr(node, "softcap", 0.0):
            fail("a softcap sees K's bias (tanh is not shift-invariant)")
        mask = inputs[3]
        if mask is not None and mask.dtype == ir.DataType.BOOL:
            fail("a bool mask can leave a row with no key, where V's bias is not added")
        if inputs[6] is not None:
            fail("nonpad_kv_seqlen can leave a row with no key, where V's bias is not added")
        if attr(node, "left_window_size", -1) >= 0 or attr(node, "right_window_size", -1) >= 0:
            fail("a window can leave a row with no key, where V's bias is not added")
        bias = b.numpy().astype(np.float64)
        bq, bv = bias[:hq * d], bias[(hq + hkv) * d:]
        # Y's head h reads KV head h // (Hq / Hkv): V's bias in Y's order.
        bv_y = np.repeat(bv.reshape(hkv, d), hq // hkv, axis=0).reshape(-1)
        target = _output_bias(node.outputs[0], hq * d)
        wo = target["wo"].numpy().astype(np.float64)
        bo = target["bo"].numpy().astype(np.float64) if target["bo"] is not None else 0.0
        folded = bo + bv_y @ wo
        dtype = b.numpy().dtype
        if not np.all(np.isfinite(folded.astype(dtype))):
            fail("the folded output bias overflows its type")
        return {"node": node, "x": x, "w": w.numpy(), "bq": bq if np.any(bq) else None,
                "hq": hq, "hkv": hkv, "d": d, "dtype": dtype, "folded": folded, **target}

    def rewrite(self, op, **_):
        plan, self._plan = self._plan, None
        node, w, hq, d, dtype = plan["node"], plan["w"], plan["hq"], plan["d"], plan["dtype"]
        base, n = f"{node.name}_qkv", self._unique()
        q = op.MatMul(plan["x"], op.initializer(ir.tensor(np.ascontiguousarray(w[:, :hq * d])),
                                                name=f"{base}_q_weight_{n}"))
        q.producer().name = f"{base}_q_MatMul"
        if plan["bq"] is not None:
            q = op.Add(q, op.initializer(ir.tensor(plan["bq"].astype(dtype)), name=f"{base}_q_bias_{n}"))
            q.producer().name = f"{base}_q_Add"
        kv = op.MatMul(plan["x"], op.initializer(ir.tensor(np.ascontiguousarray(w[:, hq * d:])),
                                                 name=f"{base}_kv_weight_{n}"))
        kv.producer().name = f"{base}_kv_MatMul"
        x_shape = plan["x"].shape
        if x_shape is not None and len(x_shape) == 3:
            q.shape = ir.Shape([x_shape[0], x_shape[1], hq * d])
            kv.shape = ir.Shape([x_shape[0], x_shape[1], w.shape[1] - hq * d])
        q.type = kv.type = node.inputs[0].type
        # The output projection's bias, outside the match: a new initializer (the old one may be
        # shared), set on the one node that reads it here.
        consumer, index = plan["consumer"], plan["index"]
        graph = consumer.graph
        value = ir.Value(name=f"{base}_out_bias_{n}", shape=ir.Shape([plan["folded"].shape[-1]]),
                         type=ir.TensorType(ir.DataType.from_numpy(np.dtype(dtype))),
                         const_value=ir.tensor(plan["folded"].astype(dtype)))
        graph.register_initializer(value)
        if index < len(consumer.inputs):
            consumer.replace_input_with(index, value)
        else:
            consumer.resize_inputs(index + 1)
            consumer.replace_input_with(index, value)
        return self.emit(op, node, {"Q": q, "K": kv, "V": None}, {}, {"layout": "packed KV"})

    def _unique(self) -> int:
        self._count += 1
        return self._count


def rules() -> list:
    return [BiasFold()]


def _output_bias(y: ir.Value, width: int) -> dict:
    """Where Y's output projection adds its bias: {"wo", "bo" (or None), "consumer", "index"}.
    Y reaches MatMul(., Wo) through Reshapes only (each used once), Wo a constant of ``width``
    rows; the MatMul feeds one Add of a constant bias or one SkipLayerNormalization (ONNX
    Runtime's fusion, its bias input 4)."""
    value = y
    while True:
        if len(value.uses()) != 1 or value.is_graph_output():
            fail("Y (or a Reshape of it) has other uses than the output projection")
        user = next(iter(value.uses())).node
        if user.op_type == "Reshape" and user.domain in ("", "ai.onnx") and user.inputs[0] is value:
            value = user.outputs[0]
            continue
        break
    if user.op_type != "MatMul" or user.domain not in ("", "ai.onnx") or user.inputs[0] is not value:
        fail("Y does not feed an output projection MatMul through Reshapes only")
    wo = packed_qkv._constant(user.inputs[1])
    if wo is None or len(wo.shape) != 2 or wo.shape[0] != width:
        fail(f"the output projection's weight is not a constant matrix of {width} rows")
    out = user.outputs[0]
    if len(out.uses()) != 1 or out.is_graph_output():
        fail("the output projection has other uses than its bias")
    consumer = next(iter(out.uses())).node
    n = wo.shape[1]
    if consumer.op_type == "Add" and consumer.domain in ("", "ai.onnx"):
        index = 1 if consumer.inputs[0] is out else 0
        bo = packed_qkv._constant(consumer.inputs[index])
        if bo is None or list(bo.shape) != [n]:
            fail("the output projection's Add has no constant bias of one value per column")
    elif consumer.op_type == "SkipLayerNormalization" and consumer.domain == MS_DOMAIN:
        if out not in consumer.inputs[:2]:
            fail("the output projection feeds SkipLayerNormalization other than as its input or skip")
        index = 4
        if len(consumer.inputs) > 4 and consumer.inputs[4] is not None:
            bo = packed_qkv._constant(consumer.inputs[4])
            if bo is None or list(bo.shape) != [n]:
                fail("SkipLayerNormalization's bias is not a constant of one value per column")
        else:
            if len(consumer.inputs) < 4 or consumer.inputs[3] is None:
                fail("SkipLayerNormalization has no beta before its bias slot")
            bo = None
        if bo is not None and bo.dtype != wo.dtype:
            fail("SkipLayerNormalization's bias differs in type from the projection")
    else:
        fail(f"the output projection feeds {consumer.op_type}, not a bias Add or SkipLayerNormalization")
    return {"wo": wo, "bo": bo, "consumer": consumer, "index": index}
