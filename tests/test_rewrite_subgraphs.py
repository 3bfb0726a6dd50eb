"""The rewriter on models with subgraphs: an Optimum-style merged decoder (If on use_cache_branch,
branches sharing value names), attention in a Loop body, a Scan body and a nested If.

Each runs under both shape inferences the rewriter has: symbolic, and ONNX's with data
propagation (the fallback Optimum's merged decoders reach, forced here), whose one table by
name leaked shapes between the branches: the rewrite of ``merged_decoder`` at 1ce64ec did not
load in ONNX Runtime under either ("Nodes in a graph must be topologically sorted" with
symbolic shapes, "Node (/decoder/attn/Equal) ... Incompatible dimensions" with ONNX's).
Every written model must load, verify on every branch and carry no value_info the original
did not have, in any graph. Last, the output gate refuses a broken rewrite and writes nothing.
"""

from __future__ import annotations

import os

import onnx
import pytest
from onnx import TensorProto, helper

import _subgraph_models as models
from ort_flash.cli import main
from ort_flash.rewriter import RewriteRefusedError, RewriteReport, output_check, rewrite, shapes
from ort_flash.rewriter.fusions import matmul_softmax_attention
from ort_flash.rewriter.subgraphs import subgraphs
from ort_flash.verify import verify
from test_verify import needs_library

THEN, ELSE = "optimum::if.then_branch", "optimum::if.else_branch"
NESTED = "outer_if.then_branch > inner_if.then_branch"
# model -> (graphs holding a fused node with symbolic shapes, If conditions verify feeds)
CASES = {
    "merged_decoder": (models.merged_decoder, [ELSE, ELSE, THEN, THEN], ["use_cache_branch"]),
    "loop_body": (models.loop_model, ["loop.body"], []),
    "scan_body": (models.scan_model, ["scan.body"], []),
    "nested_if": (models.nested_if_model, [NESTED], ["outer_cond", "inner_cond"]),
}


def _no_symbolic(model, auto_merge):
    raise RuntimeError("symbolic shape inference off for this test")


@pytest.fixture(params=["symbolic", "onnx"])
def inference(request, monkeypatch):
    if request.param == "onnx":
        monkeypatch.setattr(shapes, "_symbolic_shapes", _no_symbolic)
    return request.param


def _value_info(model: onnx.ModelProto) -> dict:
    return {key: {v.name: v.SerializeToString() for v in graph.value_info}
            for key, graph in subgraphs(model.graph)}


@needs_library
@pytest.mark.parametrize("case", list(CASES))
def test_rewritten_subgraph_model_loads_and_verifies_on_every_branch(case, inference):
    build, fused_in, conditions = CASES[case]
    original = build()
    result = rewrite(original)
    report = result.report
    assert report.shape_inference == inference, report.format_table()
    if inference == "onnx" and case == "merged_decoder":
        # ONNX's dims are unnamed: the self-attention mask is not proven to broadcast, per branch
        assert sorted(f.graph for f in report.fused) == [ELSE, THEN], report.format_table()
        assert sorted(u.graph for u in report.unfused) == [ELSE, THEN], report.format_table()
    else:
        assert sorted(f.graph for f in report.fused) == fused_in, report.format_table()
        assert report.unfused == [], report.format_table()
    if case == "merged_decoder":
        # the encoder padding mask, a graph input read from the branches, proven compact in each
        cross = [f for f in report.fused if "encoder_attn" in f.fused_node]
        assert sorted(f.graph for f in cross) == [ELSE, THEN]
        assert all(f.mask == "additive (B,1,1,Skv)" and "causal_mask" in f.refined_by
                   for f in cross), report.format_table()
    for key, infos in _value_info(result.model).items():  # nothing inferred left, anywhere
        assert infos.items() <= _value_info(original).get(key, {}).items(), key
    given = dict(subgraphs(original.graph))
    for key, graph in subgraphs(result.model.graph):  # every graph's interface as given
        for field in ("input", "output"):
            assert getattr(graph, field) == getattr(given[key], field), (key, field)
    assert RewriteReport.from_json(report.to_json()) == report

    checked = verify(original, result.model, seed=0, seq_len=5)  # loads it and runs each branch
    runs = [checked, *checked.more]
    assert checked.passed, checked.format_table()
    if conditions:
        branches = [", ".join(f"{c}={v}" for c in conditions) for v in (True, False)]
        assert [r.branch for r in runs] == branches
        assert all(f"branch {b};" in checked.format_table() for b in branches)
    else:
        assert len(runs) == 1 and checked.branch == ""


def test_merged_decoder_branches_are_inferred_apart(monkeypatch):
    """The cached branch's bias is (1, H, 1, 1), the uncached one's (H, 1, 1) under the same
    name; ONNX's data propagation alone gives both the first."""
    monkeypatch.setattr(shapes, "_symbolic_shapes", _no_symbolic)
    inferred, how = shapes.infer_shapes(models.merged_decoder())
    assert how == "onnx"
    graphs = dict(subgraphs(inferred.graph))
    ranks = {}
    for key, graph in graphs.items():
        for v in graph.value_info:
            if v.name == "/decoder/attn/bias_output_0":
                ranks[key[-1][1] if key else ""] = len(v.type.tensor_type.shape.dim)
    assert ranks == {"then_branch": 4, "else_branch": 3}
    assert [n.op_type for n in inferred.graph.node] == ["If"]  # nodes and names as given


@needs_library
def test_value_info_of_the_original_is_kept_in_its_branch():
    original = models.merged_decoder()
    uncached = next(a.g for a in original.graph.node[0].attribute if a.name == "else_branch")
    given = helper.make_tensor_value_info("/decoder/attn/bias_output_0", TensorProto.FLOAT,
                                          [models.H, 1, 1])
    uncached.value_info.append(given)
    out = rewrite(original).model
    branches = {a.name: a.g for a in out.graph.node[0].attribute}
    assert list(branches["else_branch"].value_info) == [given]
    assert list(branches["then_branch"].value_info) == []


def _broken_rewrite(monkeypatch, op_type="Transpose"):
    """Every eager-attention fusion emits a Transpose whose perm does not fit its input (ONNX
    Runtime refuses it; onnx cannot tell, the fused op's output type being unknown to it), or
    an op onnx does not know."""
    real = matmul_softmax_attention.MatMulSoftmaxAttention.rewrite

    def broken(self, op, **bindings):
        return getattr(op, op_type)(real(self, op, **bindings), perm=[0, 1, 2, 3, 4])

    monkeypatch.setattr(matmul_softmax_attention.MatMulSoftmaxAttention, "rewrite", broken)


@needs_library
@pytest.mark.parametrize("form", ["bytes", "path"])
def test_gate_refuses_a_broken_rewrite(monkeypatch, form):
    if form == "path":  # as for a model of more than PATH_FORM_BYTES: from a file, external data
        monkeypatch.setattr(output_check, "PATH_FORM_BYTES", 0)
        rewrite(models.merged_decoder())  # a good one passes that way too
    _broken_rewrite(monkeypatch)
    with pytest.raises(RewriteRefusedError) as refused:
        rewrite(models.loop_model())
    message = str(refused.value)
    assert "\n" not in message and len(message) <= 460
    assert message.startswith(("the rewritten model fails onnx.checker",
                               "ONNX Runtime cannot load the rewritten model")), message


@needs_library
def test_cli_rewrite_refuses_with_one_line_and_writes_nothing(monkeypatch, tmp_path, capsys):
    _broken_rewrite(monkeypatch)
    source, out, report = tmp_path / "m.onnx", tmp_path / "m.flash.onnx", tmp_path / "r.json"
    onnx.save(models.merged_decoder(), source)
    code = main(["rewrite", str(source), "-o", str(out), "--report", str(report)])
    err = capsys.readouterr().err
    assert code not in (0, None)
    assert err.count("\n") == 1 and err.startswith("ort-flash: error: ") and "Traceback" not in err
    assert "rewritten model" in err
    assert not out.exists() and not report.exists()
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]  # no temp file left either


@needs_library
def test_gate_accepts_a_good_rewrite_unchanged(tmp_path):
    source, out = tmp_path / "m.onnx", tmp_path / "m.flash.onnx"
    onnx.save(models.merged_decoder(), source)
    assert main(["rewrite", str(source), "-o", str(out)]) == 0
    written = onnx.load(out)
    assert written == rewrite(str(source)).model


def test_gate_without_the_library_checks_with_onnx_only(monkeypatch, caplog):
    """A source tree not built: the checker still runs (and still refuses), ORT is skipped."""
    import ort_flash._library

    def missing(so=None):
        raise FileNotFoundError("libort_flash.so not found")

    monkeypatch.setattr(ort_flash._library, "session_options", missing)
    assert rewrite(models.loop_model()).report.total_fused == 1
    assert "was not loaded in ONNX Runtime: libort_flash.so not found" in caplog.text
    _broken_rewrite(monkeypatch, "NoSuchOp")
    with pytest.raises(RewriteRefusedError, match="fails onnx.checker"):
        rewrite(models.loop_model())


def test_fp32_precision_reaches_the_fused_nodes_in_subgraphs():
    out = rewrite(models.merged_decoder(), fp32_precision="tf32").model
    flash = [n for _, g in subgraphs(out.graph) for n in g.node if n.op_type == "FlashAttention"]
    assert len(flash) == 4
    assert all(helper.get_node_attr_value(n, "fp32_precision") == b"tf32" for n in flash)
