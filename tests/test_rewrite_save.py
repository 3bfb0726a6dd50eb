"""RewriteResult.save writes atomically: the output (and its data file) appear complete or not at
all. A failure while writing the graph or the weights leaves no new file and no temp file in the
folder, an existing output keeps its content, and the model keeps referring to the weights it
had, so that a later save still works. No library or GPU needed: the results are built by hand.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import external_data_helper as edh
from onnx import helper, numpy_helper

from ort_flash.rewriter import RewriteResult, external_data
from ort_flash.rewriter.report import RewriteReport

N = 4200
WEIGHT = np.arange(64 * N, dtype=np.float32).reshape(64, N)  # 1.03 MiB: left on disk at load
BIAS = np.linspace(-1, 1, N, dtype=np.float32)               # 16 KiB: read into memory at load


def _model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, N])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], [numpy_helper.from_array(WEIGHT, "w"),
                                                     numpy_helper.from_array(BIAS, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _with_external_data(folder) -> RewriteResult:
    """A result whose model keeps its large weight in the input's data file, as ``rewrite`` of
    such an input gives it."""
    folder.mkdir()
    onnx.save(_model(), folder / "in.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="in.onnx.data", size_threshold=1024)
    model, had = external_data.load_graph(str(folder / "in.onnx"))
    assert had and [t.name for t in external_data.external_tensors(model)] == ["w"]
    return RewriteResult(model, RewriteReport(), base_dir=str(folder), external=True)


def _weights(path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))  # reads the data file beside it
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _state(model: onnx.ModelProto) -> list:
    return [(t.name, t.data_location, [(e.key, e.value) for e in t.external_data], t.raw_data)
            for t in external_data.tensors(model)]


def _fail_serializer(monkeypatch, kill_after: int = 100) -> None:
    """onnx.save_model writes part of the graph, then the disk is full."""
    def failing_save(model, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(model.SerializeToString()[:kill_after])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(onnx, "save_model", failing_save)


@pytest.mark.parametrize("kind", ["one_file", "external", "moved_to_data_file"])
def test_failing_save_leaves_no_output_and_the_model_as_it_was(tmp_path, monkeypatch, kind):
    if kind == "external":
        result = _with_external_data(tmp_path / "in")
    else:  # moved_to_data_file: in-memory weights that the save moves into a data file of its own
        result = RewriteResult(_model(), RewriteReport(), external=kind == "moved_to_data_file")
    out = tmp_path / "out"
    out.mkdir()
    before = _state(result.model)
    _fail_serializer(monkeypatch)
    with pytest.raises(OSError, match="No space left on device") as failed:
        result.save(out / "m.onnx")
    assert str(out / "m.onnx") in str(failed.value)  # the path asked for, not a temp file
    assert os.listdir(out) == []
    assert _state(result.model) == before
    monkeypatch.undo()
    data = result.save(out / "m.onnx")  # the same result saves once the disk has room
    assert (data is None) == (kind == "one_file")
    assert sorted(os.listdir(out)) == (["m.onnx"] if kind == "one_file" else ["m.onnx", "m.onnx.data"])
    weights = _weights(out / "m.onnx")
    np.testing.assert_array_equal(weights["w"], WEIGHT)
    np.testing.assert_array_equal(weights["b"], BIAS)


def test_failing_save_keeps_an_existing_output(tmp_path, monkeypatch):
    result = _with_external_data(tmp_path / "in")
    out = tmp_path / "m.onnx"
    out.write_bytes(b"previous graph")
    (tmp_path / "m.onnx.data").write_bytes(b"previous weights")
    _fail_serializer(monkeypatch)
    with pytest.raises(OSError):
        result.save(out)
    assert out.read_bytes() == b"previous graph"
    assert (tmp_path / "m.onnx.data").read_bytes() == b"previous weights"
    assert sorted(os.listdir(tmp_path)) == ["in", "m.onnx", "m.onnx.data"]


def test_failing_weight_copy_leaves_no_output(tmp_path, monkeypatch):
    """The data file's write fails half way (the input's data file is short, or the disk full)."""
    result = _with_external_data(tmp_path / "in")

    def failing_copy(src, offset, length, out):
        out.write(b"\0" * 1000)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(external_data, "_copy_range", failing_copy)
    with pytest.raises(OSError, match="No space left on device"):
        result.save(tmp_path / "m.onnx")
    assert sorted(os.listdir(tmp_path)) == ["in"]
    assert edh.uses_external_data(next(t for t in result.model.graph.initializer if t.name == "w"))


def test_save_replaces_the_output_it_reads_its_weights_from(tmp_path):
    """After a save the model refers to the written data file; saving it to the same path again
    reads that file while writing its replacement, which only the temp files make possible."""
    result = _with_external_data(tmp_path / "in")
    out = tmp_path / "m.onnx"
    assert result.save(out) == str(out) + ".data"
    assert result.base_dir == str(tmp_path)
    assert result.save(out) == str(out) + ".data"
    assert sorted(os.listdir(tmp_path)) == ["in", "m.onnx", "m.onnx.data"]
    np.testing.assert_array_equal(_weights(out)["w"], WEIGHT)


def test_written_files_get_the_usual_mode(tmp_path):
    umask = os.umask(0o022)
    try:
        RewriteResult(_model(), RewriteReport(), external=True).save(tmp_path / "m.onnx")
    finally:
        os.umask(umask)
    for name in ("m.onnx", "m.onnx.data"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644, name
