"""Rule tables for the attention forms beyond the plain eager chain, on small hand-built graphs.

Casts inside the score chain (transformers' ``softmax(scores.float())``), soft-capping, a scale
from the head dim and 3-D attention (the forms docs/op-and-rewriter.md lists). Each positive case is rewritten, checked with onnx.checker, loaded in ONNX
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


def eager_model(*, dtype=F32, bias=False, casts=(), tail=None, mask_dtype=None,
                scale="constant", head_dim=D, softcap=None, fill=None) -> onnx.ModelProto:
    """MatMul(q, kᵀ) → Div → [Add(bias)] → Add(mask) → Softmax → [Cast(tail)] → MatMul(v), with
    ``casts`` (position, to) inserted: positions "qk" (after the MatMul), "scaled" (after the
    Div), "bias" (after the bias Add), "masked" (right before the Softmax). ``scale="shape"``
    divides by Sqrt(Cast(Shape(q)[3])) instead of a constant (``head_dim`` may be a name).
    ``softcap=(a, b)`` adds Mul(Tanh(Div(scores, a)), b) after the scale; ``fill=(side, c)``
    a masked_fill before the mask: Where(keep, S, c) ("keep") or Where(hide, c, S) ("hide"),
    the condition Greater(pick, 0) of a float input pick (B, 1, S, S)."""
    g = Graph()
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    where = dict(casts)

    def cast(x, position):
        return g.op("Cast", x, to=where[position]) if position in where else x

    kt = g.op("Transpose", "k", perm=[0, 1, 3, 2])
    scores = cast(g.op("MatMul", "q", kt), "qk")
    if scale == "shape":
        dim = g.op("Gather", g.op("Shape", "q"), g.const(3, np.int64), axis=0)
        divisor = g.op("Sqrt", g.op("Cast", dim, to=dtype))
    else:
        divisor = g.const(D ** 0.5, np_dtype)
    scores = cast(g.op("Div", scores, divisor), "scaled")
    if softcap is not None:
        a, b = softcap
        scores = g.op("Mul", g.op("Tanh", g.op("Div", scores, g.const(a, np_dtype))),
                      g.const(b, np_dtype))
    if fill is not None:
        side, c = fill
        cond = g.op("Greater", "pick", g.const(0.0, np.float32))
        c = g.const(c, np_dtype)
        scores = g.op("Where", cond, scores, c) if side == "keep" else g.op("Where", cond, c, scores)
    if bias:
        scores = cast(g.op("Add", scores, "bias"), "bias")
    scores = cast(g.op("Add", scores, "mask"), "masked")
    probs = g.op("Softmax", scores, axis=-1)
    if tail is not None:
        probs = g.op("Cast", probs, to=tail)
    g.nodes.append(helper.make_node("MatMul", [probs, "v"], ["y"], name="pv"))
    info = lambda n, s, t=dtype: helper.make_tensor_value_info(n, t, s)  # noqa: E731
    inputs = [info(n, ["B", H, "S", head_dim]) for n in "qkv"]
    inputs.append(info("mask", ["B", 1, 1, "S"], mask_dtype or dtype))
    if bias:
        inputs.append(info("bias", [1, H, "S", "S"]))
    if fill is not None:
        inputs.append(info("pick", ["B", 1, "S", "S"], F32))
    output = info("y", ["B", H, "S", head_dim], dtype if tail is None else tail)
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


# ---------------------------------------------------------------- softcap


def test_softcap_becomes_the_attribute():
    model = eager_model(softcap=(0.5, 0.5))  # small c, so that the cap changes the scores
    result = _fused_and_verified(model, {"FlashAttention": 1})
    (entry,) = result.report.fused
    assert "softcap" in entry.variant
    (node,) = [n for n in result.model.graph.node if n.op_type == "FlashAttention"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["softcap"] == pytest.approx(0.5) and attrs["scale"] == pytest.approx(D ** -0.5)


@pytest.mark.parametrize("cap, reason", [
    ((30.0, 50.0), "softcap divides by 30.0 and multiplies by 50.0"),
    ((-2.0, -2.0), "softcap -2.0 is not positive"),
])
def test_softcap_that_is_not_the_ops_kept(cap, reason):
    result = rewrite(eager_model(softcap=cap))
    assert result.report.total_fused == 0
    (unfused,) = result.report.unfused
    assert reason in unfused.reason, unfused.reason


# ---------------------------------------------------------------- masked_fill


@pytest.mark.parametrize("side", ["keep", "hide"])
def test_masked_fill_with_float32_min_becomes_an_additive_mask(side):
    """Where(keep, S, min) then + mask: exact, fully hidden rows included (s + min == min in
    float32), which random conditions over 7 keys produce now and then."""
    model = eager_model(fill=(side, float(np.finfo(np.float32).min)))
    result = _fused_and_verified(model, {"Greater": 1, "Constant": 2, "Where": 1, "Add": 1, "FlashAttention": 1})
    assert "fill" in result.report.fused[0].variant


def distilbert_model() -> onnx.ModelProto:
    """DistilBERT's eager attention: (q / √D) @ kᵀ, masked_fill((mask == 0).view(B, 1, 1, S)
    .expand_as(scores), min), Softmax, @ v: the condition is expanded to Shape(scores)."""
    g = Graph()
    scores = g.op("MatMul", g.op("Div", "q", g.const(D ** 0.5, np.float32)),
                  g.op("Transpose", "k", perm=[0, 1, 3, 2]))
    hide = g.op("Unsqueeze", g.op("Equal", "attention_mask", g.const(0, np.int64)),
                g.const([1, 2], np.int64))
    hide = g.op("Cast", g.op("Expand", hide, g.op("Shape", scores)), to=TensorProto.BOOL)
    scores = g.op("Where", hide, g.const(float(np.finfo(np.float32).min), np.float32), scores)
    g.nodes.append(helper.make_node("MatMul", [g.op("Softmax", scores, axis=-1), "v"], ["y"],
                                    name="pv"))
    info = lambda n: helper.make_tensor_value_info(n, F32, ["B", H, "S", D])  # noqa: E731
    inputs = [info("q"), info("k"), info("v"),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "S"])]
    graph = helper.make_graph(g.nodes, "distilbert", inputs, [info("y")], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_masked_fill_expanded_to_the_scores_shape_fuses_with_a_key_mask():
    result = _fused_and_verified(distilbert_model(), {
        "Div": 1, "Equal": 1, "Constant": 2, "Unsqueeze": 1, "Where": 1, "FlashAttention": 1})
    (entry,) = result.report.fused
    assert entry.mask == "additive (B,1,1,S)", entry.mask
    assert not result.report.declined, result.report.format_table()


def test_masked_fill_with_minus_inf_fuses():
    model = eager_model(fill=("keep", -np.inf))
    result = rewrite(model)
    assert result.report.total_fused == 1
    # rows with a visible key agree (a fully hidden row is NaN in the original, 0 in the op)
    from onnx_reference import run_reference
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((2, H, 5, D)).astype(np.float32) for n in "qkv"}
    feeds["mask"] = np.zeros((2, 1, 1, 5), np.float32)
    feeds["pick"] = rng.standard_normal((2, 1, 5, 5)).astype(np.float32)
    feeds["pick"][..., 0] = 1.0
    np.testing.assert_allclose(run_reference(result.model, feeds)[0], run_reference(model, feeds)[0],
                               rtol=1e-5, atol=1e-5)


def test_masked_fill_with_float16_min_is_kept():
    result = rewrite(eager_model(dtype=F16, fill=("keep", -65504.0)))
    assert result.report.total_fused == 0
    (unfused,) = result.report.unfused
    assert "does not absorb the scores" in unfused.reason, unfused.reason


# ---------------------------------------------------------------- 3-D (B·H, S, D) views

N = 6  # B·H


def view3d_model(*, baddbmm=False, kv_n=N, reshape4d=False) -> onnx.ModelProto:
    """nn.MultiheadAttention's bmm path: Mul(q, c) @ Transpose(k, [0, 2, 1]) → Softmax → @ v,
    all (N, S, D); ``baddbmm``: Add(Mul(bias, beta), Mul(MatMul(q, kᵀ), alpha)) (BLOOM's alibi)."""
    g = Graph()
    kt = g.op("Transpose", "k", perm=[0, 2, 1])
    if baddbmm:
        scores = g.op("Add", g.op("Mul", "bias", g.const(1.0, np.float32)),
                      g.op("Mul", g.op("MatMul", "q", kt), g.const(D ** -0.5, np.float32)))
    else:
        scores = g.op("MatMul", g.op("Mul", "q", g.const(D ** -0.5, np.float32)), kt)
    g.nodes.append(helper.make_node("MatMul", [g.op("Softmax", scores, axis=-1), "v"], ["y"],
                                    name="pv"))
    info = lambda n, s: helper.make_tensor_value_info(n, F32, s)  # noqa: E731
    inputs = [info("q", [N, "S", D]), info("k", [kv_n, "S", D]), info("v", [kv_n, "S", D])]
    if baddbmm:
        inputs.append(info("bias", [N, 1, "S"]))
    graph = helper.make_graph(g.nodes, "view3d", inputs, [info("y", [N, "S", D])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def bloom_model(*, heads=H, fill=True) -> onnx.ModelProto:
    """BLOOM's attention: Add(Mul(alibi, 1), Mul(MatMul(q3, kᵀ3), alpha)) (B·H, S, S), viewed as
    (B, H, S, S), masked_fill(causal, float32 min), Softmax, viewed back, bmm with v3."""
    g = Graph()
    kt = g.op("Transpose", "k", perm=[0, 2, 1])
    scores = g.op("Add", g.op("Mul", g.op("MatMul", "q", kt), g.const(D ** -0.5, np.float32)),
                  g.op("Mul", "alibi", g.const(1.0, np.float32)))
    sizes = [g.op("Shape", "q", start=1, end=2), g.op("Shape", "k", start=1, end=2)]
    shape4 = g.op("Concat", g.const([-1, heads], np.int64), *sizes, axis=0)
    scores = g.op("Reshape", scores, shape4)
    if fill:
        keep = g.op("Greater", "pick", g.const(0.0, np.float32))
        scores = g.op("Where", keep, scores, g.const(float(np.finfo(np.float32).min), np.float32))
    probs = g.op("Softmax", scores, axis=-1)
    shape3 = g.op("Concat", g.const([-1], np.int64), *sizes, axis=0)
    g.nodes.append(helper.make_node("MatMul", [g.op("Reshape", probs, shape3), "v"], ["y"],
                                    name="pv"))
    info = lambda n, s: helper.make_tensor_value_info(n, F32, s)  # noqa: E731
    inputs = [info("q", [f"{heads}*B", "S", D]), info("k", [f"{heads}*B", "S", D]),
              info("v", [f"{heads}*B", "S", D]),
              info("alibi", [f"{heads}*B", 1, "S"])]
    if fill:
        inputs.append(info("pick", ["B", 1, "S", "S"]))
    graph = helper.make_graph(g.nodes, "bloom", inputs, [info("y", [f"{heads}*B", "S", D])],
                              g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_bloom_4d_view_of_3d_scores_fuses():
    model = bloom_model()
    result = rewrite(model)
    assert result.report.total_fused == 1, result.report.format_table()
    (entry,) = result.report.fused
    assert "view4d" in entry.variant and entry.heads == H
    onnx.checker.check_model(result.model, full_check=True)
    from onnx_reference import run_reference
    rng = np.random.default_rng(0)
    b, s = 2, 5
    feeds = {n: rng.standard_normal((b * H, s, D)).astype(np.float32) for n in "qkv"}
    feeds["alibi"] = rng.standard_normal((b * H, 1, s)).astype(np.float32)
    feeds["pick"] = rng.standard_normal((b, 1, s, s)).astype(np.float32)
    np.testing.assert_allclose(run_reference(result.model, feeds)[0], run_reference(model, feeds)[0],
                               rtol=1e-5, atol=1e-5)
    from ort_flash.verify import verify
    check = verify(model, result.model, shapes={n: [b * H, s, D] for n in "qkv"} | {
        "alibi": [b * H, 1, s], "pick": [b, 1, s, s]}, seed=0)
    assert check.passed, check.format_table()


@pytest.mark.parametrize("kwargs, ops_after", [
    ({}, {"Mul": 1, "Constant": 4, "Unsqueeze": 3, "FlashAttention": 1, "Squeeze": 1}),
    ({"baddbmm": True}, {"Mul": 1, "Constant": 5, "Unsqueeze": 4, "FlashAttention": 1, "Squeeze": 1}),
], ids=["multihead_bmm", "baddbmm_bias"])
def test_3d_view_runs_as_batch_one(kwargs, ops_after):
    result = _fused_and_verified(view3d_model(**kwargs), ops_after)
    (entry,) = result.report.fused
    assert entry.heads == N


def test_3d_view_with_a_shared_kv_slice_is_kept():
    result = rewrite(view3d_model(kv_n=1))
    assert result.report.total_fused == 0
    (unfused,) = result.report.unfused
    assert "differ in the 3-D view" in unfused.reason, unfused.reason


# ---------------------------------------------------------------- a scale computed from the shape


def sdpa_shape_scale_model() -> onnx.ModelProto:
    """torch's SDPA decomposition with scale=None as Optimum's GPT-2 has it: Q and Kᵀ each
    multiplied by Sqrt(1 / Sqrt(Cast(Shape(q)[-1:])))."""
    g = Graph()
    dim = g.op("Slice", g.op("Shape", "q"), g.const([-1], np.int64), g.const([2**63 - 1], np.int64),
               g.const([0], np.int64))
    inv = g.op("Div", g.const([1.0], np.float32), g.op("Sqrt", g.op("Cast", dim, to=F32)))
    root = g.op("Sqrt", g.op("Cast", inv, to=F32))
    kt = g.op("Mul", g.op("Transpose", "k", perm=[0, 1, 3, 2]), root)
    scores = g.op("Add", g.op("MatMul", g.op("Mul", "q", root), kt), "mask")
    g.nodes.append(helper.make_node("MatMul", [g.op("Softmax", scores, axis=-1), "v"], ["y"],
                                    name="pv"))
    info = lambda n, s: helper.make_tensor_value_info(n, F32, s)  # noqa: E731
    inputs = [info(n, ["B", H, "S", D]) for n in "qkv"] + [info("mask", ["B", 1, 1, "S"])]
    graph = helper.make_graph(g.nodes, "sdpa_shape", inputs, [info("y", ["B", H, "S", D])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("build, rule", [
    (lambda: eager_model(scale="shape"), "matmul_softmax_attention"),
    (sdpa_shape_scale_model, "sdpa_attention"),
], ids=["eager_div_sqrt_shape", "sdpa_sqrt_inverse_sqrt_shape"])
def test_scale_from_a_static_head_dim_is_a_constant(build, rule):
    result = _fused_and_verified(build(), {"FlashAttention": 1})
    (entry,) = result.report.fused
    assert entry.rule == rule and entry.scale == pytest.approx(D ** -0.5, rel=1e-6)


def test_scale_from_a_symbolic_head_dim_is_not_a_constant():
    model = eager_model(scale="shape", head_dim="D")
    result = rewrite(model)
    assert result.report.total_fused == 0
    (unfused,) = result.report.unfused
    assert "scale is not a constant" in unfused.reason, unfused.reason


# ---------------------------------------------------------------- Optimum's with-past decoder mask


def optimum_step_model(*, mask_from="length") -> onnx.ModelProto:
    """A GQA decoding step as Optimum exports it: present = Concat(past, new), repeat_kv, and
    Where(Slice(full, 0, Shape(repeat_kv(present))[2], axis 3), 0, -inf) for a full bool
    (B, 1, S, P+S) mask of key <= query + P and attention_mask[b, key]. ``mask_from="values"``
    adds a bias computed from the concatenated keys' values instead (which blocks kv_cache)."""
    g = Graph()
    hkv, n = 2, 2
    g.nodes.append(helper.make_node("Concat", ["past_key", "k"], ["present_key"], axis=2, name="cat_k"))
    g.nodes.append(helper.make_node("Concat", ["past_value", "v"], ["present_value"], axis=2,
                                    name="cat_v"))

    def repeat(x):
        full = g.op("Concat", g.op("Shape", x, start=0, end=1), g.const([hkv, n], np.int64),
                    g.op("Shape", x, start=2, end=4), axis=0)
        e = g.op("Expand", g.op("Unsqueeze", x, g.const([2], np.int64)), full)
        shape4 = g.op("Concat", g.op("Shape", x, start=0, end=1), g.const([hkv * n], np.int64),
                      g.op("Shape", x, start=2, end=4), axis=0)
        return g.op("Reshape", e, shape4)

    rk, rv = repeat("present_key"), repeat("present_value")

    def length(x, axis):
        return g.op("Squeeze", g.op("Shape", x, start=axis, end=axis + 1), g.const([0], np.int64))

    past, seq = length("past_key", 2), length("q", 2)
    total = g.op("Add", past, seq)
    keys = g.op("Unsqueeze", g.op("Range", g.const(0, np.int64), total, g.const(1, np.int64)),
                g.const([0, 1, 2], np.int64))
    queries = g.op("Unsqueeze", g.op("Range", past, total, g.const(1, np.int64)),
                   g.const([0, 1, 3], np.int64))
    padding = g.op("Unsqueeze", g.op("Cast", "attention_mask", to=TensorProto.BOOL),
                   g.const([1, 2], np.int64))
    full = g.op("And", padding, g.op("LessOrEqual", keys, queries))
    end = g.op("Unsqueeze", g.op("Gather", g.op("Shape", rk), g.const(2, np.int64), axis=0),
               g.const([0], np.int64))
    sliced = g.op("Slice", full, g.const([0], np.int64), end, g.const([3], np.int64))
    mask = g.op("Where", sliced, g.const(0.0, np.float32), g.const(-np.inf, np.float32))
    if mask_from == "values":
        mean = g.op("ReduceMean", "present_key", axes=[1, 3], keepdims=1)  # (B, 1, P+S, 1)
        mask = g.op("Add", mask, g.op("Transpose", mean, perm=[0, 1, 3, 2]))
    scores = g.op("Mul", g.op("MatMul", "q", g.op("Transpose", rk, perm=[0, 1, 3, 2])),
                  g.const(D ** -0.5, np.float32))
    probs = g.op("Softmax", g.op("Add", scores, mask), axis=-1)
    g.nodes.append(helper.make_node("MatMul", [probs, rv], ["y"], name="pv"))
    info = lambda name, h, s: helper.make_tensor_value_info(name, F32, ["B", h, s, D])  # noqa: E731
    inputs = [info("q", hkv * n, "S"), info("k", hkv, "S"), info("v", hkv, "S"),
              info("past_key", hkv, "past"), info("past_value", hkv, "past"),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "S + past"])]
    outputs = [info("y", hkv * n, "S"), info("present_key", hkv, "S + past"),
               info("present_value", hkv, "S + past")]
    graph = helper.make_graph(g.nodes, "optimum_step", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_optimum_with_past_mask_becomes_causal_with_a_past():
    model = optimum_step_model()
    result = rewrite(model)
    (entry,) = result.report.fused
    assert (entry.cache, entry.causal, entry.kv_heads, entry.mask) == (
        "past/present", True, 2, "additive (B,1,1,Skv)"), result.report.format_table()
    assert not result.report.declined, result.report.format_table()
    ops = _ops(result.model)
    assert ops["FlashAttention"] == 1 and "Concat" not in [
        n.op_type for n in result.model.graph.node if n.name in ("cat_k", "cat_v")]
    assert not {"Expand", "Slice", "LessOrEqual", "Range"} & set(ops), ops
    onnx.checker.check_model(result.model, full_check=True)
    check = verify(model, result.model, seq_len=5, past_len=6, seed=0)
    assert check.passed, check.format_table()


def test_mask_computed_from_the_concatenated_values_keeps_the_concat():
    model = optimum_step_model(mask_from="values")
    result = rewrite(model)
    (entry,) = result.report.fused
    assert entry.cache is None or entry.cache != "past/present"
    assert "computed from the concatenated K/V" in result.report.declined[entry.fused_node]["kv_cache"]
    check = verify(model, result.model, seq_len=5, past_len=6, seed=0)
    assert check.passed, check.format_table()
