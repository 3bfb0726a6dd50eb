"""Hugging Face Optimum folders in, folders out (ort_flash.optimum, `ort-flash rewrite FOLDER -o
OUT`, `ort-flash verify FOLDER OUT`): every ONNX file rewritten, every other file copied, nothing
half-written; and (slow: the pinned Optimum environment) the rewritten folder loaded by its
``ORTModelFor*`` class with the library gives the original folder's outputs and greedy tokens.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest

from ort_flash import optimum
from ort_flash.demo import demo_model_path


def _folder(tmp_path: Path) -> Path:
    """A folder shaped as Optimum writes one: two models (one with its weights as external data),
    config.json, tokenizer and generation files, a file in a subfolder."""
    src = tmp_path / "src"
    src.mkdir()
    model = onnx.load(demo_model_path("cpu"))
    onnx.save(model, src / "model.onnx")
    onnx.save(model, src / "decoder_model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="decoder_model.onnx_data", size_threshold=0)
    (src / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (src / "tokenizer.json").write_text("{}")
    (src / "generation_config.json").write_text("{}")
    (src / "extra").mkdir()
    (src / "extra" / "notes.txt").write_text("kept")
    return src


def test_rewrite_folder_rewrites_every_model_and_copies_the_rest(tmp_path):
    src = _folder(tmp_path)
    out = tmp_path / "out"
    reports = optimum.rewrite_folder(src, out)
    assert sorted(reports) == ["decoder_model.onnx", "model.onnx"]
    assert all(r.total_fused == 2 for r in reports.values())  # the demo model's two attention layers
    for name in ("config.json", "tokenizer.json", "generation_config.json", "extra/notes.txt"):
        assert (out / name).read_bytes() == (src / name).read_bytes(), name
    assert not (out / "decoder_model.onnx_data").exists()  # the source's data is not carried
    for name in reports:
        model = onnx.load(out / name)
        assert any(n.domain == "ort_flash" for n in model.graph.node)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]  # no scratch left


def test_a_failing_file_leaves_nothing(tmp_path):
    src = _folder(tmp_path)
    out = tmp_path / "out"

    def write(source, output):
        if source.name == "model.onnx":
            raise RuntimeError("boom")
        shutil.copy(source, output)

    with pytest.raises(RuntimeError, match="boom"):
        optimum.write_folder(src, out, write)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("where", ["same", "inside", "not_empty", "file"])
def test_output_folder_refused(tmp_path, where):
    src = _folder(tmp_path)
    out = {"same": src, "inside": src / "out", "not_empty": tmp_path / "full", "file": tmp_path / "f"}[where]
    if where == "not_empty":
        out.mkdir()
        (out / "x").write_text("x")
    if where == "file":
        out.write_text("x")
    with pytest.raises(optimum.OptimumFolderError):
        optimum.rewrite_folder(src, out)


def test_cli_rewrite_and_verify_a_folder(tmp_path, capsys):
    from ort_flash.cli import main

    src = _folder(tmp_path)
    out, report = tmp_path / "out", tmp_path / "report.json"
    assert main(["rewrite", str(src), "-o", str(out), "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "== decoder_model.onnx" in printed and "== model.onnx" in printed
    assert "wrote the Optimum folder" in printed
    files = json.loads(report.read_text())["files"]
    assert sorted(files) == ["decoder_model.onnx", "model.onnx"]
    assert main(["verify", str(src), str(out), "--seq-len", "17", "--json", str(tmp_path / "v.json")]) == 0
    assert sorted(json.loads((tmp_path / "v.json").read_text())["files"]) == ["decoder_model.onnx", "model.onnx"]


def test_cli_refuses_a_folder_of_no_known_kind(tmp_path, capsys):
    from ort_flash.cli import main

    (tmp_path / "empty").mkdir()
    assert main(["rewrite", str(tmp_path / "empty"), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Optimum export folder" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


# The Optimum family's float32 exports (lab/models/optimum_family.py) with the ORTModel class that
# loads each and what the check runs.
_CLASSES = {"feature-extraction": ("ORTModelForFeatureExtraction", "forward"),
            "automatic-speech-recognition": ("ORTModelForSpeechSeq2Seq", "speech"),
            "automatic-speech-recognition-with-past": ("ORTModelForSpeechSeq2Seq", "speech"),
            "text-generation": ("ORTModelForCausalLM", "generate"),
            "text-generation-with-past": ("ORTModelForCausalLM", "generate"),
            "text2text-generation": ("ORTModelForSeq2SeqLM", "generate"),
            "text2text-generation-with-past": ("ORTModelForSeq2SeqLM", "generate")}


def _ort_models() -> list[tuple[str, str, str, str]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from lab.models.optimum_family import FAMILIES

    out = []
    for family, (*_, tasks) in FAMILIES.items():
        for task in tasks:
            cls, what = _CLASSES[task]
            if family == "clip":
                cls, what = "ORTModelForZeroShotImageClassification", "clip"
            out.append((family, task, cls, "pixels" if family == "vit" else what))
    return out


ORT_MODELS = _ort_models()

_ORTMODEL_CHECK = textwrap.dedent('''
    import json, sys
    import numpy as np, onnxruntime as ort, torch
    import optimum.onnxruntime as om
    original, rewritten, cls, what, library, past, provider = sys.argv[1:8]
    if provider not in ort.get_available_providers():
        print(json.dumps({"error": "provider", "message": f"this environment's onnxruntime "
                          f"{ort.__version__} has no {provider}"}))
        sys.exit(0)
    so = ort.SessionOptions()
    so.register_custom_ops_library(library)
    kw = {"use_cache": past == "1"} if what in ("generate", "speech") else {}
    if provider == "CUDAExecutionProvider":  # float32 in full precision on both sides, no TF32
        kw["provider_options"] = {"use_tf32": "0"}
    models = {"original": getattr(om, cls).from_pretrained(original, provider=provider, **kw),
              "rewritten": getattr(om, cls).from_pretrained(rewritten, provider=provider,
                                                             session_options=so, **kw)}
    dev = "cuda" if provider == "CUDAExecutionProvider" else "cpu"
    torch.manual_seed(0)
    ids = torch.randint(4, 100, (2, 13))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # a left-padded row, as a batch of prompts gets
    out = {}
    host = lambda t: t.detach().cpu().numpy()
    for k, m in models.items():
      try:
        if what == "generate":
            gen = m.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=12,
                             do_sample=False, min_new_tokens=12, output_scores=True,
                             return_dict_in_generate=True)
            out[k] = (gen.sequences.tolist(), host(torch.stack(gen.scores)))
        elif what == "speech":  # Whisper: log-mel frames in, tokens out (its scores are not kept)
            c = m.config
            feats = torch.randn(2, c.num_mel_bins, 2 * c.max_source_positions, generator=torch.Generator().manual_seed(0))
            gen = m.generate(input_features=feats.to(dev), max_new_tokens=8, do_sample=False)
            out[k] = (gen.tolist(), np.zeros(1))
        elif what == "clip":
            pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
            out[k] = (None, host(m(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                                   pixel_values=pixels.to(dev)).logits_per_image))
        elif what == "pixels":
            pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
            out[k] = (None, host(m(pixel_values=pixels.to(dev)).last_hidden_state))
        else:
            out[k] = (None, host(m(input_ids=ids.to(dev), attention_mask=mask.to(dev)).last_hidden_state))
      except Exception as e:  # the original failing in Optimum itself is the test's skip
        print(json.dumps({"error": k, "message": " ".join(str(e).split())[:300]}))
        sys.exit(0)
    a, b = out["original"][1], out["rewritten"][1]
    finite = np.isfinite(a)  # generate's scores hold -inf where a token is suppressed (min_new_tokens)
    same_inf = bool((finite == np.isfinite(b)).all() and (a[~finite] == b[~finite]).all())
    diff = float(np.abs(a[finite] - b[finite]).max()) if same_inf else float("inf")
    print(json.dumps({"tokens_equal": out["original"][0] == out["rewritten"][0], "max_diff": diff}))
''')


def _ortmodel_check(tmp_path, family, task, cls, what, provider):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from lab.models.optimum_family import OptimumSpec, attention_sites, export, venv_python

    import ort_flash

    spec = OptimumSpec(family, task)
    src = export(spec, spec.files[0]).parent
    out = tmp_path / "flash"
    reports = optimum.rewrite_folder(src, out)
    fused = {name: r.total_fused for name, r in reports.items()}
    assert fused == {f"{n}.onnx": attention_sites(spec, n)["sites"] for n in spec.files}, fused
    run = subprocess.run([str(venv_python()), "-c", _ORTMODEL_CHECK, str(src), str(out), cls, what,
                          ort_flash.library_path(), str(int(spec.past)), provider], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    if result.get("error") == "original":
        pytest.skip(f"Optimum's {cls} cannot run the original folder: {result['message']}")
    if result.get("error") == "provider":
        pytest.skip(f"the Optimum environment ({venv_python()}) cannot run {provider}: {result['message']}")
    assert "error" not in result, result
    if what in ("generate", "speech"):
        assert result["tokens_equal"], result
    assert result["max_diff"] < 1e-3, result


@pytest.mark.slow
@pytest.mark.parametrize("family,task,cls,what", ORT_MODELS, ids=[f"{f}-{t}" for f, t, *_ in ORT_MODELS])
def test_ortmodel_loads_the_rewritten_folder(tmp_path, family, task, cls, what):
    """The rewritten folder, loaded by Optimum's own class with the library registered in its
    session options, gives the original folder's outputs (float32 rounding) and greedy tokens."""
    _ortmodel_check(tmp_path, family, task, cls, what, "CPUExecutionProvider")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("family,task,cls,what", ORT_MODELS, ids=[f"{f}-{t}" for f, t, *_ in ORT_MODELS])
def test_ortmodel_loads_the_rewritten_folder_on_cuda(tmp_path, family, task, cls, what):
    """The same on CUDA: Optimum's class with provider="CUDAExecutionProvider" (TF32 off on both
    sides) runs the rewritten folder's attention on the library's CUDA kernels. Needs the Optimum
    environment (lab/models/optimum_family.py) with onnxruntime-gpu in it; skips naming what is
    missing otherwise."""
    _ortmodel_check(tmp_path, family, task, cls, what, "CUDAExecutionProvider")


def test_cli_folder_with_nothing_to_fuse(tmp_path, capsys):
    """A folder whose models hold no attention: written unchanged with exit 3 and a warning, or
    with --require-fusion nothing written."""
    from onnx import TensorProto, helper

    from ort_flash.cli import main

    src = tmp_path / "src"
    src.mkdir()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), src / "model.onnx")
    (src / "config.json").write_text("{}")
    assert main(["rewrite", str(src), "-o", str(tmp_path / "strict"), "--require-fusion"]) == 3
    assert "nothing written" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    assert main(["rewrite", str(src), "-o", str(tmp_path / "out")]) == 3
    assert "no attention was fused" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.onnx"]
