"""The custom op the rewriter emits: ``ort_flash.FlashAttention`` version 1.

Inputs follow ONNX ``Attention`` (opset 25) order: Q, K, V, attn_mask, past_key, past_value,
nonpad_kv_seqlen; outputs Y, present_key, present_value, softmax_lse. The rules emit only
what they can prove: Q, K, V in BNSH (B, H, S, D) or 3-D with head attributes, or packed QKV
(Q alone, (B, S, (Hq + 2 Hkv) D), K and V omitted), an optional
additive or bool mask, is_causal, and ``Y`` (all inputs and outputs of an ONNX Attention node).
"""

DOMAIN = "ort_flash"
OP_TYPE = "FlashAttention"
VERSION = 1
