# Rule: the decomposition both torch exporters write for F.scaled_dot_product_attention
# (attn_implementation="sdpa"), which scales Q and Kᵀ each by √scale before the product.
#
#   Q (B, Hq, Sq, D)          Kᵀ (B, Hkv, D, Skv)                   V (B, Hkv, Skv, Dv)
#   Mul(Q, a)                 Mul(Kᵀ, b)             [a, b constant scalars, usually both √scale]
#   └─► MatMul(Q·a, Kᵀ·b) ─────────────────────────► S (B, Hq, Sq, Skv)
#       Add(S, A) | —                                 [masks=2]
#       Add(S, M) | —                                 [masks>=1; a bool mask arrives as
#                                                      Where(m, 0, -inf), a float one as is]
#       Softmax(axis = last)
#       Where(IsNaN(P), 0, P) | Cast(no-op) | —       [torch >= 2.5 writes the IsNaN guard]
#       MatMul(P, V) ──────────────────────────────► Y (B, Hq, Sq, Dv)
#
# becomes
#
#   Y = ort_flash.FlashAttention(Q, K, V[, M | Add(A, M)], scale = a·b, is_causal = 0)
#
# [upcast: the TorchScript exporter writes float16 SDPA with a bool mask as Cast(S, float32) +
#  float32 mask, softmax and MatMul(P, Cast(V, float32)). Then the op runs in Q's dtype (its
#  softmax and accumulation are float32 anyway), the mask is cast to it (0 / -inf exactly) and
#  Y is cast to float32 as the export's was: equal up to rounding Y to float16.]
#
# (a·Q)(b·Kᵀ) = a·b·(QKᵀ) exactly in real arithmetic; K is recovered from Kᵀ as in
# matmul_softmax_attention (the TorchScript exporter writes Transpose(K, [0, 1, 3, 2]); the
# dynamo exporter Reshape/Transpose/Reshape through (B·H, Skv, D)).
from __future__ import annotations

from ort_flash.rewriter.fusions.matmul_softmax_attention import MatMulSoftmaxAttention, constant_scalar

FAMILY = "sdpa_attention"


class SdpaAttention(MatMulSoftmaxAttention):
    family = FAMILY

    def __init__(self, *, masks: int, upcast: bool = False) -> None:
        super().__init__(scale="qk", masks=masks, upcast=upcast)

    def qk_pattern(self, op, q, kt, scale, scale_k):
        return op.MatMul(op.Mul(q, scale), op.Mul(kt, scale_k))

    def scale_value(self, scale, scale_k) -> float:
        return constant_scalar(scale, "scale of Q") * constant_scalar(scale_k, "scale of Kᵀ")


def rules() -> list[SdpaAttention]:
    return [SdpaAttention(masks=m, upcast=u) for u in (True, False) for m in (2, 1, 0)]
