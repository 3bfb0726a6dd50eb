"""Rule tables for matmul_softmax_attention and sdpa_attention on small hand-built graphs.

Each case builds one attention (or a plain classifier) with onnx.helper, rewrites it, and checks
the fused count, the op counts left, and for unfused cases the reason the report gives. Fused
cases are also evaluated with onnx.reference (FlashAttention = ONNX Attention-25's reference)
against the original graph on random inputs.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_reference import run_reference
from ort_flash.rewriter import RewriteReport, rewrite

B, H, S, D = "B", 4, "S", 8  # symbolic batch and sequence, static heads and head dim


def attention_model(
    *, k_perm=(0, 1, 3, 2), scale_op="Div", scale=8.0, scale_source="initializer",
    mask_shape=("B", 1, 1, "S"), softmax_axis=-1, cast_to=None, opset=17, kv_heads=H,
    dtype=TensorProto.FLOAT, commute=False, mask_first=False, weights_output=False, q_rank=4,
) -> onnx.ModelProto:
    """Q, K, V (and mask) as graph inputs; K enters as Transpose(K, k_perm) or, with
    k_perm=None, already transposed (B, H, D, S)."""
    nodes, inits = [], []
    q_shape = [B, H, S, D] if q_rank == 4 else [B, S, D]
    if k_perm is None:
        k_shape = [B, kv_heads, D, S] if q_rank == 4 else [B, D, S]
        key_t = "k"
    else:
        kt_shape = [B, kv_heads, D, S]
        k_shape = [None] * 4
        for axis, source in enumerate(k_perm):
            k_shape[source] = kt_shape[axis]
        nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=list(k_perm), name="k_t"))
        key_t = "kt"
    v_shape = [B, kv_heads, S, D] if q_rank == 4 else [B, S, D]
    v_dtype = cast_to if cast_to is not None else dtype  # MatMul(P, V) takes one dtype
    inputs = [helper.make_tensor_value_info(n, t, s) for n, t, s in (
        ("q", dtype, q_shape), ("k", dtype, k_shape), ("v", v_dtype, v_shape))]
    nodes.append(helper.make_node("MatMul", ["q", key_t], ["scores"], name="qk"))
    scores = "scores"

    def add_mask(x):
        if mask_shape is None:
            return x
        inputs.append(helper.make_tensor_value_info("mask", dtype, list(mask_shape)))
        args = ["mask", x] if commute else [x, "mask"]
        nodes.append(helper.make_node("Add", args, [f"{x}_masked"], name="add_mask"))
        return f"{x}_masked"

    if mask_first:
        scores = add_mask(scores)
    if scale_op is not None:
        c = numpy_helper.from_array(np.array(scale, helper.tensor_dtype_to_np_dtype(dtype)), "c")
        if scale_source == "initializer":
            inits.append(c)
        elif scale_source == "constant":
            nodes.append(helper.make_node("Constant", [], ["c"], name="c_const", value=c))
        else:
            inputs.append(helper.make_tensor_value_info("c", dtype, []))
        args = ["c", scores] if commute else [scores, "c"]
        nodes.append(helper.make_node(scale_op, args, ["scaled"], name="scale"))
        scores = "scaled"
    if not mask_first:
        scores = add_mask(scores)
    axis = {} if softmax_axis is None else {"axis": softmax_axis}
    nodes.append(helper.make_node("Softmax", [scores], ["probs"], name="softmax", **axis))
    probs = "probs"
    if cast_to is not None:
        nodes.append(helper.make_node("Cast", ["probs"], ["probs_cast"], to=cast_to, name="cast"))
        probs = "probs_cast"
    nodes.append(helper.make_node("MatMul", [probs, "v"], ["y"], name="pv"))
    y_dtype = cast_to if cast_to is not None else dtype
    y_shape = q_shape if mask_shape is None or len(mask_shape) <= 4 else [1] + q_shape
    outputs = [helper.make_tensor_value_info("y", y_dtype, y_shape)]
    if weights_output:
        outputs.append(helper.make_tensor_value_info("probs", dtype, [B, H, S, S]))
    graph = helper.make_graph(nodes, "attention", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def classifier_model() -> onnx.ModelProto:
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 10], np.ones(160, np.float32))
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["logits"], name="fc"),
         helper.make_node("Softmax", ["logits"], ["p"], axis=-1, name="softmax")],
        "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 10])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def sdpa_model(*, k_scale_source="initializer", softmax_axis=-1) -> onnx.ModelProto:
    """The SDPA decomposition: MatMul(Q·a, Kᵀ·b) -> Softmax -> MatMul(V), a = b = D^-1/4."""
    c = numpy_helper.from_array(np.array(D ** -0.25, np.float32), "c")
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, H, S, D]) for n in "qkv"]
    inits = [c]
    if k_scale_source == "input":
        inputs.append(helper.make_tensor_value_info("ck", TensorProto.FLOAT, []))
    else:
        inits.append(numpy_helper.from_array(np.array(D ** -0.25, np.float32), "ck"))
    nodes = [
        helper.make_node("Mul", ["q", "c"], ["qs"], name="q_scale"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2], name="k_t"),
        helper.make_node("Mul", ["kt", "ck"], ["kts"], name="k_scale"),
        helper.make_node("MatMul", ["qs", "kts"], ["scores"], name="qk"),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=softmax_axis, name="softmax"),
        helper.make_node("MatMul", ["probs", "v"], ["y"], name="pv"),
    ]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, H, S, D])]
    model = helper.make_model(helper.make_graph(nodes, "sdpa", inputs, out, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# id, builder kwargs, fused, op counts after rewriting
POSITIVE = [
    ("bert_div_mask", {}, 1, {"FlashAttention": 1}),
    ("gpt_mul_causal_cast", dict(k_perm=(0, 2, 3, 1), scale_op="Mul", scale=0.125,
                                 scale_source="constant", mask_shape=(1, 1, "S", "S"),
                                 cast_to=TensorProto.FLOAT), 1, {"Transpose": 1, "FlashAttention": 1}),
    ("pretransposed_no_scale_no_mask", dict(k_perm=None, scale_op=None, mask_shape=None), 1,
     {"Transpose": 1, "FlashAttention": 1}),
    ("commuted_mul_add", dict(scale_op="Mul", scale=0.35, commute=True), 1, {"FlashAttention": 1}),
    ("mqa_one_kv_head", dict(kv_heads=1), 1, {"FlashAttention": 1}),
    ("rank2_mask", dict(mask_shape=("S", "S")), 1, {"FlashAttention": 1}),
    ("fp16", dict(dtype=TensorProto.FLOAT16, scale_source="constant"), 1, {"FlashAttention": 1}),
    ("opset11_axis3", dict(opset=11, softmax_axis=3), 1, {"FlashAttention": 1}),
]

# id, builder (kwargs or callable), reason substring
NEGATIVE = [
    ("softmax_axis_1", dict(softmax_axis=1), "softmax axis is 1, not the last"),
    ("opset11_default_axis", dict(opset=11, softmax_axis=None), "softmax axis is 1, not the last"),
    ("scale_not_constant", dict(scale_source="input"), "scale is not a constant"),
    ("mask_rank5", dict(mask_shape=(1, "B", 1, 1, "S")), "mask rank 5 does not broadcast"),
    ("mask_not_broadcastable", dict(mask_shape=("B", 1, 7, "S")),
     "mask dim 2 (7) does not provably broadcast to scores dim (S)"),
    ("plain_classifier", classifier_model, "no MatMul(Q,Kᵀ) producer"),
    ("weights_also_output", dict(weights_output=True), "also used outside the attention"),
    ("cast_changes_dtype", dict(cast_to=TensorProto.FLOAT16), "Cast after Softmax changes the dtype"),
    ("mask_before_scale", dict(mask_first=True), "unsupported op chain MatMul → Add → Div → Softmax"),
    ("sdpa_softmax_axis_2", lambda: sdpa_model(softmax_axis=2), "softmax axis is 2, not the last"),
]


def _applied(report: RewriteReport) -> dict[str, int]:
    return {rule: n for rule, n in report.counts.items() if n}


def _ops(model: onnx.ModelProto) -> dict[str, int]:
    return dict(collections.Counter(n.op_type for n in model.graph.node))


def _build(builder) -> onnx.ModelProto:
    return builder() if callable(builder) else attention_model(**builder)


def _feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = {"B": 2, "S": 5}
    feeds = {}
    for value in model.graph.input:
        t = value.type.tensor_type
        shape = [d.dim_value or sizes[d.dim_param] for d in t.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        x = rng.standard_normal(shape)
        if value.name == "mask":  # additive: 0 or a large negative, key 0 always visible
            x = np.where(rng.random(shape) < 0.3, -1e4, 0.0)
            x[..., 0] = 0.0
        feeds[value.name] = x.astype(dtype)
    return feeds


@pytest.mark.parametrize("case_id, kwargs, fused, ops_after", POSITIVE, ids=[c[0] for c in POSITIVE])
def test_fuses(case_id, kwargs, fused, ops_after):
    model = attention_model(**kwargs)
    before = model.SerializeToString()
    result = rewrite(model)
    assert model.SerializeToString() == before, "the input model must stay untouched"
    assert _applied(result.report) == {"matmul_softmax_attention": fused}
    assert _ops(result.model) == ops_after
    assert result.report.unfused == []
    (entry,) = result.report.fused
    assert (entry.heads, entry.head_dim, entry.causal) == (H, D, False)
    assert entry.mask.split()[0] == ("none" if kwargs.get("mask_shape", ()) is None else "additive")
    onnx.checker.check_model(result.model, full_check=True)
    assert [i.name for i in result.model.graph.input] == [i.name for i in model.graph.input]
    assert [o.name for o in result.model.graph.output] == [o.name for o in model.graph.output]
    assert result.model.ir_version == model.ir_version
    assert ("ort_flash", 1) in [(o.domain, o.version) for o in result.model.opset_import]

    feeds = _feeds(model)
    (want,) = run_reference(model, feeds)
    (got,) = run_reference(result.model, feeds)
    tol = 1e-2 if kwargs.get("dtype") == TensorProto.FLOAT16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("case_id, builder, reason", NEGATIVE, ids=[c[0] for c in NEGATIVE])
def test_leaves_alone_with_reason(case_id, builder, reason):
    model = _build(builder)
    result = rewrite(model)
    assert result.report.total_fused == 0
    assert _ops(result.model) == _ops(model)
    assert [o.domain for o in result.model.opset_import] == [o.domain for o in model.opset_import]
    (unfused,) = result.report.unfused
    assert unfused.node == "softmax"
    assert reason in unfused.reason, unfused.reason
    assert RewriteReport.from_json(result.report.to_json()) == result.report


def test_sdpa_scales_multiply():
    result = rewrite(sdpa_model())
    (entry,) = result.report.fused
    assert entry.rule == "sdpa_attention" and entry.scale == pytest.approx(D ** -0.5, rel=1e-6)
    feeds = _feeds(sdpa_model())
    np.testing.assert_allclose(run_reference(result.model, feeds)[0],
                               run_reference(sdpa_model(), feeds)[0], rtol=1e-5, atol=1e-5)


def test_sdpa_with_a_runtime_key_scale_keeps_the_scales_outside():
    """Not the SDPA form (the K scale is an input), but still attention: fused with scale 1 and
    the two Muls left in front of the op."""
    model = sdpa_model(k_scale_source="input")
    result = rewrite(model)
    (entry,) = result.report.fused
    assert (entry.rule, entry.scale) == ("matmul_softmax_attention", 1.0)
    assert _ops(result.model)["Mul"] == 2
    feeds = {**_feeds(sdpa_model()), "ck": np.array(0.7, np.float32)}
    np.testing.assert_allclose(run_reference(result.model, feeds)[0],
                               run_reference(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_scale_is_reciprocal_of_div_and_value_of_mul():
    div = rewrite(attention_model(scale_op="Div", scale=8.0)).report.fused[0]
    mul = rewrite(attention_model(scale_op="Mul", scale=0.35)).report.fused[0]
    none = rewrite(attention_model(scale_op=None)).report.fused[0]
    assert (div.scale, none.scale) == (0.125, 1.0)
    assert mul.scale == pytest.approx(0.35, rel=1e-7)
