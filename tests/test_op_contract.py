"""The op's contract where ONNX Attention defines it: a rank-1 attn_mask (total_kv,) broadcasts
to (B, Hq, Sq, total_kv). CPU EP against ort_flash.reference (float64), odd shapes, GQA, with
and without a past."""

import numpy as np
import pytest

from _onnx_models import flash_attention_model, run_model
from ort_flash.reference import attention_reference

PROVIDERS = ["CPUExecutionProvider"]


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("past", [0, 3])
def test_rank1_mask_broadcasts_over_batch_heads_and_queries(kind, past):
    rng = np.random.default_rng(7)
    b, hq, hkv, sq, skv, d = 2, 4, 2, 13, 11, 16
    feeds = {"Q": rng.standard_normal((b, hq, sq, d), dtype=np.float32),
             "K": rng.standard_normal((b, hkv, skv, d), dtype=np.float32),
             "V": rng.standard_normal((b, hkv, skv, d), dtype=np.float32)}
    total = past + skv
    visible = rng.random(total) < 0.6
    visible[0] = True
    feeds["attn_mask"] = visible if kind == "bool" else np.where(
        visible, rng.standard_normal(total), -np.inf).astype(np.float32)
    if past:
        feeds["past_key"] = rng.standard_normal((b, hkv, past, d), dtype=np.float32)
        feeds["past_value"] = rng.standard_normal((b, hkv, past, d), dtype=np.float32)
    model = flash_attention_model(feeds, {"Y": np.float32})
    y = run_model(model, feeds, {"Y": ((b, hq, sq, d), np.float32)}, PROVIDERS)["Y"]
    want = attention_reference(*(feeds[n].astype(np.float64) for n in "QKV"),
                               attn_mask=feeds["attn_mask"] if kind == "bool"
                               else feeds["attn_mask"].astype(np.float64),
                               past_key=feeds.get("past_key"), past_value=feeds.get("past_value"))[0]
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5)


def _onnx_attention_case(name):
    """The node, inputs and expected outputs of one of onnx's Attention backend cases."""
    from onnx.backend.test.case.node import attention as cases

    captured = {}

    def expect(node, inputs, outputs, name, **kwargs):
        captured.update(node=node, inputs=inputs, outputs=outputs, opsets=kwargs["opset_imports"])

    original = cases.expect
    cases.expect = expect
    try:
        getattr(cases.Attention, f"export_{name}")()
    finally:
        cases.expect = original
    return captured


def _node_model(case):
    from onnx import helper

    node = case["node"]
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for n, a in zip(node.input, case["inputs"])]
    outputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
               for n, a in zip([o for o in node.output if o], case["outputs"])]
    model = helper.make_model(helper.make_graph([node], "case", inputs, outputs),
                              opset_imports=case["opsets"])
    model.ir_version = 10
    return model


def test_onnx_backend_rank1_mask_local_window_case_fuses_and_runs():
    """onnx's test_attention_local_window_rank1_boolean_mask: fused one to one, and the op
    (CPU EP) gives onnx's expected output."""
    import ort_flash
    from ort_flash.rewriter import rewrite

    case = _onnx_attention_case("attention_local_window_rank1_boolean_mask")
    result = rewrite(_node_model(case))
    (entry,) = result.report.fused
    assert entry.rule == "onnx_attention" and entry.causal
    session = ort_flash.InferenceSession(result.model.SerializeToString(), providers=PROVIDERS)
    feeds = dict(zip(case["node"].input, case["inputs"]))
    (y,) = session.run(None, feeds)
    np.testing.assert_allclose(y, case["outputs"][0], rtol=1e-5, atol=1e-5)


def test_onnx_backend_windowed_gqa_rank4_case_is_not_the_ops_function():
    """onnx's test_attention_local_window_gqa_rank4_mask returns qk_matmul_output (mode 3: the
    softmax probabilities) as a graph output and asks for a float64 softmax; the op produces
    neither, so the node stays with that reason (everything else in it the op supports)."""
    import onnx_ir as ir
    from onnxscript.rewriter import pattern

    from ort_flash.rewriter.fusions import onnx_attention

    # the rule itself (the whole rewrite also refuses to write a model that ONNX Runtime 1.31,
    # which lacks Attention-25's window attributes, cannot load)
    model = ir.from_proto(_node_model(_onnx_attention_case("attention_local_window_gqa_rank4_mask")))
    rules = onnx_attention.rules()
    as_rule = lambda r: pattern.RewriteRule(r.pattern, r.rewrite, r.check, name=r.name)  # noqa: E731
    assert pattern.RewriteRuleSet([as_rule(r) for r in rules]).apply_to_model(model) == 0
    reasons = [reason for r in rules for _, reason in r.failures.values()]
    assert reasons and all("qk_matmul_output is used" in r for r in reasons), reasons


@pytest.mark.parametrize("version", [2, 99])
def test_an_ort_flash_opset_the_library_lacks_is_refused(version, tmp_path):
    import onnx

    import ort_flash

    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal((1, 2, 5, 8), dtype=np.float32) for n in "QKV"}
    model = onnx.load_from_string(flash_attention_model(feeds, {"Y": np.float32}))
    ort_flash.InferenceSession(model, providers=PROVIDERS)  # version 1 loads
    next(i for i in model.opset_import if i.domain == "ort_flash").version = version
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    for source in (model, model.SerializeToString(), path, str(path)):
        with pytest.raises(ValueError, match=rf"\('ort_flash', {version}\).*implements version 1"):
            ort_flash.InferenceSession(source, providers=PROVIDERS)
