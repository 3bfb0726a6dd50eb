# Rule: a KV cache's concatenation absorbed into FlashAttention's past_key / past_value inputs and
# present_key / present_value outputs (GPT-2, LLaMA, Qwen2, BART and Whisper decoders with a cache).
#
#   past_k (B, Hkv, P, D)   k (B, Hkv, S, D)      past_v (B, Hkv, P, Dv)   v (B, Hkv, S, Dv)
#   K = Concat(past_k, k, axis = 2 | -2)  (B, Hkv, P+S, D)    [K, V may be graph outputs
#   V = Concat(past_v, v, axis = 2 | -2)  (B, Hkv, P+S, Dv)    ("present") or feed other nodes]
#   Y = ort_flash.FlashAttention(Q, K, V[, M])                [no past, no nonpad_kv_seqlen]
#
# becomes
#
#   Y, K', V' = ort_flash.FlashAttention(Q, k, v[, M], past_k, past_v)
#
# and every use of K, V (a graph output keeps its name) reads K', V'. The op's present_key /
# present_value are defined as past ++ new along the sequence axis, which is this Concat, and its
# attention runs over exactly those keys and values; the mask broadcasts to the same
# (B, Hq, Sq, P+S). The one attribute whose meaning changes is is_causal (its offset becomes P),
# so the node must not be causal yet: causal_mask runs after this rule and proves is_causal
# against the mask with the offset. Declined where Q or the mask is computed from K or V (the
# node would then feed itself). A mask that reads only the Concat's shape (Optimum's with-past
# decoders slice the mask to Shape(repeat_kv(K))[2]) is not such a dependence: ``ConcatShape``
# first computes each Shape(K) of a FlashAttention's K/V Concat from the Concat's inputs,
#
#   Shape(Concat(past, new, axis 2)) = Shape(new) + Shape(past) · (0, 0, 1, 0)
#
# exactly (past and new agree on axes 0, 1, 3, proven from the inferred shapes).
from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from ort_flash.rewriter.onnxscript_api import fail
from ort_flash.rewriter.refinements.base import Refinement, flash_pattern
from ort_flash.rewriter.shapes import Unprovable, attr, equal, value_dims

FAMILY = "kv_cache"


class KvCache(Refinement):
    family = FAMILY

    def pattern(self, op, q, past_k, k, past_v, v):
        key = op.Concat(past_k, k, _allow_other_attributes=True)
        value = op.Concat(past_v, v, _allow_other_attributes=True)
        return flash_pattern(op, q, key, value), key, value

    def analyze(self, context, node, q, past_k, k, past_v, v, **_):
        if attr(node, "is_causal", 0):
            fail("the node is causal without a past: is_causal would change its offset")
        if len(node.inputs) > 4 and any(i is not None for i in node.inputs[4:]):
            fail("the node already has a past or nonpad_kv_seqlen input")
        key, value = node.inputs[1], node.inputs[2]
        try:
            for name, cat, past, new in (("K", key, past_k, k), ("V", value, past_v, v)):
                a = cat.producer().attributes.get("axis")
                pd, nd = value_dims(past), value_dims(new)
                if len(pd) != 4 or len(nd) != 4:
                    fail(f"{name} is a Concat of ranks {len(pd)} and {len(nd)}, not 4 (B, H, S, D)")
                if a is None or a.as_int() not in (2, -2):
                    fail(f"{name} is a Concat along axis {None if a is None else a.as_int()}, "
                         "not the sequence axis 2")
                if not all(equal(pd[i], nd[i]) for i in (0, 1, 3)):
                    fail(f"past and new {name} differ in batch, heads or head dim "
                         f"({list(pd)} vs {list(nd)})")
            if not equal(value_dims(past_k)[2], value_dims(past_v)[2]):
                fail("past_key and past_value have different lengths")
        except Unprovable as e:
            fail(str(e))
        inputs = [i for i in (node.inputs[0], *node.inputs[3:]) if i is not None]
        if _depends_on(inputs, {key, value}):
            fail("Q or the mask is computed from the concatenated K/V")
        return {"node": node, "key": key, "value": value}

    def rewrite(self, op, q, past_k, k, past_v, v, **_):
        plan, self._plan = self._plan, None
        return self.emit(op, plan["node"], {"K": k, "V": v, "past_key": past_k,
                                            "past_value": past_v}, {}, {"cache": "past/present"},
                         presents=(plan["key"], plan["value"]))


class ConcatShape(Refinement):
    """Shape(K) of a FlashAttention's K/V Concat(past, new), computed from past and new."""

    family = "concat_shape"

    def pattern(self, op, t):
        return op.Shape(t, _allow_other_attributes=True)

    def check(self, context, t, **_):
        node = t.producer()
        if node is None or node.op_type != "Concat" or node.domain not in ("", "ai.onnx"):
            return pattern.MatchResult().fail("not the shape of a Concat")
        if not any(u.node.op_type == "FlashAttention" and u.idx in (1, 2) for u in t.uses()):
            return pattern.MatchResult().fail("the Concat is not a FlashAttention's K/V")
        a = node.attributes.get("axis")
        if len(node.inputs) != 2 or a is None or a.as_int() not in (2, -2):
            return pattern.MatchResult().fail("not a Concat of two along axis 2")
        try:
            pd, nd = value_dims(node.inputs[0]), value_dims(node.inputs[1])
        except Unprovable as e:
            return pattern.MatchResult().fail(str(e))
        if len(pd) != 4 or len(nd) != 4 or not all(equal(pd[i], nd[i]) for i in (0, 1, 3)):
            return pattern.MatchResult().fail("past and new differ in batch, heads or head dim")
        start, end = (context.root.attributes.get(n) for n in ("start", "end"))
        axes = range(4)[slice(start.value if start else None, end.value if end else None)]
        self._plan = (node.inputs[0], node.inputs[1], axes)
        return pattern.MatchResult()

    def rewrite(self, op, t, **_):
        (past, new, axes), self._plan = self._plan, None
        if not len(axes):
            return op.Constant(value=ir.tensor(np.zeros(0, np.int64)))
        bounds = {"start": axes[0], "end": axes[-1] + 1}
        values = [op.Shape(new, **bounds)]
        if 2 in axes:
            picks = np.array([int(a == 2) for a in axes], np.int64)
            values.append(op.Constant(value=ir.tensor(picks)))
            values.append(op.Shape(past, **bounds))
            values.append(op.Mul(values[-1], values[-2]))
            values.append(op.Add(values[0], values[-1]))
        for value in values:  # the mask analysis reads these shapes
            value.shape, value.type = ir.Shape([len(axes)]), ir.TensorType(ir.DataType.INT64)
        return values[-1]


def rules() -> list:
    """The Shape rewrite first (so a mask that reads K's length is not computed from K)."""
    return [ConcatShape(), KvCache()]


def _depends_on(values, targets) -> bool:
    seen, stack = set(), list(values)
    while stack:
        value = stack.pop()
        if value in targets:
            return True
        node = value.producer()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(i for i in node.inputs if i is not None)
    return False
