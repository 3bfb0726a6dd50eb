"""Evaluate a model with onnx.reference, ``ort_flash.FlashAttention`` included.

The op is evaluated by the package's one reference attention (``ort_flash.reference``, ONNX
Attention-25 in float64, rounded to Q's dtype), so the rewriter's tests can check that a rewrite
keeps the function without the custom-op library.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from ort_flash.reference import attention_reference, split_packed_kv, split_packed_qkv


class FlashAttention(OpRun):
    op_domain = "ort_flash"

    def _run(self, q, k, v, attn_mask=None, past_key=None, past_value=None,
             nonpad_kv_seqlen=None, scale=None, is_causal=0, softcap=0.0, left_window_size=-1,
             right_window_size=-1, q_num_heads=None, kv_num_heads=None, fp32_precision="ieee"):
        if k is None and v is None:  # packed QKV
            q, k, v = split_packed_qkv(q, q_num_heads, kv_num_heads)
        elif v is None:  # packed KV
            k, v = split_packed_kv(k, kv_num_heads)
        y, present_key, present_value, lse = attention_reference(
            q, k, v, attn_mask=attn_mask, past_key=past_key, past_value=past_value,
            nonpad_kv_seqlen=nonpad_kv_seqlen, scale=scale, is_causal=bool(is_causal),
            softcap=softcap, left_window_size=left_window_size,
            right_window_size=right_window_size, q_num_heads=q_num_heads,
            kv_num_heads=kv_num_heads,
        )
        outputs = (y.astype(q.dtype), present_key, present_value, lse.astype(np.float32))
        return outputs[: len(self.output)]


def run_reference(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ReferenceEvaluator(model, new_ops=[FlashAttention]).run(None, feeds)
