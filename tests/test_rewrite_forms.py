"""Rule tables for the attention forms beyond the plain eager chain, on small hand-built graphs.

Casts inside the score chain (transformers' ``softmax(scores.float())``), and the other forms
issue #21 lists. Each positive case is rewritten, checked with onnx.checker, loaded in ONNX
Runtime and verified (ort_flash.verify, CPU EP) against the original; each negative case keeps
its Softmax with the reason in the report.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ort_flash.rewriter import rewrite
from ort_flash.verify import verify
from test_rewrite_masks import Graph

H, D = 4, 8
F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def eager_model(*, dtype=F32, bias=False, casts=(), tail=None, mask_dtype=None) -> onnx.ModelProto:
    """MatMul(q, kᵀ) → Div → [Add(bias)] → Add(mask) → Softmax → [Cast(tail)] → MatMul(v), with
    ``casts`` (position, to) inserted: positions "qk" (after the MatMul), "scaled" (after the
    Div), "bias" (after the bias Add), "masked" (right before the Softmax)."""
    g = Graph()
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    where = dict(casts)

    def cast(x, position):
        return g.op("Cast", x, to=where[position]) if position in where else x

    kt = g.op("Transpose", "k", perm=[0, 1, 3, 2])
    scores = cast(g.op("MatMul", "q", kt), "qk")
    scores = cast(g.op("Div", scores, g.const(D ** 0.5, np_dtype)), "scaled")
    if bias:
        scores = cast(g.op("Add", scores, "bias"), "bias")
    scores = cast(g.op("Add", scores, "mask"), "masked")
    probs = g.op("Softmax", scores, axis=-1)
    if tail is not None:
        probs = g.op("Cast", probs, to=tail)
    g.nodes.append(helper.make_node("MatMul", [probs, "v"], ["y"], name="pv"))
    info = lambda n, s, t=dtype: helper.make_tensor_value_info(n, t, s)  # noqa: E731
    inputs = [info(n, ["B", H, "S", D]) for n in "qkv"]
    inputs.append(info("mask", ["B", 1, 1, "S"], mask_dtype or dtype))
    if bias:
        inputs.append(info("bias", [1, H, "S", "S"]))
    output = info("y", ["B", H, "S", D], dtype if tail is None else tail)
    graph = helper.make_graph(g.nodes, "eager", inputs, [output], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _ops(model: onnx.ModelProto) -> dict[str, int]:
    return dict(collections.Counter(n.op_type for n in model.graph.node))


def _fused_and_verified(model, ops_after):
    result = rewrite(model)
    assert result.report.total_fused == 1, result.report.format_table()
    assert result.report.unfused == []
    assert _ops(result.model) == ops_after
    onnx.checker.check_model(result.model, full_check=True)
    check = verify(model, result.model, seq_len=7, seed=0)
    assert check.passed, check.format_table()
    return result


# ---------------------------------------------------------------- Casts in the score chain

# id, builder kwargs, op counts after rewriting
CASTS_FUSED = [
    ("fp32_cast_before_softmax", dict(casts=[("masked", F32)]), {"FlashAttention": 1}),
    ("fp32_bias_cast_before_softmax_and_after", dict(bias=True, casts=[("masked", F32)], tail=F32),
     {"Add": 1, "FlashAttention": 1}),
    ("fp32_noop_casts_everywhere",
     dict(bias=True, casts=[("qk", F32), ("scaled", F32), ("bias", F32), ("masked", F32)]),
     {"Add": 1, "FlashAttention": 1}),
    ("fp16_upcast_around_softmax", dict(dtype=F16, casts=[("masked", F32)], tail=F16),
     {"FlashAttention": 1}),
]
# id, builder kwargs, reason substring
CASTS_KEPT = [
    ("fp32_narrowed_before_softmax", dict(casts=[("masked", F16)], tail=F32),
     "changes their dtype (FLOAT to FLOAT16)"),
    ("fp16_widened_before_the_mask", dict(dtype=F16, casts=[("scaled", F32)], tail=F16,
                                          mask_dtype=F32),
     "changes their dtype (FLOAT16 to FLOAT)"),
]


@pytest.mark.parametrize("case_id, kwargs, ops_after", CASTS_FUSED, ids=[c[0] for c in CASTS_FUSED])
def test_casts_in_the_scores_fused(case_id, kwargs, ops_after):
    _fused_and_verified(eager_model(**kwargs), ops_after)


@pytest.mark.parametrize("case_id, kwargs, reason", CASTS_KEPT, ids=[c[0] for c in CASTS_KEPT])
def test_casts_in_the_scores_kept(case_id, kwargs, reason):
    model = eager_model(**kwargs)
    result = rewrite(model)
    assert result.report.total_fused == 0
    assert _ops(result.model) == _ops(model)
    (unfused,) = result.report.unfused
    assert reason in unfused.reason, unfused.reason
