"""Real exporters: every attention of every model family fused, and the same function after.

For each family × exporter × attn_implementation × dtype of ``lab/models/families.py`` (tiny random
models, exported once into the model cache), with and without a KV cache: every attention
Softmax or ONNX Attention node (self and cross) becomes one FlashAttention node, the causal
self-attentions become ``is_causal`` (no (S × S) mask is left except T5's relative position
bias), a cached step's Concat(past, new) becomes the op's past/present, the model stays valid
with its interface, and ``ort_flash.verify`` on the CPU EP agrees with the original within
tolerance.

One configuration per family × exporter (× cache) runs by default (the whole file stays within a
few minutes with a cold cache on 2 cores); the rest are marked ``slow``. A configuration the
exporter cannot export (recorded by ``lab.models.families``) is skipped with the exporter's message.
"""

from __future__ import annotations

import collections
import os
import sys

import onnx
import pytest

pytest.importorskip("torch", reason="torch builds the model families (test dependency)")
pytest.importorskip("transformers", reason="transformers builds the model families")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))
from lab.models.families import ExportFailure, ExportSpec, export, specs  # noqa: E402
from ort_flash.rewriter import rewrite  # noqa: E402
from ort_flash.verify import verify  # noqa: E402

# (family, exporter) -> (attn, dtype) of the configuration that runs by default.
DEFAULT = {
    ("bert", "torchscript"): ("eager", "float16"), ("bert", "dynamo"): ("sdpa", "float32"),
    ("gpt2", "torchscript"): ("sdpa", "float32"), ("gpt2", "dynamo"): ("eager", "float16"),
    ("llama", "torchscript"): ("eager", "float16"), ("llama", "dynamo"): ("sdpa", "float32"),
    ("qwen2", "torchscript"): ("sdpa", "float16"), ("qwen2", "dynamo"): ("eager", "float32"),
    ("vit", "torchscript"): ("sdpa", "float32"), ("vit", "dynamo"): ("eager", "float16"),
    ("t5", "torchscript"): ("eager", "float32"), ("t5", "dynamo"): ("sdpa", "float32"),
    ("bart", "torchscript"): ("eager", "float32"), ("bart", "dynamo"): ("sdpa", "float32"),
    ("whisper", "torchscript"): ("sdpa", "float32"), ("whisper", "dynamo"): ("eager", "float32"),
    # opset 23: SDPA exported as ONNX Attention
    ("gpt2", "dynamo23"): ("sdpa", "float32"), ("t5", "dynamo23"): ("sdpa", "float32"),
}
# The same for the decoding steps with a KV cache (ExportSpec.cache).
DEFAULT_CACHED = {
    ("gpt2", "torchscript"): ("eager", "float32"), ("gpt2", "dynamo"): ("sdpa", "float16"),
    ("llama", "torchscript"): ("sdpa", "float16"), ("llama", "dynamo"): ("eager", "float32"),
    ("qwen2", "torchscript"): ("eager", "float32"), ("qwen2", "dynamo"): ("sdpa", "float32"),
    ("bart", "torchscript"): ("sdpa", "float32"), ("bart", "dynamo"): ("eager", "float16"),
    ("whisper", "torchscript"): ("eager", "float16"), ("whisper", "dynamo"): ("sdpa", "float32"),
    ("llama", "dynamo23"): ("sdpa", "float16"), ("whisper", "dynamo23"): ("sdpa", "float32"),
}
# Causal self-attention layers per family (decoder self-attention).
CAUSAL = {"bert": 0, "vit": 0, "gpt2": 2, "llama": 2, "qwen2": 2, "t5": 1, "bart": 1, "whisper": 1}
GQA = {"llama": 2, "qwen2": 2}  # kv heads after repeat_kv is absorbed


def _params():
    for spec in specs() + specs(cache=True):
        default = (DEFAULT_CACHED if spec.cache else DEFAULT).get((spec.family, spec.exporter))
        yield pytest.param(spec, id=spec.id,
                           marks=() if default == (spec.attn, spec.dtype) else pytest.mark.slow)


def _attention_nodes(model: onnx.ModelProto) -> int:
    return sum(n.op_type in ("Softmax", "Attention") for n in model.graph.node)


@pytest.fixture(scope="module")
def rewritten():
    cache: dict[ExportSpec, tuple] = {}

    def get(spec: ExportSpec):
        if spec not in cache:
            try:
                model = onnx.load(export(spec))
            except ExportFailure as e:
                pytest.skip(f"the exporter cannot export this configuration: {e}")
            # The fast mask mapping (is_causal + compact masks) is what these tests cover;
            # test_default_rewrite_fuses_too checks the exact default.
            cache[spec] = (model, rewrite(model, exact_masked_rows=False))
        return cache[spec]

    return get


@pytest.mark.parametrize("spec", list(_params()))
def test_every_attention_fused(spec, rewritten):
    model, result = rewritten(spec)
    layers = spec.layers
    report = result.report
    assert _attention_nodes(model) == layers
    assert report.total_fused == layers, report.format_table()
    assert report.unfused == [], report.format_table()
    ops = collections.Counter(n.op_type for n in result.model.graph.node)
    assert ops["FlashAttention"] == layers and ops["Softmax"] == ops["Attention"] == 0
    assert sum(f.causal for f in report.fused) == CAUSAL[spec.family], report.format_table()
    # with a cache, every self-attention (the causal ones) reads past_key/past_value
    assert sum(f.cache == "past/present" for f in report.fused) == (
        CAUSAL[spec.family] if spec.cache else 0), report.format_table()
    # ... and its present_key/present_value outputs are the graph's present outputs
    presents = {o for n in result.model.graph.node if n.op_type == "FlashAttention"
                for o in n.output[1:3]}
    assert sum(o.name in presents for o in result.model.graph.output) == (
        2 * CAUSAL[spec.family] if spec.cache else 0)
    for f in report.fused:
        # a causal or padding mask never stays (B, 1, S, S); T5's position bias is a real bias
        assert f.mask in ("none", "additive (B,1,1,Skv)", "bool (B,1,1,Skv)") or f.mask.startswith(
            "additive bias") and spec.family == "t5", f
        assert f.kv_heads == GQA.get(spec.family, f.heads), f
        # RoPE keeps LLaMA's Q/K in BNSH; a cached self-attention's new K/V are 3-D too (past
        # stays 4-D); a cached cross-attention reads its K/V from 4-D cache inputs, so stays 4-D
        cached_cross = spec.cache and f.cache != "past/present"
        if spec.family not in ("llama", "qwen2") and not cached_cross:
            assert f.layout in ("BSD", "packed", "packed KV"), f
        # packed_qkv: the separate query/key/value projections of an encoder's one input become
        # one MatMul, GPT-2's split of its one projection is read in place; a cache keeps K and V.
        # bias_fold: BERT's and ViT's K bias goes and their V bias moves into the output
        # projection's, the op reading packed KV; not with a bool mask (a row could see no key).
        if spec.family in ("bert", "vit"):
            assert f.layout == ("packed" if f.mask.startswith("bool") else "packed KV"), f
        if spec.family == "gpt2" and not spec.cache:
            assert f.layout == "packed", f
        if spec.cache and f.cache == "past/present":
            assert f.layout not in ("packed", "packed KV"), f


@pytest.mark.parametrize("spec", list(_params()))
def test_valid_and_same_function(spec, rewritten):
    model, result = rewritten(spec)
    onnx.checker.check_model(result.model, full_check=True)
    assert [i.name for i in result.model.graph.input] == [i.name for i in model.graph.input]
    assert [o.name for o in result.model.graph.output] == [o.name for o in model.graph.output]
    assert result.model.ir_version == model.ir_version <= 11
    check = verify(model, result.model, seed=0)
    assert check.passed, check.format_table()


@pytest.mark.parametrize("spec", [s for s in specs() + specs(cache=True) if s.exporter == "torchscript"
                                  and s.dtype == "float32" and s.attn == "eager"
                                  and s.family in ("bert", "gpt2", "llama", "whisper")], ids=lambda s: s.id)
def test_default_rewrite_fuses_too(spec):
    """The default (exact_masked_rows=True) fuses every attention as well and stays the same
    function; finite causal + padding masks then stay materialized."""
    try:
        model = onnx.load(export(spec))
    except ExportFailure as e:
        pytest.skip(f"the exporter cannot export this configuration: {e}")
    result = rewrite(model)
    assert result.report.total_fused == spec.layers, result.report.format_table()
    assert result.report.unfused == []
    assert verify(model, result.model, seed=1).passed


@pytest.mark.gpu
@pytest.mark.parametrize("spec", [s for s in specs() + specs(cache=True) if s.dtype == "float16"],
                         ids=lambda s: s.id)
def test_rewritten_family_on_cuda(spec):
    """Every fp16 export (each family, exporter and attn_implementation; the KV-cache steps with
    past/present on the op; the opset-23 ONNX Attention exports), rewritten both ways, in a CUDA
    session against the original on CUDA. On a GPU machine without this torch/transformers,
    ``ORT_FLASH_MODEL_PREBUILT`` points at the exports CI made (lab.models.families._prebuilt)."""
    _check_on_cuda(spec)


def _check_on_cuda(spec: ExportSpec) -> None:
    try:
        model = onnx.load(export(spec))
    except ExportFailure as e:
        pytest.skip(f"the exporter cannot export this configuration: {e}")
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    for exact in (True, False):
        result = rewrite(model, exact_masked_rows=exact)
        check = verify(model, result.model, providers=providers, seed=2)
        assert check.passed, check.format_table()
        assert check.rewritten_providers[0] == "CUDAExecutionProvider"


@pytest.mark.parametrize("family", ["llama", "bart"])
def test_cached_step_passes_its_past_to_the_model_kv(family):
    """The cached step hands its past to the model under the name this transformers uses
    (``past_key_values`` up to 5.18, ``cache`` later: families.cache_argument), so the presents
    hold past + new positions. Regression: 5.17 put ``cache=`` in **kwargs unread."""
    import torch

    from lab.models.families import PAST_LEN, _build_cached

    module, inputs, _ = _build_cached(ExportSpec(family, "torchscript", "eager", "float32", cache=True))
    with torch.no_grad():
        out = module(*inputs.values())
    seq = inputs["input_ids" if "input_ids" in inputs else "decoder_input_ids"].shape[1]
    assert len(out) == 1 + 2 * module_layers(inputs)
    assert all(t.shape[2] == PAST_LEN + seq for t in out[1:]), [tuple(t.shape) for t in out[1:]]


def module_layers(inputs) -> int:
    return sum(name.startswith("past_key_") for name in inputs)
