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
# node would then feed itself).
from __future__ import annotations

from ort_flash.rewriter.mask_domain import Unprovable, equal, value_dims
from ort_flash.rewriter.refinement import Refinement, attr, fail, flash_pattern

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


def rules() -> list:
    return [KvCache()]


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
