"""ONNX Runtime's non-attention fusions, then ort_flash's attention (``ort_flash.ort_fusions``,
``ort-flash rewrite --ort-fusions``).

On the bundled GPT-2 demo (float32): ORT's optimizer fuses LayerNorm / SkipLayerNorm / FastGelu
and no attention, the rewrite then fuses every attention, the model is valid ONNX (the contrib
domain declared) and computes the same function; with ``--float16`` the FlashAttention nodes are
float16 in and out with nothing Cast around them, the graph inputs and outputs stay float32, and
nothing is left in the working directory. The e2e benchmark's BERT / GPT-2 / LLaMA-style tiny
models (slow: torch exports) get the same checks against their original export.
"""
from __future__ import annotations

import collections
import importlib.resources
import json

import onnx
import pytest

from ort_flash import ort_fusions
from ort_flash.cli import main
from ort_flash.verify import verify

ORT_OPS = {"LayerNormalization": 1, "SkipLayerNormalization": 4, "FastGelu": 2}  # the 2-layer demo


def demo_path(name: str = "gpt2_tiny.onnx") -> str:
    return str(importlib.resources.files("ort_flash").joinpath("data", name))


def _neighbours(model: onnx.ModelProto, node: onnx.NodeProto) -> tuple[list[str], list[str]]:
    """Op types feeding the node and reading its outputs."""
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    readers = collections.defaultdict(list)
    for n in model.graph.node:
        for i in n.input:
            readers[i].append(n.op_type)
    return ([producer.get(i, "graph input") for i in node.input if i],
            [t for o in node.output for t in readers[o]])


def _check_fused_model(model: onnx.ModelProto, layers: int, float16: bool) -> None:
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:  # ORT writes its RMSNorm into the ONNX domain
        assert "No Op registered for SimplifiedLayerNormalization" in str(e), e
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops["FlashAttention"] == layers and ops["Softmax"] == 0 and ops["Attention"] == 0, ops
    assert {o.domain for o in model.opset_import} >= {"", "com.microsoft", "ort_flash"}
    flash_dtypes = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    for node in (n for n in model.graph.node if n.op_type == "FlashAttention"):
        inputs, outputs = _neighbours(model, node)
        assert "Cast" not in inputs + outputs, (node.name, inputs, outputs)
        if float16 and node.output[0] in flash_dtypes:
            assert flash_dtypes[node.output[0]] == onnx.TensorProto.FLOAT16
    for value in (*model.graph.input, *model.graph.output):
        assert value.type.tensor_type.elem_type != onnx.TensorProto.FLOAT16, value.name  # keep_io_types


@pytest.mark.parametrize("float16", [False, True], ids=["float32", "float16"])
def test_ort_fusions_then_every_attention_fused(float16):
    original = onnx.load(demo_path())
    before = original.SerializeToString()
    result = ort_fusions.rewrite(original, "gpt2", float16=float16)
    assert original.SerializeToString() == before  # the input is not changed
    assert result.ort_fused == ORT_OPS
    assert result.report.total_fused == 2 and result.report.unfused == []
    _check_fused_model(result.model, layers=2, float16=float16)
    tol = 2e-2 if float16 else None  # float32 outputs computed in float16: float16's tolerance
    check = verify(original, result.model, seed=0, atol=tol, rtol=tol)
    assert check.passed, check.format_table()


def test_ort_fusions_refuses_an_unchecked_model_type():
    with pytest.raises(ValueError, match="model_type"):
        ort_fusions.optimize(demo_path(), "t5")


def test_cli_rewrite_with_ort_fusions(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # ORT's shape inference drops files into the cwd when it fails
    out, report = tmp_path / "m.flash.onnx", tmp_path / "r.json"
    assert main(["rewrite", demo_path(), "-o", str(out), "--ort-fusions", "gpt2", "--float16",
                 "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "ONNX Runtime optimizer (model_type gpt2, attention fusion off) fused: " in printed
    assert "converted to float16" in printed and "fused attention subgraphs: 2" in printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.flash.onnx", "r.json"]
    _check_fused_model(onnx.load(out), layers=2, float16=True)
    doc = json.loads(report.read_text())
    assert doc["ort_fusions"] == {"model_type": "gpt2", "attention_fusion": False, "opt_level": 0,
                                  "fused": ORT_OPS, "float16": True}
    assert len(doc["fused"]) == 2  # the rewrite report, as without --ort-fusions
    # float32 outputs computed in float16: verify needs float16's tolerance, and says so otherwise
    assert main(["verify", demo_path(), str(out), "--seed", "0", "--atol", "2e-2", "--rtol", "2e-2"]) == 0
    assert main(["verify", demo_path(), str(out), "--seed", "0"]) == 1


def test_cli_ort_fusion_usage_errors(tmp_path, capsys):
    out = tmp_path / "m.flash.onnx"
    assert main(["rewrite", demo_path(), "-o", str(out), "--float16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs --ort-fusions" in err and not out.exists()
    for argv in (["rewrite", demo_path(), "-o", str(out), "--ort-fusions", "llama"],
                 ["verify", demo_path(), demo_path(), "--atol", "-1"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["bert-base", "gpt2-medium", "llama-1b"])
def test_bench_models_keep_every_attention_fused(model, tmp_path, monkeypatch, capsys):
    """The e2e benchmark's recipe through the CLI (ORT optimizer on the float32 export with
    attention fusion off, float16 conversion, rewrite) on its tiny models: every layer fused, and
    ``ort-flash verify`` finds the same function as the float16 export (LLaMA's ORT-fused
    SimplifiedLayerNormalization, which onnx.checker does not know, included)."""
    from ort_flash.bench import bench_models as bm
    from ort_flash.bench import e2e_suite

    monkeypatch.chdir(tmp_path)
    (spec,) = e2e_suite.specs(e2e_suite.grid("cpu", quick=True, overrides={"models": [model], "layers": 2}))
    fp32, _ = bm.cached_export(spec, tmp_path / "cache", "float32")
    fp16, _ = bm.cached_export(spec, tmp_path / "cache", "float16")
    out, report = tmp_path / "m.flash.onnx", tmp_path / "r.json"
    assert main(["rewrite", str(fp32), "-o", str(out), "--ort-fusions", e2e_suite.OPTIMIZER_TYPE[spec.family],
                 "--float16", "--report", str(report)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "m.flash.onnx", "r.json"]
    doc = json.loads(report.read_text())
    assert len(doc["fused"]) == spec.layers and doc["unfused"] == []
    ort_fused = doc["ort_fusions"]["fused"]
    assert not {"Attention", "MultiHeadAttention", "GroupQueryAttention"} & set(ort_fused)
    assert any("LayerNormalization" in op for op in ort_fused), ort_fused
    _check_fused_model(onnx.load(out), layers=spec.layers, float16=True)
    capsys.readouterr()
    assert main(["verify", str(fp16), str(out), "--seed", "0"]) == 0, capsys.readouterr()


def _fused(rule="matmul_softmax_attention", causal=False):
    from ort_flash.rewriter.report import FusedSubgraph

    return FusedSubgraph(rule=rule, variant="", fused_node="a", nodes=["a"], heads=2, head_dim=8,
                         causal=causal, mask="none", scale=0.35)


@pytest.mark.parametrize("ops, fused, expected", [
    (["Erf", "MatMul"], [_fused()], "bert"),                                   # an encoder's Gelu
    (["ReduceMean", "Sqrt", "Div"], [_fused(causal=True)], "gpt2"),            # a decoder's LayerNorm
    (["LayerNormalization", "MatMul"], [_fused()], None),                      # nothing left to fuse
    (["Erf"], [], None),                                                       # no attention fused
    (["Erf"], [_fused(rule="group_query_attention", causal=True)], None),      # GenAI's model
])
def test_rewrite_suggests_ort_fusions(ops, fused, expected):
    """`ort-flash rewrite` notes `--ort-fusions` where ONNX Runtime's optimizer still has fusions
    to add (LayerNorm / Gelu computed from their parts) beside the fused attention."""
    from onnx import helper

    from ort_flash.ort_fusions import suggested_model_type
    from ort_flash.rewriter.report import RewriteReport

    nodes = [helper.make_node(op, ["x"], [f"y{i}"]) for i, op in enumerate(ops)]
    model = helper.make_model(helper.make_graph(nodes, "g", [], []))
    assert suggested_model_type(model, RewriteReport(fused=fused)) == expected


def _bert_export() -> str:
    """The model families' tiny BERT (TorchScript, eager, float32), exported once into the cache."""
    import os
    import sys

    pytest.importorskip("torch", reason="torch exports the model family (test dependency)")
    pytest.importorskip("transformers", reason="transformers builds the model family")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))
    from lab.models.families import ExportFailure, export, specs

    spec = next(s for s in specs() if s.family == "bert" and s.exporter == "torchscript"
                and s.attn == "eager" and s.dtype == "float32")
    try:
        return str(export(spec))
    except ExportFailure as e:
        pytest.skip(f"the exporter cannot export this configuration: {e}")


def test_cli_default_runs_ort_fusions_on_an_encoder(tmp_path, capsys):
    """`ort-flash rewrite` with no flag on an encoder ONNX Runtime's optimizer knows (BERT): its
    bert fusions run with the attention rewrite, the output says so and how to opt out, the
    report records them, and the model computes the original's function; `--ort-fusions none`
    rewrites the attention alone."""
    source = _bert_export()
    out, report = tmp_path / "bert.flash.onnx", tmp_path / "r.json"
    assert main(["rewrite", source, "-o", str(out), "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "an encoder ONNX Runtime's optimizer knows" in printed and "--ort-fusions none" in printed
    doc = json.loads(report.read_text())
    assert doc["ort_fusions"]["model_type"] == "bert" and doc["unfused"] == []
    assert any("LayerNormalization" in op for op in doc["ort_fusions"]["fused"]), doc["ort_fusions"]
    ops = collections.Counter(n.op_type for n in onnx.load(out).graph.node)
    assert ops["FlashAttention"] == len(doc["fused"]) > 0 and ops["Softmax"] == 0, ops
    assert main(["verify", source, str(out), "--seed", "0"]) == 0, capsys.readouterr()

    plain = tmp_path / "bert.plain.onnx"
    capsys.readouterr()
    assert main(["rewrite", source, "-o", str(plain), "--ort-fusions", "none"]) == 0
    assert "ONNX Runtime's optimizer" not in capsys.readouterr().out
    ops = collections.Counter(n.op_type for n in onnx.load(plain).graph.node)
    assert ops["FlashAttention"] > 0 and ops["SkipLayerNormalization"] == 0, ops


def test_default_keeps_the_attention_rewrite_when_the_optimizer_fails(monkeypatch):
    """"auto" where ONNX Runtime's optimizer fails on the encoder: the attention rewrite alone,
    with a one-line note saying why; an explicit model type still fails with the optimizer's
    error; a decoder (GPT-2) never gets the optimizer by default."""
    source = _bert_export()

    def fails(*args, **kwargs):
        raise ort_fusions.OrtFusionError("ONNX Runtime's optimizer (model_type bert) failed: ValueError: boom")
    monkeypatch.setattr(ort_fusions, "optimize", fails)
    done = ort_fusions.rewrite_default(source)
    assert done.ort_fusions is None and done.result.report.total_fused > 0
    assert done.note.count("\n") == 0 and "boom" in done.note and "attention rewrite alone" in done.note
    with pytest.raises(ort_fusions.OrtFusionError):
        ort_fusions.rewrite_default(source, "bert")
    gpt2 = ort_fusions.rewrite_default(demo_path())
    assert gpt2.ort_fusions is None and gpt2.note is None and gpt2.result.report.total_fused > 0
    with pytest.raises(ValueError):
        ort_fusions.rewrite_default(source, "auto", float16=True)
