# Rule: an ONNX Attention node (opset 23, 24 or 25) mapped one to one.
#
#   Y[, present_key, present_value] = Attention(Q, K, V[, attn_mask][, past_key, past_value]
#                                               [, nonpad_kv_seqlen], attributes)
#     Q (B, Hq, Sq, D) | (B, Sq, Hq·D)   K, V likewise with Hkv   (3-D with q/kv_num_heads)
#
# becomes
#
#   Y[, present_key, present_value] = ort_flash.FlashAttention(same inputs, same attributes)
#
# FlashAttention is defined as ONNX Attention-25 (whose is_causal is bottom-right, offset by the
# past length or nonpad_kv_seqlen - Sq; opsets 23/24 read the same in onnx >= 1.20). Declined:
# a used qk_matmul_output (the op does not materialize the scores), softmax_precision other than
# float / float16 / bfloat16 (the op's softmax runs in float32). The causal_mask and layout
# rules then refine the new node like any other.
from __future__ import annotations

import math

import onnx_ir as ir

from ort_flash.rewriter import flash_op
from ort_flash.rewriter.fusions.node_rule import NodeRule
from ort_flash.rewriter.onnxscript_api import MatchFailureError
from ort_flash.rewriter.report import FusedSubgraph
from ort_flash.rewriter.shapes import dims, report_int

FAMILY = "onnx_attention"
_COPIED = ("scale", "is_causal", "softcap", "q_num_heads", "kv_num_heads", "left_window_size",
           "right_window_size")
_SOFTMAX_OK = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


class OnnxAttention(NodeRule):
    family = FAMILY

    def __init__(self, *, outputs: int) -> None:
        super().__init__(variant=f"outputs={outputs}")
        self.outputs = outputs

    def pattern(self, op, q, k, v):
        return op.Attention(q, k, v, _allow_other_inputs=True, _allow_other_attributes=True,
                            _outputs=self.outputs)

    def analyze(self, context, q, k, v, **_) -> dict:
        return self._analyze(context, context.root, q, k)

    def reports(self, reason: str) -> bool:
        return self.outputs <= 3 or "qk_matmul_output is used" in reason

    def _analyze(self, context, node, q, k) -> dict:
        opset = context.model.graph.opset_imports.get("", 1)
        if opset < 23:
            raise MatchFailureError(f"Attention at opset {opset} (< 23) is not ONNX Attention")
        if len(node.outputs) < self.outputs:  # (onnxscript's matcher lets this through)
            raise MatchFailureError(f"the node has {len(node.outputs)} outputs, not {self.outputs}")
        used = [i for i, o in enumerate(node.outputs) if o.uses() or o.is_graph_output()]
        if len(node.outputs) > 3 and 3 in used:
            raise MatchFailureError("qk_matmul_output is used; FlashAttention does not produce it")
        if self.outputs > 3:  # the variant exists to report the reason above
            raise MatchFailureError("qk_matmul_output is not used (handled by another variant)")
        if any(i >= self.outputs for i in used):
            raise MatchFailureError(f"outputs {used} are used, the variant covers {self.outputs}")
        precision = node.attributes.get("softmax_precision")
        if precision is not None and ir.DataType(precision.as_int()) not in _SOFTMAX_OK:
            raise MatchFailureError(f"softmax_precision {ir.DataType(precision.as_int())} is not "
                                    "float32/float16/bfloat16")
        attrs = {n: node.attributes[n].value for n in _COPIED if n in node.attributes}
        qd, kd = dims(q), dims(k)
        if qd is not None and len(qd) == 4:
            heads, kv_heads, head_dim, layout = qd[1], kd[1] if kd else "?", qd[3], "BNSH"
        else:
            hq = attrs.get("q_num_heads")
            heads, kv_heads, layout = hq or "?", attrs.get("kv_num_heads", "?"), "BSD"
            head_dim = qd[2] // hq if qd is not None and isinstance(qd[2], int) and hq else "?"
        inputs = node.inputs
        mask = inputs[3] if len(inputs) > 3 and inputs[3] is not None else None
        return {
            "node": node, "attrs": attrs, "inputs": list(inputs),
            "entry": dict(heads=report_int(heads) if not isinstance(heads, int) else heads,
                          kv_heads=kv_heads if isinstance(kv_heads, int) else report_int(kv_heads),
                          head_dim=head_dim if isinstance(head_dim, int) else report_int(head_dim),
                          causal=bool(attrs.get("is_causal", 0)), layout=layout,
                          mask="none" if mask is None else
                          f"{'bool' if mask.dtype == ir.DataType.BOOL else 'additive'}"),
        }

    def rewrite(self, op, q, k, v, **_):
        plan, self._plan = self._plan, None
        node = plan["node"]
        outs = op.FlashAttention(*plan["inputs"], **plan["attrs"], _domain=flash_op.DOMAIN,
                                 _version=flash_op.VERSION, _outputs=self.outputs)
        first = outs if self.outputs == 1 else outs[0]
        name = (node.name or "Attention") + "_FlashAttention"
        first.producer().name = name
        scale = plan["attrs"].get("scale")
        d = plan["entry"]["head_dim"]
        if scale is None:
            scale = 1.0 / math.sqrt(d) if isinstance(d, int) else float("nan")
        self.fused.append(FusedSubgraph(
            rule=FAMILY, variant=self.variant, fused_node=name, nodes=[node.name or "Attention"],
            scale=float(scale), **plan["entry"]))
        return outs


def rules() -> list[OnnxAttention]:
    return [OnnxAttention(outputs=n) for n in (4, 3, 1)]
