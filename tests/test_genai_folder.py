"""ort_flash.genai on hand-made GenAI folders (no onnxruntime_genai needed): which folders it
takes, what write_folder copies and writes, and what it refuses."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_flash import genai


def _folder(path, **decoder):
    """A GenAI folder: model.onnx (y = x + w, w in model.onnx.data), genai_config.json naming it
    (``decoder`` entries added or replacing), a tokenizer file and a file in a subfolder."""
    path.mkdir()
    w = numpy_helper.from_array(np.arange(1024, dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, str(path / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)
    config = {"model": {"type": "llama", "decoder": {"filename": "model.onnx", "session_options":
                                                     {"provider_options": [{"cuda": {}}]}}}}
    config["model"]["decoder"].update(decoder)
    (path / "genai_config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text("{}")
    (path / "extra").mkdir()
    (path / "extra" / "notes.txt").write_text("kept")
    return path


@pytest.fixture
def src(tmp_path):
    return _folder(tmp_path / "src")


@pytest.fixture
def library(tmp_path):
    lib = tmp_path / "libort_flash.so"
    lib.write_bytes(b"\x7fELF stand-in")
    return lib


def _rewrite(source):
    def write(path):  # the model written anew, with its own data file
        onnx.save(onnx.load(str(source / "model.onnx")), str(path), save_as_external_data=True,
                  location="model.onnx.data", size_threshold=0)
    return write


def test_open_folder_and_model_file(src):
    assert genai.is_genai(src) and genai.is_genai(src / "model.onnx")
    for path in (src, src / "model.onnx"):
        found = genai.open_folder(path)
        assert found.folder == src and found.decoder == src / "model.onnx"
        assert found.providers == ["cuda"]
    with pytest.raises(genai.GenAIFolderError, match="not the decoder"):
        genai.open_folder(src / "tokenizer.json")
    assert not genai.is_genai(src / "extra")
    with pytest.raises(genai.GenAIFolderError, match="no genai_config.json"):
        genai.open_folder(src / "extra")


@pytest.mark.parametrize("change, reason", [
    (dict(pipeline=[{"embeddings": {"filename": "a.onnx"}}]), "pipeline"),
    (dict(filename=""), "no model.decoder.filename"),
    (dict(filename="missing.onnx"), "not in"),
    (dict(filename="../model.onnx"), "not a path inside"),
])
def test_refused_decoders(tmp_path, change, reason):
    folder = _folder(tmp_path / "f", **change)
    with pytest.raises(genai.GenAIFolderError, match=reason):
        genai.open_folder(folder)


def test_refuses_other_models(src):
    config = json.loads((src / "genai_config.json").read_text())
    config["model"]["vision"] = {"filename": "vision.onnx"}
    (src / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(genai.GenAIFolderError, match=r"beside the decoder \(vision\)"):
        genai.open_folder(src)


def test_write_folder(src, library, tmp_path):
    out = genai.write_folder(src, tmp_path / "out", _rewrite(src), library=library)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["extra/notes.txt", "genai_config.json", "libort_flash.so", "model.onnx",
                     "model.onnx.data", "tokenizer.json"]
    config = json.loads((out / "genai_config.json").read_text())
    options = config["model"]["decoder"]["session_options"]
    assert options == {"provider_options": [{"cuda": {}}], "custom_ops_library": "libort_flash.so"}
    assert (out / "libort_flash.so").read_bytes() == library.read_bytes()
    assert json.loads((src / "genai_config.json").read_text())["model"]["decoder"]["session_options"] == \
        {"provider_options": [{"cuda": {}}]}  # the source is untouched


def test_model_data_is_the_callers(src, library, tmp_path):
    """The source's external data is not copied unless asked: a model that refers to it then
    needs copy_model_data, and without it write_folder says what is missing."""
    def graph_only(path):  # refers to model.onnx.data without writing it
        (path).write_bytes((src / "model.onnx").read_bytes())

    with pytest.raises(genai.GenAIFolderError, match="model.onnx.data that is not in"):
        genai.write_folder(src, tmp_path / "a", graph_only, library=library)
    out = genai.write_folder(src, tmp_path / "b", graph_only, library=library, copy_model_data=True)
    assert (out / "model.onnx.data").read_bytes() == (src / "model.onnx.data").read_bytes()


def test_write_folder_refusals(src, library, tmp_path):
    write = _rewrite(src)
    for out in (src, src / "sub", tmp_path):
        with pytest.raises(genai.GenAIFolderError, match="apart from the source"):
            genai.write_folder(src, out, write, library=library)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "old.txt").write_text("x")
    with pytest.raises(genai.GenAIFolderError, match="not empty"):
        genai.write_folder(src, busy, write, library=library)
    genai.write_folder(src, busy, write, library=library, overwrite=True)
    assert not (busy / "old.txt").exists() and (busy / "model.onnx").is_file()
    with pytest.raises(genai.GenAIFolderError, match="does not exist"):
        genai.write_folder(src, tmp_path / "c", write, library=tmp_path / "none.so")

    config = json.loads((src / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["custom_ops_library"] = "other.so"
    (src / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(genai.GenAIFolderError, match="already names a custom-op library"):
        genai.write_folder(src, tmp_path / "d", write, library=library)
