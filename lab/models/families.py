"""Small, randomly initialised Hugging Face models of each family, exported to ONNX and cached.

    from lab.models.families import ExportSpec, export
    path = export(ExportSpec("llama", exporter="dynamo", attn="sdpa", dtype="float16"))

Every family is a tiny config (1-2 layers, hidden 64-128, head dim 32, short sequences) built
with ``torch.manual_seed(0)`` and no downloads. ``export`` writes the model once per spec into a
cache folder (``$ORT_FLASH_MODEL_CACHE`` or ``~/.cache/ort_flash/models``) under a name keyed by
the spec, the family's config, the exporter settings and the torch/transformers versions, so
tests and benchmarks reuse it. torch and transformers are imported here only: they are test and
benchmark dependencies, never ``ort_flash``'s.

Exporters: ``"torchscript"`` is ``torch.onnx.export(dynamo=False)`` at opset 17;
``"dynamo"`` is ``torch.onnx.export(dynamo=True)`` at opset 18 (the onnxscript translation;
SDPA is decomposed into MatMul/Softmax below opset 23); ``"dynamo23"`` is the same at opset 23,
where SDPA becomes one ONNX ``Attention`` node. Every file gets IR version 10 (11 at opset 23).
Graph inputs: token ids / pixel values / audio features with a dynamic batch (and sequence where
the model allows it), 0/1 ``attention_mask`` inputs where the family takes one, and one output.
``ExportSpec(..., cache=True)`` (GPT-2, LLaMA, Qwen2, and the BART and Whisper decoders) is one
decoding step with a KV cache instead: flat ``past_key_i`` / ``past_value_i`` inputs
(B, Hkv, past_sequence, D), an ``attention_mask`` of length "past_sequence + sequence", and
``present_key_i`` / ``present_value_i`` outputs after the first (see ``cached_step``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pathlib
import re
import warnings

import onnx

# The cached decoding step is the e2e benchmark's too: it lives in the package, which cannot
# import lab/models/.
from ort_flash.bench.bench_models import PAST_LEN, cache_argument, cached_step, present_axes  # noqa: F401

FAMILIES = ("bert", "gpt2", "llama", "qwen2", "vit", "t5", "bart", "whisper")
# Families also exported as one decoding step with a KV cache (ExportSpec.cache).
CACHE_FAMILIES = ("gpt2", "llama", "qwen2", "bart", "whisper")
EXPORTERS = ("torchscript", "dynamo", "dynamo23")
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
DTYPES = ("float32", "float16")
OPSETS = {"torchscript": 17, "dynamo": 18, "dynamo23": 23}
IR_VERSION = 10
IR_VERSIONS = {"dynamo23": 11}  # opset 23 needs IR version 11
# Bump a family's revision when its builder changes in a way its config does not show.
REVISIONS = {"whisper": 2}
SEED = 0

# Per family: the transformers config class, its arguments, the model class, and how many
# attention layers (self + cross) the exported graph holds.
CONFIGS: dict[str, dict] = {
    "bert": dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=128, max_position_embeddings=64),
    "gpt2": dict(vocab_size=128, n_embd=64, n_layer=2, n_head=2, n_positions=64,
                 bos_token_id=0, eos_token_id=0),
    "llama": dict(vocab_size=128, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=256, max_position_embeddings=128),
    "qwen2": dict(vocab_size=128, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=256, max_position_embeddings=128),
    "vit": dict(image_size=32, patch_size=8, num_channels=3, hidden_size=64,
                num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
    "t5": dict(vocab_size=128, d_model=64, d_kv=32, d_ff=128, num_layers=1,
               num_decoder_layers=1, num_heads=2, relative_attention_num_buckets=8,
               decoder_start_token_id=0, pad_token_id=0),
    "bart": dict(vocab_size=128, d_model=64, encoder_layers=1, decoder_layers=1,
                 encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128,
                 decoder_ffn_dim=128, max_position_embeddings=64),
    "whisper": dict(vocab_size=128, num_mel_bins=16, d_model=64, encoder_layers=1,
                    decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                    encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=16,
                    max_target_positions=64, decoder_start_token_id=0, pad_token_id=0),
}


def attention_layers(family: str, cache: bool = False) -> int:
    """Attention subgraphs in the exported model: self-attention per layer, plus cross-attention
    per decoder layer for encoder-decoder families (only the decoder's for a cached step)."""
    c = CONFIGS[family]
    if cache and family in ("bart", "whisper"):
        return 2 * c["decoder_layers"]
    if family in ("bert", "llama", "qwen2", "vit"):
        return c["num_hidden_layers"]
    if family == "gpt2":
        return c["n_layer"]
    if family == "t5":
        return c["num_layers"] + 2 * c["num_decoder_layers"]
    return c["encoder_layers"] + 2 * c["decoder_layers"]


@dataclasses.dataclass(frozen=True)
class ExportSpec:
    family: str
    exporter: str = "torchscript"
    attn: str = "eager"
    dtype: str = "float32"
    # One decoding step with a KV cache: flat past_key_i / past_value_i inputs (B, Hkv, P, D),
    # present_key_i / present_value_i outputs (B, Hkv, P + S, D); see ``build``.
    cache: bool = False

    def __post_init__(self) -> None:
        for value, allowed in ((self.family, FAMILIES), (self.exporter, EXPORTERS),
                               (self.attn, ATTN_IMPLEMENTATIONS), (self.dtype, DTYPES)):
            if value not in allowed:
                raise ValueError(f"{value!r} is not one of {allowed}")
        if self.cache and self.family not in CACHE_FAMILIES:
            raise ValueError(f"{self.family!r} has no cached export (one of {CACHE_FAMILIES})")

    @property
    def id(self) -> str:
        kv = "-kv" if self.cache else ""
        return f"{self.family}{kv}-{self.exporter}-{self.attn}-{'fp32' if self.dtype == 'float32' else 'fp16'}"

    @property
    def layers(self) -> int:
        return attention_layers(self.family, self.cache)


class ExportFailure(RuntimeError):
    """The exporter could not export this spec; the message says where and why."""


def cache_dir() -> pathlib.Path:
    default = pathlib.Path.home() / ".cache" / "ort_flash" / "models"
    return pathlib.Path(os.environ.get("ORT_FLASH_MODEL_CACHE", default))


def cache_key(spec: ExportSpec) -> str:
    import torch
    import transformers

    fields = dataclasses.asdict(spec)
    if not spec.cache:
        del fields["cache"]  # the uncached specs keep the keys they had before caches existed
    recipe = dict(spec=fields, config=CONFIGS[spec.family],
                  opset=OPSETS[spec.exporter], ir=IR_VERSIONS.get(spec.exporter, IR_VERSION), revision=REVISIONS.get(spec.family, 1),
                  seed=SEED, torch=torch.__version__, transformers=transformers.__version__)
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return f"{spec.id}-{digest}"


def export(spec: ExportSpec, *, refresh: bool = False) -> pathlib.Path:
    """The path of ``spec``'s ONNX model, exporting it first unless the cache holds it.

    Raises ExportFailure (also cached, as a ``.failed`` file with the message) when the
    exporter cannot export the spec, so a failure is not retried on every run."""
    folder = cache_dir()
    key = cache_key(spec)
    path, failed = folder / f"{key}.onnx", folder / f"{key}.failed"
    if not refresh and path.exists():
        return path
    if not refresh and failed.exists():
        raise ExportFailure(failed.read_text(encoding="utf-8").strip())
    prebuilt = _prebuilt(spec)
    if not refresh and prebuilt is not None:
        if prebuilt.suffix == ".failed":
            raise ExportFailure(prebuilt.read_text(encoding="utf-8").strip())
        return prebuilt
    folder.mkdir(parents=True, exist_ok=True)
    try:
        proto = _export_proto(spec)
    except ExportFailure as e:
        failed.write_text(str(e) + "\n", encoding="utf-8")
        raise
    tmp = folder / f".{key}.{os.getpid()}.tmp"
    onnx.save_model(proto, tmp)
    os.replace(tmp, path)
    return path


def _prebuilt(spec: ExportSpec) -> pathlib.Path | None:
    """An export of ``spec`` made elsewhere (another torch / transformers), from the folder named
    by ``$ORT_FLASH_MODEL_PREBUILT``: lets a GPU machine verify exactly the files CI exported
    (the newest one if several). None when unset or absent."""
    folder = os.environ.get("ORT_FLASH_MODEL_PREBUILT")
    if not folder or not pathlib.Path(folder).is_dir():
        return None
    pattern = re.compile(rf"{re.escape(spec.id)}-[0-9a-f]{{12}}\.(onnx|failed)")
    found = [p for p in pathlib.Path(folder).iterdir() if pattern.fullmatch(p.name)]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def _export_proto(spec: ExportSpec) -> onnx.ModelProto:
    import torch

    model, inputs, dynamic = build(spec)
    names = list(inputs)
    output_axes = {"output": {0: "batch"}, **present_axes(dynamic, _cache_layers(spec))}
    outputs = list(output_axes)
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if spec.exporter == "torchscript":
                torch.onnx.export(
                    model, tuple(inputs.values()), buffer, dynamo=False,
                    opset_version=OPSETS["torchscript"], input_names=names,
                    output_names=outputs, dynamic_axes={**dynamic, **output_axes},
                    do_constant_folding=True,
                )
                proto = onnx.load_from_string(buffer.getvalue())
            else:
                program = torch.onnx.export(
                    model, tuple(inputs.values()), dynamo=True, opset_version=OPSETS[spec.exporter],
                    input_names=names, output_names=outputs,
                    dynamic_shapes=_dynamic_shapes(names, dynamic, varargs=spec.cache),
                    optimize=True, verbose=False,
                )
                proto = program.model_proto
                if spec.cache:
                    _name_total_length(proto, dynamic)
        except Exception as e:  # noqa: BLE001 - every exporter error becomes one clear failure
            raise ExportFailure(f"{spec.id}: {type(e).__name__}: {_summary(e)}") from e
    proto.ir_version = IR_VERSIONS.get(spec.exporter, IR_VERSION)
    proto.producer_name = f"ort_flash/models/families.py ({spec.id})"
    onnx.helper.set_model_props(proto, {"ort_flash.family": json.dumps(
        dict(dataclasses.asdict(spec), attention_layers=spec.layers))})
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        text = " ".join(str(e).split())[:600]
        raise ExportFailure(f"{spec.id}: the exporter wrote an invalid model: {text}") from e
    _check_runs(spec, proto, inputs)
    return proto


def _check_runs(spec: ExportSpec, proto: onnx.ModelProto, inputs: dict) -> None:
    """ONNX Runtime (CPU, no graph optimizations) runs the export on the traced inputs (those it
    kept: the TorchScript exporter drops unused ones, such as a cached Whisper step's
    encoder_hidden_states)."""
    import onnxruntime as ort

    kept = {i.name for i in proto.graph.input}

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(proto.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        session.run(None, {k: v.numpy() for k, v in inputs.items() if k in kept})
    except Exception as e:  # noqa: BLE001 - onnxruntime's errors have no common base class
        text = " ".join(str(e).split())[:600]
        raise ExportFailure(f"{spec.id}: ONNX Runtime cannot run the exported model: {text}") from e


def _name_total_length(proto: onnx.ModelProto, dynamic: dict[str, dict[int, str]]) -> None:
    """Name the cached step's attention-mask length "past_sequence + sequence" in the dynamo
    export, as the TorchScript export's dynamic_axes name it. torch.export cannot state it (a
    derived Dim is a function of one dim), so it exports the length as a symbol of its own
    ("s81"); the model is only defined where it equals past + new (the mask and the
    concatenated keys are added together), and naming it so is the contract of the input."""
    renames = {}
    for value in proto.graph.input:
        for axis, name in dynamic.get(value.name, {}).items():
            dim = value.type.tensor_type.shape.dim[axis]
            if "+" in name and dim.dim_param and dim.dim_param != name:
                renames[dim.dim_param] = name
    if not renames:
        return
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, renames)) + r")\b")
    for value in (*proto.graph.input, *proto.graph.output, *proto.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in renames:
                dim.dim_param = renames[dim.dim_param]
            elif dim.dim_param and pattern.search(dim.dim_param):
                dim.dim_param = pattern.sub(lambda m: f"({renames[m.group(1)]})", dim.dim_param)


def _summary(error: Exception) -> str:
    """The exporter's message without its generic advice or terminal colours, on one line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    if "## Exception summary" in text:
        text = text.split("## Exception summary", 1)[1]
    text = " ".join(text.split())
    cause = error.__cause__
    while cause is not None and "## Exception summary" not in text:
        text += f" (caused by {type(cause).__name__}: {' '.join(str(cause).split())[:300]})"
        cause = cause.__cause__
    return text[:700]


def _dynamic_shapes(names: list[str], dynamic: dict[str, dict[int, str]], *,
                    varargs: bool = False) -> tuple:
    """torch.export's dims for the TorchScript-style dynamic axes; an axis named "a + b" (the
    attention mask of a cached step: past + new) is left to export to derive (Dim.AUTO).
    ``varargs``: the module's forward takes ``*args`` (one argument holding them all)."""
    from torch.export import Dim

    dims: dict[str, object] = {}

    def dim(name: str):
        if "+" in name:
            return Dim.AUTO
        return dims.setdefault(name, Dim(name, min=1, max=1024) if name == "batch" else
                               Dim(name, min=2, max=1024))

    shapes = tuple({a: dim(d) for a, d in dynamic.get(n, {}).items()} or None for n in names)
    return (shapes,) if varargs else shapes


def build(spec: ExportSpec):
    """(torch module returning one tensor, example inputs by name, dynamic axes by name)."""
    import torch

    if spec.cache:
        return _build_cached(spec)
    config, net = _random_model(spec)
    dtype = getattr(torch, spec.dtype)
    batch, seq = 2, 8
    ids = torch.randint(1, config.vocab_size if hasattr(config, "vocab_size") else 2, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[1, 6:] = 0
    text = {"batch": "batch", "seq": "sequence"}
    tokens = {0: text["batch"], 1: text["seq"]}
    if spec.family in ("bert", "gpt2", "llama", "qwen2"):
        return (_Wrapper(net, ("input_ids", "attention_mask"), "logits" if spec.family != "bert"
                         else "last_hidden_state"),
                {"input_ids": ids, "attention_mask": mask},
                {"input_ids": tokens, "attention_mask": tokens})
    if spec.family == "vit":
        pixels = torch.randn(batch, 3, config.image_size, config.image_size, dtype=dtype)
        return (_Wrapper(net, ("pixel_values",), "last_hidden_state"),
                {"pixel_values": pixels}, {"pixel_values": {0: "batch"}})
    decoder_ids = torch.randint(1, config.vocab_size, (batch, 5))
    dec = {0: "batch", 1: "decoder_sequence"}
    if spec.family == "whisper":
        # decoder_attention_mask is given: without it transformers derives packed-sequence
        # masks from position ids (aten::diff, which the TorchScript exporter cannot export).
        frames = 2 * config.max_source_positions
        features = torch.randn(batch, config.num_mel_bins, frames, dtype=dtype)
        decoder_mask = torch.ones_like(decoder_ids)
        decoder_mask[1, 4:] = 0
        names = ("input_features", "decoder_input_ids", "decoder_attention_mask")
        return (_Wrapper(net, names, "last_hidden_state"),
                {"input_features": features, "decoder_input_ids": decoder_ids,
                 "decoder_attention_mask": decoder_mask},
                {"input_features": {0: "batch"}, "decoder_input_ids": dec,
                 "decoder_attention_mask": dec})
    return (_Wrapper(net, ("input_ids", "attention_mask", "decoder_input_ids"), "last_hidden_state"),
            {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": decoder_ids},
            {"input_ids": tokens, "attention_mask": tokens, "decoder_input_ids": dec})


class _Wrapper:
    """Calls the model with keyword inputs, no cache, and returns one output tensor."""

    def __new__(cls, net, names: tuple[str, ...], output: str):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.net = net

            def forward(self, x0, x1=None, x2=None):
                args = (x0, x1, x2)[: len(names)]
                extra = {} if net.config.model_type in ("bert", "vit") else {"use_cache": False}
                out = self.net(**dict(zip(names, args)), **extra, return_dict=True)
                return getattr(out, output)

        return Wrapped().eval()


def _random_model(spec: ExportSpec):
    """(config, model) of ``spec``'s family: the tiny configuration, seeded random weights, in
    ``spec.dtype``, eval mode."""
    import torch
    import transformers as tf

    torch.manual_seed(SEED)
    config_cls, model_cls = {
        "bert": (tf.BertConfig, tf.BertModel), "gpt2": (tf.GPT2Config, tf.GPT2LMHeadModel),
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM), "vit": (tf.ViTConfig, tf.ViTModel),
        "t5": (tf.T5Config, tf.T5Model), "bart": (tf.BartConfig, tf.BartModel),
        "whisper": (tf.WhisperConfig, tf.WhisperModel),
    }[spec.family]
    config = config_cls(**CONFIGS[spec.family], attn_implementation=spec.attn)
    return config, model_cls(config).eval().to(getattr(torch, spec.dtype))


def _cache_layers(spec: ExportSpec) -> int:
    if not spec.cache:
        return 0
    c = CONFIGS[spec.family]
    return c.get("n_layer") or c.get("num_hidden_layers") or c["decoder_layers"]


def _build_cached(spec: ExportSpec):
    """One decoding step of ``spec``'s tiny model with a KV cache (see ``cached_step``)."""
    import torch

    config, net = _random_model(spec)
    return cached_step(net, config, _cache_layers(spec), getattr(torch, spec.dtype))


def load(spec: ExportSpec) -> onnx.ModelProto:
    return onnx.load(export(spec))


def specs(*, cache: bool = False) -> list[ExportSpec]:
    """Every configuration without a cache, or (cache=True) every cached one. The opset-23
    dynamo export only with ``sdpa`` (which it writes as ONNX Attention; eager attention
    exports the same MatMul/Softmax graph as at opset 18)."""
    return [ExportSpec(f, e, a, d, cache=cache) for f in (CACHE_FAMILIES if cache else FAMILIES)
            for e in EXPORTERS for a in ATTN_IMPLEMENTATIONS for d in DTYPES
            if e != "dynamo23" or a == "sdpa"]
