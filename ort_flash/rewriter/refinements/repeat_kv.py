# Rule: grouped-query attention's repeat_kv (LLaMA, Qwen2, Mistral, ...) absorbed, so that K and V
# keep their Hkv heads and FlashAttention maps query head h to kv head h // n itself.
#
#   k (B, Hkv, Skv, D)                          v (B, Hkv, Skv, Dv)
#   Unsqueeze(k, [2])        (B, Hkv, 1, Skv, D)         (same for v)
#   Expand(·, shape)         (B, Hkv, n, Skv, D)
#   Reshape(·, shape)        (B, Hkv·n, Skv, D)  = K     K[:, h] = k[:, h // n]
#   Y = ort_flash.FlashAttention(Q, K, V, ...)           Q (B, Hkv·n, Sq, D)
#
# becomes
#
#   Y = ort_flash.FlashAttention(Q, k, v, ...)
#
# torch's repeat_kv is x[:, :, None].expand(B, Hkv, n, S, D).reshape(B, Hkv·n, S, D): head
# Hkv-major, repeat-minor, which is exactly FlashAttention's (and ONNX Attention's) GQA grouping.
# Every dim is proven from the inferred shapes; K and V must repeat by the same n.
from __future__ import annotations

import onnx_ir as ir

from ort_flash.rewriter.onnxscript_api import fail
from ort_flash.rewriter.refinements.base import Refinement, flash_pattern
from ort_flash.rewriter.refinements.head_shapes import HeadSplitShape
from ort_flash.rewriter.shapes import Unprovable, equal, value_dims

FAMILY = "repeat_kv"


class RepeatKv(Refinement):
    family = FAMILY

    def pattern(self, op, q, k, v, k_axes, k_shape5, k_shape4, v_axes, v_shape5, v_shape4):
        key = op.Reshape(op.Expand(op.Unsqueeze(k, k_axes), k_shape5), k_shape4,
                         _allow_other_attributes=True)
        value = op.Reshape(op.Expand(op.Unsqueeze(v, v_axes), v_shape5), v_shape4,
                           _allow_other_attributes=True)
        return flash_pattern(op, q, key, value)

    def analyze(self, context, node, q, k, v, k_axes, v_axes, **_):
        n_k = _repeats(node.inputs[1], k, k_axes, "K")
        n_v = _repeats(node.inputs[2], v, v_axes, "V")
        if n_k != n_v:
            fail(f"K and V repeat by {n_k} and {n_v}")
        hkv = value_dims(k)[1]
        return {"node": node, "kv_heads": int(hkv) if hkv.is_Integer else "?", "n": n_k}

    def rewrite(self, op, q, k, v, **_):
        plan, self._plan = self._plan, None
        return self.emit(op, plan["node"], {"K": k, "V": v}, {}, {"kv_heads": plan["kv_heads"]})


def rules() -> list:
    """The Shape rewrite first (so the repeated K/V have no other uses), then the rule."""
    return [HeadSplitShape(), RepeatKv()]


def _repeats(repeated: ir.Value, source: ir.Value, axes: ir.Value, name: str) -> int:
    """n for repeated = Reshape(Expand(Unsqueeze(source, [2]), (B, Hkv, n, S, D)), (B, Hkv·n, S, D))."""
    tensor = ir.convenience.get_const_tensor(axes)
    if tensor is None or [int(a) for a in tensor.numpy().reshape(-1)] not in ([2], [-3]):
        fail(f"{name} is unsqueezed at an axis other than 2")
    expanded = repeated.producer().inputs[0]
    try:
        src, exp, out = value_dims(source), value_dims(expanded), value_dims(repeated)
    except Unprovable as e:
        fail(str(e))
    if (len(src), len(exp), len(out)) != (4, 5, 4):
        fail(f"{name}'s repeat has ranks {len(src)}/{len(exp)}/{len(out)}, not 4/5/4")
    n = exp[2]
    if not n.is_Integer:
        fail(f"{name}'s repeat count {n} is not a constant")
    same = (equal(exp[0], src[0]) and equal(exp[1], src[1]) and equal(exp[3], src[2])
            and equal(exp[4], src[3]) and equal(out[0], src[0]) and equal(out[1], src[1] * n)
            and equal(out[2], src[2]) and equal(out[3], src[3]))
    if not same:
        fail(f"{name}'s Expand/Reshape is not repeat_kv: {list(src)} -> {list(exp)} -> {list(out)}")
    return int(n)
