"""``packed_qkv``: a self-attention's three projections of one input become one MatMul (and one
bias Add) whose output the op reads as packed QKV (K and V omitted); on small hand-built graphs
(BERT's projection chain), rewritten, checked with onnx.checker, loaded and verified on the CPU
EP against the original. Each declined case keeps three projections and names the reason."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_flash.rewriter import rewrite
from ort_flash.verify import verify
from test_rewrite_masks import Graph, _padding

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def encoder_model(*, heads=4, head_dim=8, dtype=F32, bias=True, mask=True, kv_from="x",
                  weight_input=None, bias_only_q=False, extra_use=None, split=None, kv_heads=None,
                  out_proj=None, mask_fill=-np.inf) -> onnx.ModelProto:
    """x (B, S, H*D) → query/key/value MatMul [+ Add bias] → Reshape (B, S, H, D) → Transpose →
    eager attention [+ (B, 1, 1, S) padding mask] → Transpose → Reshape → output. ``kv_from="y"``:
    K and V project a second input (cross-attention); ``weight_input``: that projection's weight
    is a graph input; ``bias_only_q``: only Q has a bias (the packed bias
    then holds zeros for K and V); ``extra_use``: that projection's
    output is also a graph output; ``split`` ("input" or "attribute"): one projection (hidden,
    3 * hidden) and a Split of its last axis into Q, K and V (GPT-2's c_attn), the sizes a
    constant input or (opset 11) an attribute. ``kv_heads``: K and V project to that many heads
    (GQA, repeated for the scores as eager attention does). ``out_proj`` ("add", "skip_ln",
    "skip_ln_no_bias"): the merged heads go through an output projection MatMul and its bias Add,
    or ONNX Runtime's SkipLayerNormalization (residual x, with or without its bias input), as BERT
    after ONNX Runtime's fusions. ``mask_fill``: the additive mask's value on padded keys."""
    g = Graph()
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    hidden = heads * head_dim
    rng = np.random.default_rng(0)
    inputs = [helper.make_tensor_value_info("x", dtype, ["B", "S", hidden])]
    if kv_from == "y":
        inputs.append(helper.make_tensor_value_info("y", dtype, ["B", "T", hidden]))
    if mask:
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                                    ["B", "T" if kv_from == "y" else "S"]))
    outputs = []
    heads_shape = g.const([0, 0, heads, head_dim], np.int64)

    kv_heads = kv_heads or heads

    def project(name, source):
        width = hidden if name == "q" else kv_heads * head_dim
        if name == weight_input:
            w = f"w_{name}"
            inputs.append(helper.make_tensor_value_info(w, dtype, [hidden, width]))
        else:
            w = g.const((rng.standard_normal((hidden, width)) / hidden ** 0.5).astype(np_dtype))
        out = g.op("MatMul", source, w)
        if bias and (name == "q" or not bias_only_q):
            out = g.op("Add", g.const(rng.standard_normal(width).astype(np_dtype) * 0.5), out)
        if name == extra_use:
            outputs.append(helper.make_tensor_value_info(out, dtype, ["B", "S", width]))
        shape = heads_shape if name == "q" else g.const([0, 0, kv_heads, head_dim], np.int64)
        heads_first = g.op("Transpose", g.op("Reshape", out, shape), perm=[0, 2, 1, 3])
        if name != "q" and kv_heads != heads:  # repeat_kv: (B, Hkv, S, D) -> (B, Hq, S, D)
            b, s = (g.op("Shape", heads_first, start=i, end=i + 1) for i in (0, 2))
            group = heads // kv_heads
            wide = g.op("Expand", g.op("Unsqueeze", heads_first, g.const([2], np.int64)),
                        g.op("Concat", b, g.const([kv_heads, group], np.int64), s,
                             g.const([head_dim], np.int64), axis=0))
            heads_first = g.op("Reshape", wide, g.op("Concat", b, g.const([heads], np.int64), s,
                                                     g.const([head_dim], np.int64), axis=0))
        return heads_first

    if split:
        w = g.const((rng.standard_normal((hidden, 3 * hidden)) / hidden ** 0.5).astype(np_dtype))
        joint = g.op("Add", g.op("MatMul", "x", w), g.const(rng.standard_normal(3 * hidden).astype(np_dtype) * 0.1))
        g.n += 1
        parts = [f"split_{g.n}_{i}" for i in range(3)]
        sizes = [hidden] * 3
        if split == "input":
            g.nodes.append(helper.make_node("Split", [joint, g.const(sizes, np.int64)], parts, axis=2))
        else:
            g.nodes.append(helper.make_node("Split", [joint], parts, axis=-1, split=sizes))
        if extra_use == "v":
            outputs.append(helper.make_tensor_value_info(parts[2], dtype, ["B", "S", hidden]))
        q, k, v = (g.op("Transpose", g.op("Reshape", p, heads_shape), perm=[0, 2, 1, 3]) for p in parts)
    else:
        q = project("q", "x")
        k = project("k", kv_from)
        v = project("v", kv_from)
    scores = g.op("Div", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])),
                  g.const(head_dim ** 0.5, np_dtype))
    if mask:
        additive = g.op("Where", _padding(g), g.const(0.0, np_dtype), g.const(mask_fill, np_dtype))
        scores = g.op("Add", scores, additive)
    y = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    merged = g.op("Reshape", g.op("Transpose", y, perm=[0, 2, 1, 3]), g.const([0, 0, hidden], np.int64))
    if out_proj:
        projected = g.op("MatMul", merged, g.const((rng.standard_normal((hidden, hidden)) / hidden ** 0.5).astype(np_dtype)))
        bo = g.const(rng.standard_normal(hidden).astype(np_dtype) * 0.5)
        if out_proj == "add":
            merged = g.op("Add", projected, bo)
        else:
            gamma, beta = (g.const(rng.standard_normal(hidden).astype(np_dtype)) for _ in range(2))
            g.n += 1
            merged = f"skip_ln_{g.n}"
            g.nodes.append(helper.make_node(
                "SkipLayerNormalization", [projected, "x", gamma, beta] + ([bo] if out_proj == "skip_ln" else []),
                [merged], name=merged, domain="com.microsoft", epsilon=1e-5))
    g.nodes.append(helper.make_node("Identity", [merged], ["out"], name="out"))
    outputs.insert(0, helper.make_tensor_value_info("out", dtype, ["B", "S", hidden]))
    graph = helper.make_graph(g.nodes, "encoder", inputs, outputs, initializer=g.inits)
    opsets = [helper.make_opsetid("", 11 if split == "attribute" else 17)]
    if out_proj and out_proj != "add":
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def _ops(model):
    return dict(collections.Counter(n.op_type for n in model.graph.node))


def _flash(model):
    (node,) = [n for n in model.graph.node if n.op_type == "FlashAttention"]
    return node


def _verified(model, **feeds):
    result = rewrite(model)
    assert result.report.total_fused == 1, result.report.format_table()
    onnx.checker.check_model(result.model, full_check=True)
    check = verify(model, result.model, seq_len=11, batch=3, seed=0, **feeds)
    assert check.passed, check.format_table()
    return result


@pytest.mark.parametrize("kwargs", [dict(), dict(bias=False), dict(mask=False), dict(dtype=F16),
                                    dict(heads=2, head_dim=64), dict(bias_only_q=True)],
                         ids=["bias_mask", "no_bias", "no_mask", "fp16", "d64", "bias_only_q"])
def test_projections_become_one_matmul_read_as_packed_qkv(kwargs):
    model = encoder_model(**kwargs)
    result = _verified(model)
    ops = _ops(result.model)
    assert ops["MatMul"] == 1, ops  # the three projections (the score MatMuls are fused)
    assert ops.get("Add", 0) == (1 if kwargs.get("bias", True) else 0), ops
    node = _flash(result.model)
    assert list(node.input[1:3]) in ([], ["", ""]), node  # K and V omitted: packed
    (fused,) = result.report.fused
    assert fused.layout == "packed" and "packed_qkv" in fused.refined_by
    # The packed weight is the three side by side; the old ones are gone.
    inits = {i.name: numpy_helper.to_array(i) for i in result.model.graph.initializer}
    hidden = model.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    assert sum(a.shape == (hidden, hidden) for a in inits.values()) == 0
    assert sum(a.shape == (hidden, 3 * hidden) for a in inits.values()) == 1


def test_cross_attention_keeps_its_projections_without_a_decline():
    result = _verified(encoder_model(kv_from="y"))
    node = _flash(result.model)
    assert node.input[1] and node.input[2], node
    assert result.report.declined == {}  # not a self-attention: nothing to pack, nothing to report


@pytest.mark.parametrize("kwargs, reason", [
    (dict(weight_input="k"), "K's MatMul weight is not a constant matrix"),
    (dict(extra_use="v"), "V's bias Add has other uses"),
    (dict(heads=8, head_dim=4), "head size 4 is not a multiple of 8"),
], ids=["weight_is_input", "v_used_elsewhere", "d4"])
def test_projections_that_cannot_be_packed_are_kept(kwargs, reason):
    model = encoder_model(**kwargs)
    result = _verified(model)
    node = _flash(result.model)
    assert node.input[1] and node.input[2], node
    (fused,) = result.report.fused
    assert fused.layout == "BSD"
    declined = result.report.declined[fused.fused_node]
    assert reason in declined["packed_qkv"], declined


@pytest.mark.parametrize("split", ["input", "attribute"])
def test_a_split_of_one_projection_is_read_as_packed_qkv(split):
    result = _verified(encoder_model(split=split, mask=split == "input"))  # opset 11: no mask helper
    ops = _ops(result.model)
    assert "Split" not in ops and ops["MatMul"] == 1, ops
    node = _flash(result.model)
    assert list(node.input[1:3]) in ([], ["", ""]), node
    (fused,) = result.report.fused
    assert fused.layout == "packed" and "packed_qkv" in fused.refined_by


def test_a_split_output_used_elsewhere_is_kept():
    result = _verified(encoder_model(split="input", extra_use="v"))
    assert "Split" in _ops(result.model)
    (fused,) = result.report.fused
    assert fused.layout == "BSD"  # (the matcher itself refuses a Split whose output leaves the match)
