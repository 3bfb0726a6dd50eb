"""The bundled GPT-2 demo models: every attention fused, the model still valid and the same function."""

from __future__ import annotations

import importlib.resources
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnx_reference import run_reference
from ort_flash.cli import rewrite_command
from ort_flash.rewriter import RewriteReport, rewrite
from ort_flash.verify import make_inputs

DEMOS = ["gpt2_tiny.onnx", "gpt2_tiny_fp16.onnx"]
CONFIG_KEY = "ort_flash.demo.gpt2_config"  # written by lab/models/build_demo.py


def demo_path(name: str) -> str:
    return str(importlib.resources.files("ort_flash").joinpath("data", name))


def demo_config(model: onnx.ModelProto) -> dict:
    return json.loads({p.key: p.value for p in model.metadata_props}[CONFIG_KEY])


@pytest.fixture(scope="module", params=DEMOS)
def demo(request):
    model = onnx.load(demo_path(request.param))
    return request.param, model, rewrite(model)


def _dims(value: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_every_attention_softmax_fused(demo):
    _, model, result = demo
    config = demo_config(model)
    assert sum(n.op_type == "Softmax" for n in model.graph.node) == config["n_layer"]
    n = config["n_layer"]
    assert {r: c for r, c in result.report.counts.items() if c} == {
        "matmul_softmax_attention": n, "layout_3d": n, "packed_qkv": n}
    assert result.report.unfused == []
    assert result.report.shape_inference == "symbolic"  # proven with no dims assumed equal
    assert not [n for n in result.model.graph.node if n.op_type == "Softmax"]
    fused = [n for n in result.model.graph.node if n.op_type == "FlashAttention"]
    assert len(fused) == config["n_layer"]
    assert all(n.domain == "ort_flash" for n in fused)
    for entry in result.report.fused:
        assert entry.heads == config["n_head"]
        assert entry.head_dim == config["n_embd"] // config["n_head"] == 64
        # by default the finite (finfo.min) causal + padding mask stays whole, so left-padded
        # rows keep their exact values; the head split/merge Transposes became the 3-D layout,
        # and the op reads c_attn's output (split three ways before) as packed QKV
        assert (entry.mask, entry.causal, entry.scale) == (
            "additive (batch,1,sequence,sequence)", False, 0.125)
        assert entry.layout == "packed" and entry.kv_heads == config["n_head"]
        assert entry.refined_by == ["layout_3d", "packed_qkv"]
        assert entry.note == ""
    assert not [n for n in result.model.graph.node if n.op_type in ("Transpose", "Split")]


def test_fast_padded_rows_maps_mask_to_is_causal(demo):
    """exact_masked_rows=False: the (B, 1, S, S) mask becomes is_causal + a (B, 1, 1, S) mask,
    with a note that left-padded rows differ."""
    _, model, _ = demo
    result = rewrite(model, exact_masked_rows=False)
    n = demo_config(model)["n_layer"]
    assert {r: c for r, c in result.report.counts.items() if c} == {
        "matmul_softmax_attention": n, "causal_mask": n, "layout_3d": n, "packed_qkv": n}
    for entry in result.report.fused:
        assert (entry.mask, entry.causal) == ("additive (B,1,1,Skv)", True)
        assert entry.refined_by == ["causal_mask", "layout_3d", "packed_qkv"]
        assert "left-padded" in entry.note


def test_model_valid_and_interface_unchanged(demo):
    _, model, result = demo
    out = result.model
    onnx.checker.check_model(out, full_check=True)
    assert list(out.graph.input) == list(model.graph.input)
    assert list(out.graph.output) == list(model.graph.output)
    assert _dims(out.graph.input[0]) == ["batch", "sequence"]  # dynamic dims stay dynamic
    assert _dims(out.graph.output[0])[:2] == ["batch", "sequence"]
    assert out.ir_version == model.ir_version == 10
    opsets = {o.domain: o.version for o in out.opset_import}
    assert opsets == {"": 17, "ort_flash": 1}
    assert [i.name for i in out.graph.initializer] == [i.name for i in model.graph.initializer]


def test_input_model_untouched():
    model = onnx.load(demo_path(DEMOS[0]))
    before = model.SerializeToString()
    from_proto = rewrite(model)
    assert model.SerializeToString() == before
    from_path = rewrite(demo_path(DEMOS[0]))
    assert from_path.model.SerializeToString() == from_proto.model.SerializeToString()


def test_report_json_round_trips(demo):
    _, _, result = demo
    text = result.report.to_json()
    assert RewriteReport.from_json(text) == result.report
    counts = {r: c for r, c in json.loads(text)["counts"].items() if c}
    assert counts == {"matmul_softmax_attention": 2, "layout_3d": 2, "packed_qkv": 2}
    table = result.report.format_table()
    assert "fused attention subgraphs: 2" in table and "softmax left unfused: 0" in table


def test_rewriting_twice_changes_nothing(demo):
    _, _, result = demo
    again = rewrite(result.model)
    assert again.report.total_fused == 0 and again.report.unfused == []


def test_same_function_as_original(demo):
    """FlashAttention evaluated by ONNX's Attention reference; the baseline by ORT, no fusions."""
    name, model, result = demo
    feeds = make_inputs(model, batch=3, seq_len=19, seed=7)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(demo_path(name), options, providers=["CPUExecutionProvider"])
    (want,) = session.run(None, feeds)
    (got,) = run_reference(result.model, feeds)
    tol = 1e-4 if want.dtype == np.float32 else 2e-2
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


# The CLI's rewrite command (ort_flash.cli.rewrite_command.run).


def _rewrite_args(input, output, report=None):
    import argparse

    return argparse.Namespace(input=str(input), output=str(output), report=report and str(report))


def test_cmd_rewrite_writes_model_and_report(tmp_path, capsys):
    out, report = tmp_path / "m.flash.onnx", tmp_path / "r.json"
    assert rewrite_command.run(_rewrite_args(demo_path(DEMOS[0]), out, report)) == 0
    printed = capsys.readouterr().out
    assert "fused attention subgraphs: 2" in printed
    assert sum(n.op_type == "FlashAttention" for n in onnx.load(out).graph.node) == 2
    assert RewriteReport.from_json(report.read_text()).total_fused == 2
    assert [p.name for p in tmp_path.iterdir()] != [] and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("content", [None, b"this is not an onnx model\n", "truncated"],
                         ids=["missing", "not_onnx", "truncated"])
def test_cmd_rewrite_user_errors(tmp_path, capsys, content):
    bad = tmp_path / "in.onnx"
    if content == "truncated":
        bad.write_bytes(open(demo_path(DEMOS[0]), "rb").read()[:100_000])
    elif content is not None:
        bad.write_bytes(content)
    out = tmp_path / "out.onnx"
    assert rewrite_command.run(_rewrite_args(bad, out)) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith("ort-flash: error: ")
    assert not out.exists()


def test_cmd_rewrite_refuses_to_overwrite_input(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    model.write_bytes(open(demo_path(DEMOS[0]), "rb").read())
    before = model.read_bytes()
    assert rewrite_command.run(_rewrite_args(model, model)) == 2
    assert model.read_bytes() == before
    assert "is the input model" in capsys.readouterr().err


def test_fp32_precision_opt_in_is_stamped_on_fused_nodes():
    model = onnx.load(demo_path(DEMOS[0]))
    default = rewrite(model).model
    tf32 = rewrite(model, fp32_precision="tf32").model
    fused = [n for n in tf32.graph.node if n.op_type == "FlashAttention"]
    assert fused and all(
        onnx.helper.get_attribute_value(a) == b"tf32"
        for n in fused for a in n.attribute if a.name == "fp32_precision")
    assert not [a for n in default.graph.node for a in n.attribute if a.name == "fp32_precision"]
    with pytest.raises(ValueError, match="fp32_precision"):
        rewrite(model, fp32_precision="fast")
