"""Opt-in FP8 attention, the Python side: ``rewrite(attention_precision="fp8")`` stamps the
attribute on float16 / bfloat16 fused nodes only, the report names them, ``ort-flash rewrite
--attention-precision fp8`` reaches a model file, a GenAI folder and an Optimum folder, and
``verify`` of such a model also runs it in its dtype and against a float32 reference
(``ort_flash.float32_reference``). CPU only: the CPU op runs every node in its dtype.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from ml_dtypes import bfloat16
from onnx import TensorProto, helper, numpy_helper

from ort_flash import float32_reference
from ort_flash.cli import main
from ort_flash.demo import demo_model_path
from ort_flash.rewriter import RewriteReport, rewrite
from ort_flash.verify import FP8_FACTOR, _compare_fp8, verify
from test_genai_folder import _folder as genai_folder
from test_optimum_folder import _folder as optimum_folder
from test_rewrite_gqa import _feeds as gqa_feeds
from test_rewrite_gqa import _model as gqa_model
from test_verify import needs_library

FP16_DEMO, FP32_DEMO = demo_model_path("cuda"), demo_model_path("cpu")


def _stamps(model: onnx.ModelProto) -> dict[str, bytes | None]:
    """Each ort_flash node of the main graph -> its attention_precision (None: absent)."""
    return {n.name: next((a.s for a in n.attribute if a.name == "attention_precision"), None)
            for n in model.graph.node if n.domain == "ort_flash"}


@pytest.fixture(scope="module")
def fp8_demo():
    return rewrite(FP16_DEMO, attention_precision="fp8")


def test_fp8_stamps_float16_nodes_and_the_report_names_them(fp8_demo):
    stamps = _stamps(fp8_demo.model)
    assert len(stamps) == 2 and set(stamps.values()) == {b"fp8"}
    report = fp8_demo.report
    assert report.attention_precision == "fp8" and sorted(report.fp8_nodes) == sorted(stamps)
    assert not report.notes
    text = report.format_table()
    assert "FP8 attention" in text and "sm_90" in text and "prefill only" in text
    assert all(name in text.replace("\n  ", "") for name in stamps)
    assert RewriteReport.from_json(report.to_json()).fp8_nodes == report.fp8_nodes


def test_default_stamps_nothing():
    result = rewrite(FP16_DEMO)
    assert set(_stamps(result.model).values()) == {None}
    assert result.report.fp8_nodes == [] and "FP8" not in result.report.format_table()


def test_float32_nodes_are_not_stamped_and_the_notes_say_so():
    result = rewrite(FP32_DEMO, attention_precision="fp8")
    assert len(_stamps(result.model)) == 2 and set(_stamps(result.model).values()) == {None}
    assert result.report.fp8_nodes == []
    assert result.report.notes == ["2 float32 attention node(s) not stamped for FP8 keep their dtype: the FP8 "
                                   "path takes float16 / bfloat16 attention"]
    assert "note: 2 float32 attention node(s)" in result.report.format_table()


@pytest.mark.parametrize("dtype, stamped", [(np.float16, True), (bfloat16, True), (np.float32, False)])
def test_group_query_attention_nodes(dtype, stamped):
    feeds, attrs = gqa_feeds(dtype=dtype, d=64)
    result = rewrite(gqa_model(feeds, attrs), attention_precision="fp8")
    assert result.report.total_fused == 1
    assert _stamps(result.model) == {"layers.0/attn/GroupQueryAttention": b"fp8" if stamped else None}
    assert bool(result.report.fp8_nodes) is stamped


def test_a_bad_value_is_refused():
    with pytest.raises(ValueError, match="attention_precision must be one of model, fp8, not 'fp16'"):
        rewrite(FP16_DEMO, attention_precision="fp16")
    with pytest.raises(SystemExit):
        main(["rewrite", FP16_DEMO, "-o", "unused.onnx", "--attention-precision", "fp16"])


def test_cli_file(tmp_path, capsys):
    out, report = tmp_path / "m.onnx", tmp_path / "r.json"
    assert main(["rewrite", FP16_DEMO, "-o", str(out), "--attention-precision", "fp8", "--report", str(report)]) == 0
    assert "FP8 attention (" in capsys.readouterr().out
    assert set(_stamps(onnx.load(out)).values()) == {b"fp8"}
    assert len(json.loads(report.read_text())["fp8_nodes"]) == 2


@needs_library
def test_cli_genai_folder(tmp_path):
    src = genai_folder(tmp_path / "src")
    feeds, attrs = gqa_feeds(dtype=np.float16, d=64)
    onnx.save(gqa_model(feeds, attrs), src / "model.onnx", save_as_external_data=True,
              location="model.onnx.data", size_threshold=0)
    assert main(["rewrite", str(src), "-o", str(tmp_path / "out"), "--attention-precision", "fp8"]) == 0
    assert set(_stamps(onnx.load(tmp_path / "out" / "model.onnx")).values()) == {b"fp8"}


def test_cli_optimum_folder(tmp_path):
    src = optimum_folder(tmp_path)
    onnx.save(onnx.load(FP16_DEMO), src / "model.onnx")  # float16; decoder_model.onnx stays float32
    out, report = tmp_path / "out", tmp_path / "r.json"
    assert main(["rewrite", str(src), "-o", str(out), "--attention-precision", "fp8", "--report", str(report)]) == 0
    assert set(_stamps(onnx.load(out / "model.onnx")).values()) == {b"fp8"}
    assert set(_stamps(onnx.load(out / "decoder_model.onnx")).values()) == {None}
    files = json.loads(report.read_text())["files"]
    assert len(files["model.onnx"]["fp8_nodes"]) == 2 and not files["decoder_model.onnx"]["fp8_nodes"]
    assert "2 float32" in files["decoder_model.onnx"]["notes"][0]


@needs_library
def test_verify_runs_the_dtype_path_and_a_float32_reference(fp8_demo):
    result = verify(FP16_DEMO, fp8_demo.model, seq_len=17, seed=0)
    assert result.fp8_nodes == 2 and "converted to float32" in result.reference
    [c] = result.fp8
    # The CPU op runs the FP8 node in its dtype: both runs agree, and both are rounded float16.
    assert c.fp8_abs == c.dtype_abs and c.fp8_ref_abs == c.dtype_ref_abs
    assert 0 < c.dtype_ref_abs < 2e-2 and 0 < c.original_ref_abs < 2e-2
    assert c.allowance == FP8_FACTOR * c.dtype_ref_abs
    assert result.passed and result.outputs[0].passed
    text = result.format_table()
    assert "FP8 rule" in text and "model dtype" in text and "float32 reference" in text
    plain = verify(FP16_DEMO, rewrite(FP16_DEMO).model, seq_len=17, seed=0)
    assert plain.fp8_nodes == 0 and not plain.fp8 and "FP8" not in plain.format_table()


@needs_library
def test_cli_verify_of_an_fp8_file(tmp_path, capsys, fp8_demo):
    path, report = tmp_path / "m.onnx", tmp_path / "v.json"
    fp8_demo.save(path)
    assert main(["verify", FP16_DEMO, str(path), "--seq-len", "9", "--json", str(report)]) == 0
    assert "FP8 rule" in capsys.readouterr().out
    [c] = json.loads(report.read_text())["fp8"]
    assert c["fp8_passed"] and c["dtype_passed"] and c["dtype_ref_abs"] > 0


def test_fp8_rule():
    ref = np.linspace(-1, 1, 101)
    in_dtype = (ref + 1e-3).astype(np.float16)  # the dtype run: 1e-3 (and rounding) from the reference
    want = in_dtype.copy()

    def judged(error, **tolerance):
        tolerance = {"atol": None, "rtol": None, **tolerance}
        return _compare_fp8("y", (ref + error).astype(np.float16), in_dtype, want, ref, **tolerance)

    assert judged(3e-3, atol=0.0, rtol=0.0).fp8_passed  # within 4 x the dtype run's error
    assert not judged(6e-3, atol=0.0, rtol=0.0).fp8_passed
    assert judged(1.5e-2).fp8_passed  # beyond 4 x, within float16's tolerance
    assert not judged(0.1).fp8_passed
    broken = _compare_fp8("y", want, want + 0.5, want, ref, None, None)
    assert not broken.dtype_passed and not broken.passed


def test_float32_model_of_the_float16_demo_is_close_to_it(tmp_path):
    import onnxruntime as ort

    from ort_flash.verify import make_inputs

    model = float32_reference.float32_model(FP16_DEMO)
    path = tmp_path / "ref.onnx"
    float32_reference.save(model, path)
    proto = onnx.load(path)
    kept = [t.name for t in proto.graph.initializer if t.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16)]
    assert not kept and proto.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    feeds = make_inputs(onnx.load(FP16_DEMO), batch=2, seq_len=9, seed=0)
    low = ort.InferenceSession(FP16_DEMO, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, float32_reference.float32_feeds(feeds))[0]
    assert low.dtype == np.float16 and ref.dtype == np.float32
    assert 0 < np.abs(ref - low.astype(np.float32)).max() < 2e-2
    assert float32_reference.float32_model(FP32_DEMO) is None


def test_float32_model_widens_casts_constants_and_bfloat16(tmp_path):
    """x (float16) + a float16 Constant, cast to bfloat16, times a bfloat16 weight: the float32
    model computes the same sum and product of the widened values, in float32."""
    import onnxruntime as ort

    c = np.array([0.1, -2.5, 3.0], np.float16)
    w = np.array([1.5, 0.3, -7.0], bfloat16)
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(c)),
             helper.make_node("Add", ["x", "c"], ["s"]),
             helper.make_node("Cast", ["s"], ["s_bf16"], to=TensorProto.BFLOAT16),
             helper.make_node("Mul", ["s_bf16", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [3])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    widened = float32_reference.float32_model(model)
    path = tmp_path / "m.onnx"
    float32_reference.save(widened, path)
    x = np.array([1.0, 2.0, -0.25], np.float16)
    [y] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, float32_reference.float32_feeds({"x": x}))
    want = (x.astype(np.float32) + c.astype(np.float32)) * w.astype(np.float32)
    np.testing.assert_array_equal(y, want)
    assert y.dtype == np.float32
