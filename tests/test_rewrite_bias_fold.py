"""``bias_fold``: a packed QKV's K bias dropped and its V bias folded into the output projection's
bias, the op reading Q apart and K | V as packed KV (V omitted); on small hand-built encoders
(BERT's chain, with the output projection's bias in an Add or in ONNX Runtime's
SkipLayerNormalization), rewritten, checked with onnx.checker, loaded and verified on the CPU EP
against the original. Each declined case keeps the packed QKV and names the reason."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxscript.rewriter import pattern

from ort_flash.rewriter import rewrite
from ort_flash.rewriter.refinements import bias_fold
from test_rewrite_packed_qkv import _flash, _ops, _verified, encoder_model

F16 = TensorProto.FLOAT16


def _declined(result) -> str:
    return next(why for d in result.report.declined.values() for rule, why in d.items() if rule.startswith("bias_fold"))


@pytest.mark.parametrize("kwargs", [
    dict(out_proj="add"),
    dict(out_proj="skip_ln"),
    dict(out_proj="skip_ln_no_bias"),
    dict(out_proj="add", dtype=F16, heads=2, head_dim=64),
    dict(out_proj="add", kv_heads=2),
    dict(out_proj="skip_ln", mask=False),
    dict(out_proj="add", mask_fill=float(np.finfo(np.float32).min)),
    dict(out_proj="add", bias_only_q=True),
], ids=["add", "skip_ln", "skip_ln_no_bias", "fp16_d64", "gqa", "no_mask", "finfo_mask", "bias_only_q"])
def test_k_bias_dropped_v_bias_folded_into_the_output_bias(kwargs):
    model = encoder_model(**kwargs)
    result = _verified(model)
    (fused,) = result.report.fused
    assert fused.layout == "packed KV" and fused.refined_by[-3:] == ["packed_qkv", "bias_fold", "merge_reshape"], fused
    node = _flash(result.model)
    assert node.input[1] and (len(node.input) < 3 or not node.input[2]), node  # K given, V omitted
    ops = _ops(result.model)
    assert ops["MatMul"] == 3, ops  # Q, packed KV, the output projection
    # Only Q's bias is left before the attention: one Add (and the output's Add where it had one).
    assert ops.get("Add", 0) == 1 + (kwargs["out_proj"] == "add"), ops
    inits = {i.name: numpy_helper.to_array(i) for i in result.model.graph.initializer}
    hidden = model.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    assert not any(a.shape == (hidden, 3 * hidden) for a in inits.values()), "packed_qkv's weight is left over"


def test_folded_bias_is_bo_plus_bv_times_wo():
    model = encoder_model(out_proj="add", kv_heads=2)
    result = _verified(model)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    new = {i.name: numpy_helper.to_array(i) for i in result.model.graph.initializer}
    (out_add,) = [n for n in result.model.graph.node if n.op_type == "Add" and "out_bias" in "".join(n.input)]
    folded = new[[i for i in out_add.input if "out_bias" in i][0]]
    # The original: V's bias (Hkv * D = 16 values), Wo (32, 32) and bo, found by their shapes and order.
    (bv,) = [a for n, a in inits.items() if a.shape == (16,)][-1:]
    (wo,) = [a for a in inits.values() if a.shape == (32, 32)][-1:]
    bo = [a for a in inits.values() if a.shape == (32,)][-1]
    bv_y = np.repeat(bv.reshape(2, 8), 2, axis=0).reshape(-1)
    np.testing.assert_allclose(folded, bo + bv_y @ wo, rtol=1e-6, atol=1e-6)


def test_declines_without_an_output_projection():
    result = _verified(encoder_model())
    (fused,) = result.report.fused
    assert fused.layout == "packed", fused
    assert "does not feed an output projection MatMul" in _declined(result)


def _packed_node_model(mask=None, nonpad=False, **attrs) -> onnx.ModelProto:
    """x -> MatMul(Wqkv) + b -> FlashAttention(packed QKV [, mask] [, nonpad]) -> MatMul(Wo) + bo:
    the form packed_qkv leaves, for the rule alone."""
    rng = np.random.default_rng(0)
    heads, d = 4, 8
    hidden = heads * d
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in
             (("wqkv", (hidden, 3 * hidden)), ("bqkv", (3 * hidden,)), ("wo", (hidden, hidden)), ("bo", (hidden,)))]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", hidden])]
    flash_in = ["qkv", "", "", "", "", "", ""]
    if mask:
        inputs.append(helper.make_tensor_value_info("m", TensorProto.BOOL if mask == "bool" else TensorProto.FLOAT,
                                                    ["B", 1, 1, "S"]))
        flash_in[3] = "m"
    if nonpad:
        inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT64, ["B"]))
        flash_in[6] = "lens"
    while not flash_in[-1]:
        flash_in.pop()
    nodes = [helper.make_node("MatMul", ["x", "wqkv"], ["mm"]), helper.make_node("Add", ["mm", "bqkv"], ["qkv"]),
             helper.make_node("FlashAttention", flash_in, ["y"], name="attn", domain="ort_flash",
                              q_num_heads=heads, kv_num_heads=heads, **attrs),
             helper.make_node("MatMul", ["y", "wo"], ["p"]), helper.make_node("Add", ["p", "bo"], ["out"])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", "S", hidden])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ort_flash", 1)],
                             ir_version=8)


def _apply_rule(model: onnx.ModelProto):
    rule = bias_fold.BiasFold()
    ir_model = ir.from_proto(model)
    # The instance's own methods (RuleClassBase.rule() would build a fresh instance).
    pattern.RewriteRuleSet([pattern.RewriteRule(rule.pattern, rule.rewrite, rule.check)]).apply_to_model(ir_model)
    return rule, ir_model


def test_the_rule_alone_folds_the_plain_case():
    rule, ir_model = _apply_rule(_packed_node_model(mask="additive"))
    assert [n for n, _ in rule.applied] == ["attn"]  # (then, as packed KV, it has nothing more to do)
    (node,) = [n for n in ir_model.graph if n.op_type == "FlashAttention"]
    assert node.inputs[1] is not None and (len(node.inputs) < 3 or node.inputs[2] is None)


@pytest.mark.parametrize("kwargs, reason", [
    (dict(mask="bool"), "a bool mask can leave a row with no key"),
    (dict(nonpad=True), "nonpad_kv_seqlen can leave a row with no key"),
    (dict(left_window_size=3), "a window can leave a row with no key"),
    (dict(right_window_size=0), "a window can leave a row with no key"),
    (dict(softcap=5.0), "a softcap sees K's bias"),
], ids=["bool_mask", "nonpad", "left_window", "right_window", "softcap"])
def test_the_rule_declines_where_a_row_may_see_no_key_or_scores_are_capped(kwargs, reason):
    rule, ir_model = _apply_rule(_packed_node_model(**kwargs))
    assert not rule.applied
    assert reason in rule.declined["attn"]
    assert [n.op_type for n in ir_model.graph] == ["MatMul", "Add", "FlashAttention", "MatMul", "Add"]


def test_nodes_an_earlier_rewrite_wrote_are_left_alone():
    # rewrite() refines only what it fused itself: a FlashAttention already in the model stays.
    model = _packed_node_model()
    result = rewrite(model)
    assert [n.op_type for n in result.model.graph.node] == ["MatMul", "Add", "FlashAttention", "MatMul", "Add"]
    assert result.report.total_fused == 0 and not result.report.declined
