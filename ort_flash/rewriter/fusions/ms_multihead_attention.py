# Rule: ONNX Runtime's com.microsoft.MultiHeadAttention (what ORT's transformer optimizer
# writes), for separate 3-D Q, K, V without bias or cache.
#
#   Y = com.microsoft.MultiHeadAttention(query (B, S, H·D), key (B, L, H·D), value (B, L, H·Dv),
#                                        [bias = ""], [key_padding_mask (B, L)],
#                                        [attention_bias (B|1, H|1, S, L)],
#                                        num_heads = H, scale, mask_filter_value = f,
#                                        unidirectional = u)
#
# becomes
#
#   P = Where(Unsqueeze(key_padding_mask != 0, [1, 2]), 0, f)           (B, 1, 1, L)
#   Y = ort_flash.FlashAttention(query, key, value, [P][ + attention_bias], scale,
#                                is_causal = u, q_num_heads = H, kv_num_heads = H)
#
# ORT applies a 2-D key padding mask as the additive f on padded keys and u as a causal mask
# with no past (offset 0, FlashAttention's too). Declined with a reason: packed QKV / KV, a
# projection bias, past / present cache, a 1-D or 3-D key_padding_mask, the qk output.
from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from ort_flash.rewriter import flash_op
from ort_flash.rewriter.fusions.node_rule import NodeRule
from ort_flash.rewriter.onnxscript_api import fail as _fail
from ort_flash.rewriter.report import FusedSubgraph
from ort_flash.rewriter.shapes import dims

FAMILY = "ms_multihead_attention"
_IN = ("query", "key", "value", "bias", "key_padding_mask", "attention_bias", "past_key",
       "past_value", "past_sequence_length", "cache_indirection")


class MsMultiHeadAttention(NodeRule):
    family = FAMILY

    def pattern(self, op, q, k, v):
        return op.MultiHeadAttention(q, k, v, _domain="com.microsoft", _allow_other_inputs=True,
                                     _allow_other_attributes=True)

    def analyze(self, context, q, k, v, **_) -> dict:
        return self._analyze(context.root, q, k, v)

    def _analyze(self, node, q, k, v) -> dict:
        inputs = dict(zip(_IN, node.inputs))
        for name in ("bias", "past_key", "past_value", "past_sequence_length", "cache_indirection"):
            if inputs.get(name) is not None:
                _fail(f"MultiHeadAttention with {name} is not mapped")
        if any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
            _fail("MultiHeadAttention's present / qk outputs are used")
        qd, kd, vd = dims(q), dims(k), dims(v)
        if not (qd and kd and vd and len(qd) == len(kd) == len(vd) == 3):
            _fail("query, key and value are not all 3-D (packed or BNSH forms are not mapped)")
        heads = node.attributes.get("num_heads")
        if heads is None:
            _fail("num_heads is missing")
        h = heads.as_int()
        if not (isinstance(qd[2], int) and isinstance(vd[2], int)) or qd[2] % h or vd[2] % h:
            _fail(f"hidden sizes {qd[2]} / {vd[2]} are not known multiples of num_heads {h}")
        pad = inputs.get("key_padding_mask")
        if pad is not None and (dims(pad) is None or len(dims(pad)) != 2):
            _fail("only a 2-D (B, L) key_padding_mask is mapped")
        scale_attr = node.attributes.get("scale")
        scale = scale_attr.as_float() if scale_attr is not None else 0.0
        filter_attr = node.attributes.get("mask_filter_value")
        fill = filter_attr.as_float() if filter_attr is not None else -10000.0
        causal_attr = node.attributes.get("unidirectional")
        causal = bool(causal_attr.as_int()) if causal_attr is not None else False
        d = qd[2] // h
        return {"node": node, "heads": h, "scale": scale, "fill": fill, "causal": causal,
                "pad": pad, "bias": inputs.get("attention_bias"), "head_dim": d,
                "dtype": q.dtype}

    def rewrite(self, op, q, k, v, **_):
        plan, self._plan = self._plan, None
        name = plan["node"].name or "MultiHeadAttention"
        mask, kinds = None, []
        if plan["pad"] is not None:
            visible = op.Cast(plan["pad"], to=ir.DataType.BOOL)
            axes = op.Constant(value=ir.tensor(np.array([1, 2], np.int64)))
            dtype = plan["dtype"].numpy()
            mask = op.Where(op.Unsqueeze(visible, axes), op.Constant(value=ir.tensor(np.array(0, dtype))),
                            op.Constant(value=ir.tensor(np.array(plan["fill"], dtype))))
            kinds.append("additive (B,1,1,Skv)")
        if plan["bias"] is not None:
            mask = plan["bias"] if mask is None else op.Add(plan["bias"], mask)
            kinds.append("additive bias")
        attrs = {"is_causal": int(plan["causal"]), "q_num_heads": plan["heads"],
                 "kv_num_heads": plan["heads"]}
        if plan["scale"]:
            attrs["scale"] = plan["scale"]
        y = op.FlashAttention(*([q, k, v] + ([mask] if mask is not None else [])), **attrs,
                              _domain=flash_op.DOMAIN, _version=flash_op.VERSION)
        y.producer().name = f"{name}_FlashAttention"
        d = plan["head_dim"]
        self.fused.append(FusedSubgraph(
            rule=FAMILY, variant="", fused_node=y.producer().name, nodes=[name],
            heads=plan["heads"], kv_heads=plan["heads"], head_dim=d, causal=plan["causal"],
            mask=" + ".join(kinds) or "none", layout="BSD",
            scale=plan["scale"] or 1.0 / math.sqrt(d)))
        return y


def rules() -> list[MsMultiHeadAttention]:
    return [MsMultiHeadAttention()]
