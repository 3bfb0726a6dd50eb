"""Hugging Face Optimum's exports: every attention site fused, every rewritten file loads and
verifies.

For each family × task × dtype × attention of ``lab/models/optimum_family.py`` (tiny random models
exported with ``optimum-onnx`` in its pinned environment, cached in the model cache) and each
file Optimum writes (``model``; ``encoder_model``, ``decoder_model``, ``decoder_with_past_model``,
``decoder_model_merged``), ``ort_flash.rewrite`` (the fast mask mapping, as
tests/test_rewrite_families.py) must

- load: the output passes ``onnx.checker`` (full check) and ONNX Runtime creates a session for
  it, with no exception (a rewrite that breaks a model is the worst outcome this tool has);
- fuse every attention site (Softmax / Attention node, inside If branches too);
- prove the masks: every causal self-attention ``is_causal`` and no (S × S) mask left, only
  compact (B, 1, 1, Skv) padding masks (T5: its relative position bias stays, a true limit);
- absorb the KV cache: every self-attention of a with-past file reads past/present;
- verify: ``ort_flash.verify`` on the CPU EP agrees with the original.

Where today's rewriter falls short, ``GAPS`` says which files and why (the rewriter's own reason),
as strict xfails: the family tracks progress without going red, and a fix turns its xfail into
a failure until its line here is removed. The float32 exports with the attention transformers
picks (sdpa where it has it) run by default; eager attention and float16 on the CPU are ``slow``;
the float16 files run on CUDA in the GPU suite (``gpu``), on exports cached, prebuilt
(``ORT_FLASH_MODEL_PREBUILT``) or made by the exporter's environment already built, and skip
naming what is missing where there is none. The export failures Optimum itself has are skipped
with its message (recorded by ``lab.models.optimum_family``). ``verify`` runs a merged
decoder once per ``use_cache_branch`` value, and ViT/CLIP with their (B, 3, 32, 32) pixel_values
(``shapes``). The first run builds the pinned environment and
exports what the model cache lacks (minutes); the cache makes later runs quick.
"""

from __future__ import annotations

import collections
import json
import os
import sys

import onnx
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))
from lab.models.optimum_coverage import (  # noqa: E402
    branches, compact, count_sites, load_error, verify_options,
)
from lab.models.optimum_family import (  # noqa: E402
    ExportFailure, OptimumSpec, attention_sites, export, export_all, missing_export, specs,
)

pytest.importorskip("onnxruntime")
from ort_flash.rewriter import rewrite  # noqa: E402
from ort_flash.verify import verify  # noqa: E402

# (check, where, the rewriter's reason) for every gap today: check is one of "loads", "fused",
# "masks", "cache", "verify"; where holds families / files / dtype / attn / past (each optional,
# all must match). A fix makes its strict xfails fail: then delete its line.
GAPS: list[tuple[str, dict, str]] = []


def _applies(where: dict, spec: OptimumSpec, name: str) -> bool:
    return (spec.family in where.get("families", (spec.family,))
            and name in where.get("files", (name,)) and spec.dtype == where.get("dtype", spec.dtype)
            and spec.attn == where.get("attn", spec.attn) and spec.past == where.get("past", spec.past))


def _gaps(check: str, spec: OptimumSpec, name: str) -> list[str]:
    return [reason for c, where, reason in GAPS if c == check and _applies(where, spec, name)]


def _params(check: str, *, gpu: bool = False):
    for spec in specs():
        if gpu and spec.dtype != "float16":
            continue
        for name in spec.files:
            marks = []
            if gpu:
                marks.append(pytest.mark.gpu)
            elif spec.dtype != "float32" or spec.attn != "default":
                marks.append(pytest.mark.slow)
            # a file that does not load cannot verify
            reasons = _gaps(check, spec, name) + (_gaps("loads", spec, name) if check == "verify"
                                                  else [])
            if reasons:
                marks.append(pytest.mark.xfail(reason="; ".join(reasons), strict=True))
            yield pytest.param(spec, name, id=f"{spec.id}/{name}", marks=marks)


@pytest.fixture(scope="module")
def rewritten(request):
    """(original, rewrite result) of one exported file, each rewritten once per module."""
    wanted = {item.callspec.params["spec"] for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec")
              and "spec" in item.callspec.params and not item.get_closest_marker("skip")}
    export_all(sorted(wanted, key=lambda s: s.id))  # one worker process for every missing export
    cache: dict[tuple, tuple] = {}

    def get(spec: OptimumSpec, name: str):
        if (spec, name) not in cache:
            try:
                model = onnx.load(export(spec, name))
            except ExportFailure as e:
                pytest.skip(f"Optimum cannot export this configuration: {e}")
            cache[spec, name] = (model, rewrite(model, exact_masked_rows=False))
        return cache[spec, name]

    return get


@pytest.mark.parametrize("spec, name", list(_params("sites")))
def test_export_has_its_attention_sites(spec, name, rewritten):
    model, _ = rewritten(spec, name)
    assert count_sites(model.graph) == attention_sites(spec, name)["sites"]


@pytest.mark.parametrize("spec, name", list(_params("loads")))
def test_rewritten_file_loads(spec, name, rewritten):
    _, result = rewritten(spec, name)
    assert load_error(result.model) is None


@pytest.mark.parametrize("spec, name", list(_params("fused")))
def test_every_site_fused(spec, name, rewritten):
    _, result = rewritten(spec, name)
    report = result.report
    assert report.unfused == [], report.format_table()
    assert report.total_fused == attention_sites(spec, name)["sites"], report.format_table()


@pytest.mark.parametrize("spec, name", list(_params("masks")))
def test_masks_proven_causal_or_compact(spec, name, rewritten):
    _, result = rewritten(spec, name)
    report = result.report
    if spec.family == "t5":
        # T5 adds its causal and padding masks into the relative position bias, a (B, H, S, S)
        # tensor the op takes whole (it has no position-bias input): a true limit.
        assert all(f.mask != "none" for f in report.fused), report.format_table()
        return
    left = collections.Counter(f.mask for f in report.fused if not compact(f.mask))
    assert not left, f"masks left materialized: {dict(left)}\n{report.format_table()}"
    assert sum(f.causal for f in report.fused) == attention_sites(spec, name)["causal"], (
        report.format_table())


@pytest.mark.parametrize("spec, name", list(_params("cache")))
def test_cache_is_the_ops_past(spec, name, rewritten):
    _, result = rewritten(spec, name)
    report = result.report
    want = attention_sites(spec, name)["cached"]
    assert sum(f.cache == "past/present" for f in report.fused) == want, report.format_table()


@pytest.mark.parametrize("spec, name", list(_params("verify")))
def test_same_function(spec, name, rewritten):
    model, result = rewritten(spec, name)
    check = verify(model, result.model, seed=0, **verify_options(spec))
    assert check.passed, check.format_table()
    # a merged decoder: each use_cache_branch value ran (each If branch)
    assert branches(check) == (2 if name == "decoder_model_merged" else 1), check.format_table()


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:400]


def cuda_export(spec: OptimumSpec, name: str):
    """The file of ``spec``'s export that the CUDA test reads, or a skip whose one-line reason
    names what is missing. It never builds the exporter's environment (``missing_export``)."""
    reason = missing_export(spec)
    if reason is not None:
        pytest.skip(reason)
    try:
        return export(spec, name)
    except ExportFailure as e:
        pytest.skip(f"Optimum cannot export this configuration: {_one_line(e)}")
    except (RuntimeError, OSError) as e:  # the exporter's run failed here (its worker, its torch)
        pytest.skip(f"no export of {spec.id} here: {_one_line(e)}")


@pytest.mark.parametrize("spec, name", list(_params("verify", gpu=True)))
def test_rewritten_on_cuda(spec, name):
    """Every float16 file, rewritten both ways, in a CUDA session against the original on CUDA
    (``ORT_FLASH_MODEL_PREBUILT`` points a GPU machine at the exports CI made)."""
    model = onnx.load(cuda_export(spec, name))
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    for exact in (True, False):
        result = rewrite(model, exact_masked_rows=exact)
        check = verify(model, result.model, providers=providers, seed=2, **verify_options(spec))
        assert check.passed, check.format_table()
        assert check.rewritten_providers[0] == "CUDAExecutionProvider"


def test_a_failed_export_is_recorded_and_not_retried(tmp_path, monkeypatch):
    """Optimum's failure becomes the spec's ``.failed`` record: raised with the message, and the
    next call reads it instead of starting the exporter again."""
    from lab.models import optimum_family

    monkeypatch.setenv("ORT_FLASH_MODEL_CACHE", str(tmp_path))
    monkeypatch.delenv("ORT_FLASH_MODEL_PREBUILT", raising=False)
    spec = OptimumSpec("gpt2", "text-generation")
    out = tmp_path / "job"
    out.mkdir()
    (out / "FAILED").write_text("ValueError: no export for you\n")
    optimum_family._store(spec, out, tmp_path)
    monkeypatch.setattr(optimum_family, "venv_python", lambda: pytest.fail("exporter started again"))
    with pytest.raises(ExportFailure, match="optimum-gpt2-text-generation-fp32: ValueError: no export"):
        export(spec, "model")


def test_a_file_onnxruntime_cannot_load_is_recorded_beside_the_others(tmp_path, monkeypatch):
    """One broken file of a seq2seq export raises for that file only; the others load."""
    from lab.models import optimum_family

    monkeypatch.setenv("ORT_FLASH_MODEL_CACHE", str(tmp_path))
    monkeypatch.delenv("ORT_FLASH_MODEL_PREBUILT", raising=False)
    spec = OptimumSpec("t5", "text2text-generation")
    out = tmp_path / "job"
    out.mkdir()
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)],
                                     ir_version=10), out / "encoder_model.onnx")
    (out / "decoder_model.onnx").write_bytes(b"not a model")
    optimum_family._store(spec, out, tmp_path)
    monkeypatch.setattr(optimum_family, "venv_python", lambda: pytest.fail("exporter started again"))
    assert onnx.load(export(spec, "encoder_model")).graph.node[0].op_type == "Identity"
    with pytest.raises(ExportFailure, match="decoder_model: ONNX Runtime cannot load"):
        export(spec, "decoder_model")
    with pytest.raises(ValueError, match="no file 'model'"):
        export(spec, "model")


# ---- the CUDA tests' exports: found, or a skip naming what is missing --------------------------

FP16 = OptimumSpec("gpt2", "text-generation", "float16")


@pytest.fixture
def bare_machine(tmp_path, monkeypatch):
    """A machine with no cached export, no prebuilt ones and no exporter environment, which must
    not build one."""
    from lab.models import optimum_family

    monkeypatch.setenv("ORT_FLASH_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ORT_FLASH_OPTIMUM_VENV", str(tmp_path / "venv"))
    monkeypatch.delenv("ORT_FLASH_MODEL_PREBUILT", raising=False)
    monkeypatch.setattr(optimum_family, "venv_python", lambda: pytest.fail("built the exporter's environment"))
    return tmp_path


def _skip_reason(spec: OptimumSpec, name: str) -> str:
    with pytest.raises(pytest.skip.Exception) as skipped:
        cuda_export(spec, name)
    reason = str(skipped.value.msg)
    assert "\n" not in reason, reason
    return reason


def test_cuda_export_skips_naming_the_exporter_and_the_prebuilt_exports(bare_machine):
    reason = _skip_reason(FP16, "model")
    assert FP16.id in reason and "exporter's environment" in reason and "ORT_FLASH_MODEL_PREBUILT" in reason
    with pytest.raises(pytest.skip.Exception, match="exporter's environment"):  # the GPU test itself
        test_rewritten_on_cuda(FP16, "model")


@pytest.mark.parametrize("folder", ["empty", "absent"])
def test_cuda_export_skips_naming_the_prebuilt_folder_that_lacks_it(bare_machine, monkeypatch, folder):
    prebuilt = bare_machine / "prebuilt"
    if folder == "empty":
        prebuilt.mkdir()
    monkeypatch.setenv("ORT_FLASH_MODEL_PREBUILT", str(prebuilt))
    reason = _skip_reason(FP16, "model")
    assert f"not among the prebuilt exports in ORT_FLASH_MODEL_PREBUILT={prebuilt}" in reason
    assert ("no folder" in reason) == (folder == "absent")


def test_cuda_export_reads_a_prebuilt_export(bare_machine, monkeypatch):
    prebuilt = bare_machine / "prebuilt"
    (prebuilt / f"{FP16.id}-0123456789ab").mkdir(parents=True)
    (prebuilt / f"{FP16.id}-0123456789ab" / "model.onnx").write_bytes(b"an export CI made")
    monkeypatch.setenv("ORT_FLASH_MODEL_PREBUILT", str(prebuilt))
    assert cuda_export(FP16, "model") == prebuilt / f"{FP16.id}-0123456789ab" / "model.onnx"


def test_cuda_export_skips_with_optimums_own_failure(bare_machine, monkeypatch):
    prebuilt = bare_machine / "prebuilt"
    prebuilt.mkdir()
    (prebuilt / f"{FP16.id}-0123456789ab.failed").write_text(f"{FP16.id}: ValueError: no\nexport\n")
    monkeypatch.setenv("ORT_FLASH_MODEL_PREBUILT", str(prebuilt))
    assert _skip_reason(FP16, "model") == f"Optimum cannot export this configuration: {FP16.id}: ValueError: no export"


def test_an_exporter_environment_already_built_is_used(bare_machine, monkeypatch):
    """With the environment built, the export is made (here: its worker run fails, and that
    failure is the skip's reason, in one line)."""
    from lab.models import optimum_family

    venv = bare_machine / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / "ort_flash-pinned.json").write_text(json.dumps({"pinned": optimum_family._pinned()}))
    assert optimum_family.venv_ready() and missing_export(FP16) is None
    monkeypatch.setattr(optimum_family, "venv_python", lambda: venv / "bin" / "python")

    def worker_fails(*args, **kwargs):
        raise RuntimeError("optimum_worker.py exited 1: Traceback\nImportError: no torch")

    monkeypatch.setattr(optimum_family.subprocess, "run", worker_fails)
    assert _skip_reason(FP16, "model") == (f"no export of {FP16.id} here: optimum_worker.py exited 1: "
                                           "Traceback ImportError: no torch")
