# Rule: ONNX Runtime's com.microsoft.GroupQueryAttention (every attention layer of an LLM built
# by ONNX Runtime GenAI's model builder), swapped one for one.
#
#   output (B, S, Hq·D), present_key, present_value (B, Hkv, T, D)
#     = com.microsoft.GroupQueryAttention(query (B, S, Hq·D) or packed (B, S, (Hq + 2 Hkv)·D),
#           [key, value (B, S, Hkv·D)], [past_key, past_value (B, Hkv, P, D)],
#           seqlens_k int32 (B,), total_sequence_length int32 (1,) on the host,
#           [cos_cache, sin_cache (max position, R/2)], [position_ids int64 (B, S)],
#           num_heads = Hq, kv_num_heads = Hkv, scale, softcap, local_window_size,
#           do_rotary, rotary_interleaved, causal)
#
# becomes the same node in the "ort_flash" domain: the same inputs, outputs (names kept),
# attributes and semantics (the shared past/present buffer written in place at each row's
# position, the rotary embedding of the new tokens only), computed by ort_flash's kernels.
# A windowed KV cache (sliding_window_cache=1, the builder's default for Mistral and Gemma 2) is
# kept as ONNX Runtime's op keeps it, and so are attention sinks (head_sink, smooth_softmax=1) and
# fused Q/K norms (q_norm_weight, k_norm_weight: Qwen3's CUDA builds). Declined with a reason: what
# ort_flash's op does not compute (a quantized cache, an attention bias, the QK output), and
# float16 / bfloat16 nodes (CUDA: cpp/gqa_launch.cc) where ort_flash's op is not measured faster
# than ONNX Runtime's own (_cuda_decision: mapped for float16 and bfloat16 at head sizes 64 and 128
# by rewrite()'s default gqa_cuda="measured", fused Q/K norms and attention sinks included, a
# windowed cache not (slower than ONNX Runtime's op at decode once the window is full); "all" maps
# the others, "none" none).
from __future__ import annotations

import math

import onnx_ir as ir

from ort_flash.rewriter import flash_op
from ort_flash.rewriter.fusions.node_rule import NodeRule
from ort_flash.rewriter.onnxscript_api import fail as _fail
from ort_flash.rewriter.report import FusedSubgraph
from ort_flash.rewriter.shapes import dims

FAMILY = "group_query_attention"
OP_TYPE = "GroupQueryAttention"
INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
          "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale",
          "v_scale", "q_norm_weight", "k_norm_weight")
# Attributes of ONNX Runtime's op that ort_flash's computes as it does.
ATTRIBUTES = ("num_heads", "kv_num_heads", "scale", "softcap", "local_window_size", "do_rotary",
              "rotary_interleaved", "causal", "smooth_softmax", "qk_output", "sliding_window_cache",
              "k_quant_type", "v_quant_type", "kv_cache_bit_width", "qk_norm_epsilon")
_UNSUPPORTED_INPUTS = {
    "attention_bias": "an attention bias",
    "k_scale": "a quantized KV cache (k_scale)", "v_scale": "a quantized KV cache (v_scale)",
}
_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
# (dtype, head size) of the CUDA nodes mapped by default: measured faster than ONNX Runtime's op at
# every prefill length and decode shape of the gqa suite, and teacher-forced through GenAI within
# rounding of ONNX Runtime's (perf-notes "GenAI fidelity and d64 decode", "GroupQueryAttention
# prefill against the plain op"). Head sizes 96 and 256 were measured slower (their calls run the
# generic pointer kernels): they stay with ONNX Runtime's op.
_CUDA_MEASURED = {(dtype, d) for dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16) for d in (64, 128)}
# With attention sinks: measured faster than ONNX Runtime's op at every prefill length and decode
# shape timed, float16 (1.66-2.20x prefill, 1.01-1.28x decode; perf-notes "A key bound per row for
# batched first prompts") and bfloat16 (1.64-2.72x, 1.02-1.28x; perf-notes "Q's rotary in the Gluon
# kernels' load path"): the same head sizes and dtypes as without them.
_CUDA_SINKS_MEASURED = _CUDA_MEASURED
# rewrite()'s gqa_cuda: which float16 / bfloat16 (CUDA) nodes the rule maps.
CUDA_POLICIES = ("measured", "all", "none")


class GroupQueryAttentionRule(NodeRule):
    family = FAMILY

    def __init__(self, cuda_policy: str = "measured"):  # one of CUDA_POLICIES: rewrite() checks it
        super().__init__()
        self.cuda_policy = cuda_policy

    def pattern(self, op, query):
        return op.GroupQueryAttention(query, _domain="com.microsoft", _allow_other_inputs=True,
                                      _allow_other_attributes=True, _outputs=3)

    def analyze(self, context, query, **_) -> dict:
        return _analyze(context.root, query, self.cuda_policy)

    def rewrite(self, op, query, **_):
        plan, self._plan = self._plan, None
        node = plan["node"]
        inputs = list(node.inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        attrs = {name: attr.value for name, attr in node.attributes.items()}
        outs = op.GroupQueryAttention(*inputs, **attrs, _domain=flash_op.DOMAIN,
                                      _version=flash_op.VERSION, _outputs=3)
        name = node.name or OP_TYPE
        outs[0].producer().name = name
        self.fused.append(FusedSubgraph(
            rule=FAMILY, variant="", fused_node=name, nodes=[name], heads=plan["heads"],
            kv_heads=plan["kv_heads"], head_dim=plan["head_dim"], causal=plan["causal"],
            mask="key lengths (seqlens_k)", layout="packed" if plan["packed"] else "BSD",
            cache="past/present", scale=plan["scale"], note=plan["note"]))
        return outs


def rules(cuda_policy: str = "measured") -> list[GroupQueryAttentionRule]:
    return [GroupQueryAttentionRule(cuda_policy)]


def _int(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return attr.as_int() if attr is not None else default


def _analyze(node: ir.Node, query: ir.Value, cuda_policy: str) -> dict:
    inputs = dict(zip(INPUTS, node.inputs))
    for name, what in _UNSUPPORTED_INPUTS.items():
        if inputs.get(name) is not None:
            _fail(f"GroupQueryAttention with {what} is not supported by ort_flash's op")
    unknown = sorted(set(node.attributes) - set(ATTRIBUTES))
    if unknown:
        _fail(f"GroupQueryAttention attribute(s) {', '.join(unknown)} are not known to ort_flash's op")
    for name in ("k_quant_type", "v_quant_type"):
        attr = node.attributes.get(name)
        if attr is not None and attr.as_string() != "NONE":
            _fail(f"a quantized KV cache ({name}={attr.as_string()}) is not supported by ort_flash's op")
    if _int(node, "qk_output", 0) != 0 or (len(node.outputs) > 3 and (
            node.outputs[3].uses() or node.outputs[3].is_graph_output())):
        _fail("the output_qk output (qk_output) is not supported by ort_flash's op")
    causal = bool(_int(node, "causal", 1))
    if not causal and _int(node, "local_window_size", -1) > 0:
        _fail("local_window_size with causal=0 is not supported by ort_flash's op")
    if len(node.outputs) < 3:
        _fail("GroupQueryAttention without present_key / present_value outputs")
    dtype = query.dtype
    if dtype not in _FLOATS:
        _fail(f"query of type {dtype} (expected float32, float16 or bfloat16)")
    for name in ("past_key", "past_value"):
        value = inputs.get(name)
        if value is not None and value.dtype is not None and value.dtype != dtype:
            _fail(f"{name} of type {value.dtype} differs from query's {dtype} (a quantized cache)")
    hq, hkv = _int(node, "num_heads", 0), _int(node, "kv_num_heads", 0)
    if hq <= 0 or hkv <= 0 or hq % hkv:
        _fail(f"num_heads {hq} is not a positive multiple of kv_num_heads {hkv}")
    packed = inputs.get("key") is None
    qd = dims(query)
    hidden = qd[2] if qd and len(qd) == 3 and isinstance(qd[2], int) else None
    parts = hq + 2 * hkv if packed else hq
    head_dim: int | str = hidden // parts if hidden is not None and hidden % parts == 0 else "?"
    sinks = inputs.get("head_sink") is not None or _int(node, "smooth_softmax", -1) == 1
    qk_norm = inputs.get("q_norm_weight") is not None
    if qk_norm != (inputs.get("k_norm_weight") is not None):
        _fail("q_norm_weight and k_norm_weight must be given together")
    if dtype != ir.DataType.FLOAT:
        _cuda_decision(node, dtype, head_dim, cuda_policy, sinks)
    scale_attr = node.attributes.get("scale")
    scale = scale_attr.as_float() if scale_attr is not None else 0.0
    if not scale and isinstance(head_dim, int):
        scale = 1.0 / math.sqrt(head_dim)
    notes = []
    window = _int(node, "local_window_size", -1)
    if window > 0:
        notes.append(f"local window {window}")
    softcap = node.attributes.get("softcap")
    if softcap is not None and softcap.as_float() > 0:
        notes.append(f"softcap {softcap.as_float():g}")
    if _int(node, "sliding_window_cache", 0):
        notes.append("windowed cache")
    if _int(node, "do_rotary", 0):
        notes.append("rotary" + (" interleaved" if _int(node, "rotary_interleaved", 0) else ""))
    if sinks:
        notes.append("attention sinks")
    if qk_norm:
        notes.append("Q/K norms")
    return {"node": node, "heads": hq, "kv_heads": hkv, "head_dim": head_dim, "causal": causal,
            "packed": packed, "scale": scale or float("nan"), "note": ", ".join(notes)}


def _cuda_decision(node: ir.Node, dtype: ir.DataType, head_dim, policy: str, sinks: bool) -> None:
    """float16 / bfloat16 nodes run on CUDA. Mapped where ort_flash's op was measured faster than
    ONNX Runtime's (_CUDA_MEASURED; with attention sinks _CUDA_SINKS_MEASURED; with a windowed cache
    nowhere), or every one with policy "all"; none with "none"."""
    what = f"a {dtype.name.lower()} GroupQueryAttention (CUDA) with head size {head_dim}"
    if policy == "none":
        _fail(f"{what}: --gqa-cuda none (ORT_FLASH_GQA_CUDA=0) leaves it to ONNX Runtime's op")
    if policy != "all" and sinks and (dtype, head_dim) not in _CUDA_SINKS_MEASURED:
        _fail(f"{what} and attention sinks (head_sink or smooth_softmax=1): ort_flash's op computes them on "
              "CUDA but is measured against ONNX Runtime's with them only at head sizes 64 and 128: "
              "left to ONNX Runtime's; --gqa-cuda all (ORT_FLASH_GQA_CUDA=1) maps it")
    if policy != "all" and _int(node, "sliding_window_cache", 0):
        _fail(f"{what} and a windowed KV cache (sliding_window_cache=1): ort_flash's op computes it on CUDA, "
              "faster than ONNX Runtime's while the cache holds every token, but measured slower at decode "
              "once the window is full (it moves the whole window every step): left to "
              "ONNX Runtime's; --gqa-cuda all (ORT_FLASH_GQA_CUDA=1) maps it")
    if policy != "all" and (dtype, head_dim) not in _CUDA_MEASURED:
        _fail(f"{what}: ort_flash's op is measured faster than ONNX Runtime's on CUDA only at head "
              "sizes 64 and 128 (other sizes run generic kernels, measured slower): left to ONNX Runtime's; "
              "--gqa-cuda all (ORT_FLASH_GQA_CUDA=1) maps it")
