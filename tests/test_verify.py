"""ort_flash.verify: the inputs it makes, how it judges, and the demo model end to end on CPU.

The end-to-end tests need the custom-op library (``ort_flash.library_path()``); they skip with
the reason where it has not been built.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_flash.cli import verify_command
from ort_flash.cli import main
from ort_flash.rewriter import rewrite
from ort_flash.verify import (
    IMAGE_SIZE, InputShapeError, OutputComparison, VerifyResult, _compare, branch_conditions,
    make_inputs, parse_shape, verify,
)

DEMO = str(importlib.resources.files("ort_flash").joinpath("data", "gpt2_tiny.onnx"))


def _library_missing() -> str | None:
    try:
        import ort_flash

        path = ort_flash.library_path()
    except Exception as e:  # not written yet, not built, not installed
        return f"ort_flash custom-op library not available: {type(e).__name__}: {e}"
    return None if os.path.exists(path) else f"ort_flash custom-op library not built: {path}"


needs_library = pytest.mark.skipif(_library_missing() is not None,
                                   reason=str(_library_missing()))


# Inputs.


def test_demo_inputs_are_ids_in_vocab_and_end_padded_masks():
    model = onnx.load(DEMO)
    vocab = json.loads(model.metadata_props[0].value)["vocab_size"]
    feeds = make_inputs(model, batch=4, seq_len=50, seed=3)
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    assert ids.shape == mask.shape == (4, 50) and ids.dtype == mask.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < vocab and ids.max() >= vocab // 2  # from wte
    assert set(np.unique(mask)) <= {0, 1}
    assert mask[0].all() and mask.sum(axis=1).min() > 0  # never a fully padded row
    assert (mask == 0).any()  # some padding
    assert (np.diff(mask, axis=1) <= 0).all()  # padding only at the end of a row


def test_inputs_are_seeded_and_respect_static_dims():
    table = numpy_helper.from_array(np.zeros((7, 3), np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"]),
         helper.make_node("Add", ["e", "x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "T"]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 3]),
         helper.make_tensor_value_info("other", TensorProto.INT32, [5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T", 3])], [table])
    model = helper.make_model(graph)
    a = make_inputs(model, batch=2, seq_len=11, seed=1)
    b = make_inputs(model, batch=2, seq_len=11, seed=1)
    c = make_inputs(model, batch=2, seq_len=11, seed=2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["x"], c["x"])
    assert a["ids"].shape == (2, 11) and a["ids"].max() < 7
    assert a["x"].shape == (2, 11, 3) and a["x"].dtype == np.float32
    assert a["other"].shape == (5,) and a["other"].dtype == np.int32


def test_cache_inputs_get_the_past_length_and_masks_the_total():
    """A KV-cache step: past dims get past_len, a dim named "past + sequence" their sum."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["past_key_0"], ["y"])], "g",
        [helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                       ["batch", "past_sequence + sequence"]),
         helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("past_key_0", TensorProto.FLOAT, ["batch", 2, "past_sequence", 4]),
         helper.make_tensor_value_info("odd", TensorProto.FLOAT, ["batch", "floor(n/2)"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, "past_sequence", 4])])
    feeds = make_inputs(helper.make_model(graph), batch=3, seq_len=7, past_len=5, seed=0)
    assert feeds["past_key_0"].shape == (3, 2, 5, 4)
    assert feeds["input_ids"].shape == (3, 7)
    assert feeds["attention_mask"].shape == (3, 12) and feeds["attention_mask"][0].all()
    assert feeds["odd"].shape == (3, 7)  # not an expression of known names: the sequence length


# Judging.


@pytest.mark.parametrize("dtype, delta, passed", [
    (np.float32, 0.0, True), (np.float32, 5e-6, True), (np.float32, 1e-3, False),
    (np.float16, 1e-2, True), (np.float16, 1e-1, False),
])
def test_tolerance_by_dtype(dtype, delta, passed):
    want = np.linspace(-1, 1, 64).astype(dtype)
    got = (want.astype(np.float64) + delta).astype(dtype)
    result = _compare("y", got, want, None, None)
    assert result.passed is passed
    assert result.max_abs == pytest.approx(np.abs(got.astype(float) - want.astype(float)).max())


def test_nan_on_one_side_or_shape_mismatch_fails():
    want = np.ones((2, 3), np.float32)
    got = want.copy()
    got[0, 0] = np.nan
    assert not _compare("y", got, want, None, None).passed
    assert _compare("y", want.copy(), want, None, None).passed
    assert not _compare("y", np.ones((2, 4), np.float32), want, None, None).passed


def test_result_table_and_json():
    out = OutputComparison("logits", "float32", [2, 5], 1e-6, 2e-6, 1e-4, 1e-4, True)
    result = VerifyResult(["CPUExecutionProvider"], ["CPUExecutionProvider"],
                          ["CPUExecutionProvider"], 9, {"input_ids": "int64[2,5]"}, [out])
    assert result.passed and json.loads(result.to_json())["passed"] is True
    assert "logits" in result.format_table() and result.format_table().endswith("PASS")


# End to end (needs the library).


@needs_library
def test_rewritten_demo_verifies_on_cpu():
    result = verify(DEMO, rewrite(DEMO).model, providers=["CPUExecutionProvider"], seq_len=37,
                    seed=0)
    assert result.passed, result.format_table()
    assert [o.name for o in result.outputs] == ["logits"]


def _verify_args(original, rewritten, **kw):
    return argparse.Namespace(original=str(original), rewritten=str(rewritten), provider="cpu",
                              seq_len=kw.get("seq_len"), batch=2, seed=0, json=None)


@needs_library
def test_cmd_verify_passes_and_catches_a_wrong_scale(tmp_path, capsys):
    good = rewrite(DEMO).model
    onnx.save(good, tmp_path / "good.onnx")
    assert verify_command.run(_verify_args(DEMO, tmp_path / "good.onnx", seq_len=23)) == 0
    assert "PASS" in capsys.readouterr().out
    bad = onnx.ModelProto()
    bad.CopyFrom(good)
    node = next(n for n in bad.graph.node if n.op_type == "FlashAttention")
    next(a for a in node.attribute if a.name == "scale").f = 0.5
    onnx.save(bad, tmp_path / "bad.onnx")
    assert verify_command.run(_verify_args(DEMO, tmp_path / "bad.onnx")) == 1
    assert "FAIL" in capsys.readouterr().out


def test_cmd_verify_user_errors(tmp_path, capsys):
    missing = tmp_path / "missing.onnx"
    assert verify_command.run(_verify_args(DEMO, missing)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err and "Traceback" not in err


# Shapes asked for, image inputs, If conditions.


def image_model(channels=3) -> onnx.ModelProto:
    """pixel_values (all dims dynamic, as Optimum exports them) -> Conv -> + a per-batch bias."""
    w = numpy_helper.from_array(np.ones((4, channels, 3, 3), np.float32) / 9, "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["pixel_values", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Add", ["c", "bias"], ["y"])], "image",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT,
                                       ["batch_size", "num_channels", "height", "width"]),
         helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["batch_size", 1, 1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch_size", 4, "height", "width"])],
        [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_image_input_defaults_to_conv_channels_and_square_pixels():
    feeds = make_inputs(image_model(channels=3), batch=2, seq_len=37, seed=0)
    assert feeds["pixel_values"].shape == (2, 3, IMAGE_SIZE, IMAGE_SIZE)  # not (2, 37, 37, 37)
    assert feeds["bias"].shape == (2, 1, 1, 1)


def patch_model(patch=4, side=6, cls=True) -> onnx.ModelProto:
    """ViT's embedding: Conv(kernel = stride = patch) -> (B, E, side, side) -> + position table."""
    e = 8
    w = numpy_helper.from_array(np.ones((e, 3, patch, patch), np.float32), "w")
    table = numpy_helper.from_array(np.zeros((1, side * side + cls, e), np.float32), "pos")
    text = numpy_helper.from_array(np.zeros((64, e), np.float32), "text_pos")  # 64 = 8²: not it
    graph = helper.make_graph(
        [helper.make_node("Conv", ["pixel_values", "w"], ["c"], kernel_shape=[patch, patch],
                          strides=[patch, patch]),
         helper.make_node("Identity", ["pos"], ["pos_out"]), helper.make_node("Identity", ["text_pos"], ["t"])],
        "patches", [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT,
                                                  ["batch_size", "num_channels", "height", "width"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("c", "pos_out", "t")],
        [w, table, text])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("patch, side, cls, size", [
    (4, 6, True, 24), (8, 2, True, 16),
    (4, 5, False, IMAGE_SIZE),  # no class row: 25 = 5² and the text table's 64 = 8² both fit
])
def test_patch_embedding_input_gets_the_size_its_position_table_holds(patch, side, cls, size):
    feeds = make_inputs(patch_model(patch, side, cls), batch=1, seq_len=37, seed=0)
    assert feeds["pixel_values"].shape == (1, 3, size, size)


def test_shape_sets_one_input_and_its_named_dims_elsewhere():
    feeds = make_inputs(image_model(), batch=2, seq_len=37, seed=0,
                        shapes={"pixel_values": [1, 3, 20, 24]})
    assert feeds["pixel_values"].shape == (1, 3, 20, 24)
    assert feeds["bias"].shape == (1, 1, 1, 1)  # batch_size named by the shape asked for


@pytest.mark.parametrize("shapes, message", [
    ({"pixels": [1, 3, 8, 8]}, "no input 'pixels' (inputs: pixel_values, bias)"),
    ({"pixel_values": [1, 3, 8]}, "3 dims given, the input has rank 4"),
    ({"bias": [2, 5, 1, 1]}, "dim 1 is 1 in the model, not 5"),
])
def test_shape_that_does_not_fit_is_a_clear_error(shapes, message):
    with pytest.raises(InputShapeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_inputs(image_model(), batch=2, seq_len=5, seed=0, shapes=shapes)


def test_parse_shape():
    assert parse_shape("pixel_values=2,3,224,224") == ("pixel_values", [2, 3, 224, 224])
    assert parse_shape("a=b=4") == ("a=b", [4])
    assert parse_shape("scalar=") == ("scalar", [])
    for bad in ("pixel_values", "=2,3", "x=2,three", "x=-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=d0,d1"):
            parse_shape(bad)


def if_model(else_op="Sub") -> onnx.ModelProto:
    """y = If(use_cache_branch) {a + b} else {a <else_op> b}: which branch runs is an input."""
    branch = lambda op, name: helper.make_graph(  # noqa: E731
        [helper.make_node(op, ["a", "b"], ["r"])], name, [],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 3])])
    graph = helper.make_graph(
        [helper.make_node("If", ["use_cache_branch"], ["y"], then_branch=branch("Add", "then"),
                          else_branch=branch(else_op, "else"))], "if",
        [helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]),
         helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 3]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_branch_conditions_are_bool_inputs_that_decide_an_if():
    assert branch_conditions(if_model()) == {"use_cache_branch": [1]}
    assert branch_conditions(onnx.load(DEMO)) == {}


@needs_library
def test_both_branches_are_verified_and_a_wrong_else_branch_fails():
    result = verify(if_model(), if_model(), seed=0)
    assert result.passed and [r.branch for r in (result, *result.more)] == [
        "use_cache_branch=True", "use_cache_branch=False"]
    assert json.loads(result.to_json())["more"][0]["branch"] == "use_cache_branch=False"
    wrong = verify(if_model(), if_model(else_op="Mul"), seed=0)  # differs only when False
    assert wrong.outputs[0].passed and not wrong.more[0].outputs[0].passed
    assert not wrong.passed and wrong.format_table().endswith("FAIL: outputs differ beyond tolerance")


@needs_library
def test_cli_verify_with_shape_on_an_image_model(tmp_path, capsys):
    path = tmp_path / "image.onnx"
    onnx.save(image_model(), path)
    code = main(["verify", str(path), str(path), "--seed", "0", "--shape", "pixel_values=1,3,9,11"])
    out = capsys.readouterr().out
    assert code == 0, out
    flat = " ".join(out.split())  # the inputs line wraps at 100 columns
    assert "pixel_values float32[1,3,9,11]" in flat and "bias float32[1,1,1,1]" in flat
    assert main(["verify", str(path), str(path), "--shape", "pixels=1,3,9,11"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no input 'pixels'" in err
