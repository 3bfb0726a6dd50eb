"""Rule table for group_query_attention: com.microsoft.GroupQueryAttention nodes (ONNX Runtime
GenAI's attention) swapped for ort_flash.GroupQueryAttention, or left with the reason.

Each case is a one-node model (tests/_gqa_models); a fused case keeps the node's name, inputs,
outputs and attributes, and the rewritten model gives ONNX Runtime's outputs on the same call,
shared KV buffer included.
"""

from __future__ import annotations

import numpy as np
from ml_dtypes import bfloat16
import onnx
import pytest
from onnx import helper

from _gqa_models import gqa_model, run_gqa
from ort_flash.rewriter import rewrite


def _feeds(dtype=np.float32, packed=True, past=True, rotary=True, b=2, s=5, hq=4, hkv=2, d=32):
    rng = np.random.default_rng(0)
    rnd = lambda *shape: rng.standard_normal(shape).astype(dtype)  # noqa: E731
    feeds = {"query": rnd(b, s, (hq + 2 * hkv) * d)} if packed else {
        "query": rnd(b, s, hq * d), "key": rnd(b, s, hkv * d), "value": rnd(b, s, hkv * d)}
    if past:
        feeds.update(past_key=rnd(b, hkv, 24, d), past_value=rnd(b, hkv, 24, d))
    feeds.update(seqlens_k=np.array([s - 1, 2][:b], np.int32), total_sequence_length=np.array(s, np.int32))
    if rotary:
        angles = np.arange(32)[:, None] / 10000.0 ** (np.arange(d // 4) / (d // 4))
        feeds.update(cos_cache=np.cos(angles).astype(dtype), sin_cache=np.sin(angles).astype(dtype))
    attrs = dict(num_heads=hq, kv_num_heads=hkv, do_rotary=int(rotary))
    return feeds, attrs


def _model(feeds, attrs, name="layers.0/attn/GroupQueryAttention", extra_inputs=(), outputs=3):
    model = onnx.load_from_string(gqa_model(feeds, **attrs))
    node = model.graph.node[0]
    node.name = name
    for input_name, array in extra_inputs:
        index = {"attention_bias": 10, "head_sink": 11, "q_norm_weight": 14, "k_norm_weight": 15}[input_name]
        while len(node.input) <= index:
            node.input.append("")
        node.input[index] = input_name
        model.graph.input.append(helper.make_tensor_value_info(
            input_name, helper.np_dtype_to_tensor_dtype(array.dtype), list(array.shape)))
    if outputs == 4:
        node.output.append("output_qk")
    return model


# name: (feeds options, extra attributes, extra inputs, reason where declined)
CASES = {
    "packed_rotary_shared_cache": ({}, {}, (), None),
    "separate_qkv": (dict(packed=False), {}, (), None),
    "no_past": (dict(past=False), {}, (), None),
    "no_rotary_window_softcap": (dict(rotary=False), dict(local_window_size=3, softcap=20.0), (), None),
    "float16_head_size_64_on_cuda": (dict(dtype=np.float16, d=64), {}, (), None),
    "float16_head_size_32_on_cuda": (dict(dtype=np.float16), {}, (), "only at head sizes 64 and 128"),
    "quantized_cache": ({}, dict(k_quant_type="PER_TENSOR"), (), "quantized KV cache"),
    "smooth_softmax": ({}, dict(smooth_softmax=1), (), None),
    "float16_smooth_softmax_on_cuda": (dict(dtype=np.float16, d=64), dict(smooth_softmax=1), (), None),
    "windowed_cache": ({}, dict(sliding_window_cache=1, local_window_size=4), (), None),
    "qk_output": ({}, dict(qk_output=1), (), "output_qk"),
    "head_sink": ({}, {}, (("head_sink", np.zeros(4, np.float32)),), None),
    "float16_head_sink_on_cuda": (dict(dtype=np.float16, d=64), {}, (("head_sink", np.zeros(4, np.float16)),),
                                  None),
    "bfloat16_head_sink_on_cuda": (dict(dtype=bfloat16, d=128), {}, (("head_sink", np.zeros(4, bfloat16)),),
                                   None),
    "attention_bias": ({}, {}, (("attention_bias", np.zeros((2, 1, 5, 5), np.float32)),), "attention bias"),
    "bidirectional": ({}, dict(causal=0), (), None),
    "qk_norm": ({}, dict(qk_norm_epsilon=1e-5), (("q_norm_weight", np.ones(32, np.float32)),
                                              ("k_norm_weight", np.ones(32, np.float32))), None),
    "qk_norm_q_only": ({}, {}, (("q_norm_weight", np.ones(32, np.float32)),), "must be given together"),
    "float16_qk_norm_on_cuda": (dict(dtype=np.float16, d=64), {}, (("q_norm_weight", np.ones(64, np.float16)),
                                                                  ("k_norm_weight", np.ones(64, np.float16))),
                                None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gqa_rule(name):
    options, extra_attrs, extra_inputs, reason = CASES[name]
    feeds, attrs = _feeds(**options)
    attrs.update(extra_attrs)
    model = _model(feeds, attrs, extra_inputs=extra_inputs)
    original = model.graph.node[0]
    result = rewrite(model)
    nodes = list(result.model.graph.node)
    assert len(nodes) == 1, name
    node = nodes[0]
    if reason is None:
        assert result.report.counts["group_query_attention"] == 1, result.report.format_table()
        assert (node.domain, node.op_type, node.name) == ("ort_flash", "GroupQueryAttention", original.name)
        assert list(node.input) == list(original.input)[:len(node.input)], name
        assert all(i == "" for i in list(original.input)[len(node.input):]), name
        assert list(node.output) == list(original.output), name
        assert {a.name: helper.get_attribute_value(a) for a in node.attribute} == \
            {a.name: helper.get_attribute_value(a) for a in original.attribute}, name
        assert ("ort_flash", 1) in {(o.domain, o.version) for o in result.model.opset_import}
        assert not result.report.unfused
    else:
        assert result.report.total_fused == 0, name
        assert node.domain == "com.microsoft", name
        [unfused] = result.report.unfused
        assert unfused.node == original.name and reason in unfused.reason, unfused


@pytest.mark.parametrize("dtype,d,window,switch,mapped", [
    (np.float16, 64, 0, None, True), (np.float16, 64, 0, "0", False), (np.float16, 64, 0, "1", True),
    (np.float16, 128, 0, None, True), (np.float16, 128, 0, "0", False), (np.float16, 128, 0, "1", True),
    (np.float16, 32, 0, None, False), (np.float16, 96, 0, None, False), (bfloat16, 64, 0, None, True),
    (bfloat16, 128, 0, None, True), (bfloat16, 96, 0, None, False), (bfloat16, 96, 0, "1", True),
    (np.float16, 64, 1, None, False), (np.float16, 64, 1, "1", True), (np.float16, 64, 1, "0", False),
    (bfloat16, 128, 1, None, False)])
def test_gqa_cuda_decision(monkeypatch, dtype, d, window, switch, mapped):
    """float16/bfloat16 nodes run on CUDA: mapped where ort_flash's op was measured at least as fast
    as ONNX Runtime's (float16 and bfloat16, head sizes 64 and 128; no windowed cache: slower at
    decode), elsewhere only with ORT_FLASH_GQA_CUDA=1, never with =0; each decline says why."""
    if switch is None:
        monkeypatch.delenv("ORT_FLASH_GQA_CUDA", raising=False)
    else:
        monkeypatch.setenv("ORT_FLASH_GQA_CUDA", switch)
    feeds, attrs = _feeds(dtype=dtype, d=d)
    model = _model(feeds, attrs)
    if window:
        model.graph.node[0].attribute.extend([helper.make_attribute("sliding_window_cache", 1),
                                              helper.make_attribute("local_window_size", 16)])
    result = rewrite(model)
    assert result.report.counts.get("group_query_attention", 0) == int(mapped), result.report.format_table()
    [node] = result.model.graph.node
    assert node.domain == ("ort_flash" if mapped else "com.microsoft")
    if not mapped:
        [unfused] = result.report.unfused
        want = ("(ORT_FLASH_GQA_CUDA=0)" if switch == "0" else
                "windowed KV cache (sliding_window_cache=1): ort_flash's op computes it on CUDA" if window
                else "(ORT_FLASH_GQA_CUDA=1) maps it")
        assert f"head size {d}" in unfused.reason and want in unfused.reason, unfused.reason


@pytest.mark.parametrize("dtype,d,tol", [(np.float32, 32, (1e-4, 1e-5, 1e-6)), (np.float16, 64, (2e-3, 2e-3, 2e-3)),
                                         (np.float16, 128, (2e-3, 2e-3, 2e-3))],
                         ids=["float32", "float16-d64", "float16-d128"])
@pytest.mark.parametrize("shared", [True, False])
def test_gqa_rewritten_model_computes_the_same(shared, dtype, d, tol):
    """The rewritten one-node model against the original in ONNX Runtime (CPU EP): the written
    model loads with the library, and the op computes a padded first prompt into the shared (or a
    separate) buffer as ONNX Runtime's does; float32 and the float16 head-size-64 and -128 nodes
    the rewriter maps by default."""
    import onnxruntime as ort

    import ort_flash

    feeds, attrs = _feeds(dtype=dtype, d=d)
    result = rewrite(_model(feeds, attrs))
    assert result.report.total_fused == 1
    ort.InferenceSession(result.model.SerializeToString(), ort_flash.session_options(),
                         providers=["CPUExecutionProvider"])
    library = ort_flash.library_path()
    ours = run_gqa(dict(feeds), shared=shared, library=library, **attrs)
    theirs = run_gqa(dict(feeds), shared=shared, **attrs)
    lengths = feeds["seqlens_k"] + 1
    rtol, atol, kv_tol = tol
    for b, n in enumerate(lengths):  # the real tokens' rows (padding rows differ by design: see test_gqa_op)
        np.testing.assert_allclose(ours[0][b, :n].astype(np.float32), theirs[0][b, :n].astype(np.float32),
                                   rtol=rtol, atol=atol)
    np.testing.assert_array_equal(ours[2], theirs[2])
    np.testing.assert_allclose(ours[1].astype(np.float32), theirs[1].astype(np.float32), rtol=kv_tol, atol=kv_tol)


@pytest.mark.parametrize("policy,mapped", [("measured", [True, False]), ("all", [True, True]), ("none", [False, False])])
def test_gqa_cuda_policy_is_an_argument(monkeypatch, policy, mapped):
    """rewrite(gqa_cuda=...) decides float16 nodes whatever ORT_FLASH_GQA_CUDA says (the variable
    is only its default): a head size 64 node, measured faster, and a head size 32 one."""
    monkeypatch.setenv("ORT_FLASH_GQA_CUDA", "0" if policy != "none" else "1")
    for d, want in zip((64, 32), mapped):
        feeds, attrs = _feeds(dtype=np.float16, d=d)
        result = rewrite(_model(feeds, attrs), gqa_cuda=policy)
        assert result.report.counts.get("group_query_attention", 0) == int(want), (policy, d)
    with pytest.raises(ValueError, match="gqa_cuda must be one of"):
        rewrite(_model(*_feeds()), gqa_cuda="sometimes")


@pytest.mark.parametrize("policy", ["measured", "all", "none"])
@pytest.mark.parametrize("dtype,sink", [(np.float16, "head_sink"), (bfloat16, "head_sink"),
                                        (np.float16, "smooth_softmax"), (bfloat16, "smooth_softmax")])
def test_gqa_attention_sinks_on_cuda_follow_the_policy(dtype, sink, policy):
    """float16 / bfloat16 nodes with attention sinks (CUDA): ort_flash's op computes them there and
    was timed faster than ONNX Runtime's op with them in both dtypes at head sizes 64 and 128, so the
    default policy maps them as "all" does (head_sink and smooth_softmax kept, the report noting the
    sinks); "none" maps neither, saying how to map them."""
    feeds, attrs = _feeds(dtype=dtype, d=64)
    extra = (("head_sink", np.zeros(4, dtype)),) if sink == "head_sink" else ()
    if sink == "smooth_softmax":
        attrs["smooth_softmax"] = 1
    model = _model(feeds, attrs, extra_inputs=extra)
    result = rewrite(model, gqa_cuda=policy)
    [node] = result.model.graph.node
    if policy in ("all", "measured"):
        assert result.report.counts["group_query_attention"] == 1, result.report.format_table()
        assert node.domain == "ort_flash" and "attention sinks" in result.report.fused[0].note
        if sink == "head_sink":
            assert list(node.input)[11] == "head_sink"
        else:
            assert {a.name: helper.get_attribute_value(a) for a in node.attribute}["smooth_softmax"] == 1
        return
    assert result.report.total_fused == 0 and node.domain == "com.microsoft"
    [unfused] = result.report.unfused
    assert "(ORT_FLASH_GQA_CUDA=0)" in unfused.reason, unfused.reason


def test_gqa_attention_sinks_at_other_head_sizes_stay_with_ort():
    """A node with attention sinks at a head size the sinks were not timed at (96) stays with ONNX
    Runtime's op by default, the reason naming the sinks and how to map it."""
    feeds, attrs = _feeds(dtype=np.float16, d=96)
    model = _model(feeds, attrs, extra_inputs=(("head_sink", np.zeros(4, np.float16)),))
    result = rewrite(model)
    assert result.report.total_fused == 0
    [unfused] = result.report.unfused
    for want in ("attention sinks", "computes them on CUDA", "only at head sizes 64 and 128",
                 "--gqa-cuda all (ORT_FLASH_GQA_CUDA=1) maps it"):
        assert want in unfused.reason, unfused.reason


def test_gqa_qk_norm_on_cuda_mapped_by_default():
    """A float16 node with fused Q/K norms (Qwen3's CUDA builds) is mapped by default (measured
    faster than ONNX Runtime's op with them, fp16 and bf16); the report notes the norms."""
    feeds, attrs = _feeds(dtype=np.float16, d=64)
    weights = (("q_norm_weight", np.ones(64, np.float16)), ("k_norm_weight", np.ones(64, np.float16)))
    result = rewrite(_model(feeds, attrs, extra_inputs=weights))
    assert result.report.counts["group_query_attention"] == 1, result.report.format_table()
    [node] = result.model.graph.node
    assert node.domain == "ort_flash" and list(node.input)[14:16] == ["q_norm_weight", "k_norm_weight"]
    assert "Q/K norms" in result.report.fused[0].note
