"""Small, randomly initialised Hugging Face models of each family, exported to ONNX and cached.

    from models.families import ExportSpec, export
    path = export(ExportSpec("llama", exporter="dynamo", attn="sdpa", dtype="float16"))

Every family is a tiny config (1-2 layers, hidden 64-128, head dim 32, short sequences) built
with ``torch.manual_seed(0)`` and no downloads. ``export`` writes the model once per spec into a
cache folder (``$ORT_FLASH_MODEL_CACHE`` or ``~/.cache/ort_flash/models``) under a name keyed by
the spec, the family's config, the exporter settings and the torch/transformers versions, so
tests and benchmarks reuse it. torch and transformers are imported here only: they are test and
benchmark dependencies, never ``ort_flash``'s.

Exporters: ``"torchscript"`` is ``torch.onnx.export(dynamo=False)`` at opset 17;
``"dynamo"`` is ``torch.onnx.export(dynamo=True)`` at opset 18 (the onnxscript translation;
SDPA is decomposed into MatMul/Softmax below opset 23). Every file gets IR version 10.
Graph inputs: token ids / pixel values / audio features with a dynamic batch (and sequence where
the model allows it), 0/1 ``attention_mask`` inputs where the family takes one, and one output.
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

FAMILIES = ("bert", "gpt2", "llama", "qwen2", "vit", "t5", "bart", "whisper")
EXPORTERS = ("torchscript", "dynamo")
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
DTYPES = ("float32", "float16")
OPSETS = {"torchscript": 17, "dynamo": 18}
IR_VERSION = 10
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


def attention_layers(family: str) -> int:
    """Attention subgraphs in the exported model: self-attention per layer, plus cross-attention
    per decoder layer for encoder-decoder families."""
    c = CONFIGS[family]
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

    def __post_init__(self) -> None:
        for value, allowed in ((self.family, FAMILIES), (self.exporter, EXPORTERS),
                               (self.attn, ATTN_IMPLEMENTATIONS), (self.dtype, DTYPES)):
            if value not in allowed:
                raise ValueError(f"{value!r} is not one of {allowed}")

    @property
    def id(self) -> str:
        return f"{self.family}-{self.exporter}-{self.attn}-{'fp32' if self.dtype == 'float32' else 'fp16'}"


class ExportFailure(RuntimeError):
    """The exporter could not export this spec; the message says where and why."""


def cache_dir() -> pathlib.Path:
    default = pathlib.Path.home() / ".cache" / "ort_flash" / "models"
    return pathlib.Path(os.environ.get("ORT_FLASH_MODEL_CACHE", default))


def cache_key(spec: ExportSpec) -> str:
    import torch
    import transformers

    recipe = dict(spec=dataclasses.asdict(spec), config=CONFIGS[spec.family],
                  opset=OPSETS[spec.exporter], ir=IR_VERSION, revision=REVISIONS.get(spec.family, 1),
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


def _export_proto(spec: ExportSpec) -> onnx.ModelProto:
    import torch

    model, inputs, dynamic = build(spec)
    names = list(inputs)
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if spec.exporter == "torchscript":
                torch.onnx.export(
                    model, tuple(inputs.values()), buffer, dynamo=False,
                    opset_version=OPSETS["torchscript"], input_names=names,
                    output_names=["output"], dynamic_axes={**dynamic, "output": {0: "batch"}},
                    do_constant_folding=True,
                )
                proto = onnx.load_from_string(buffer.getvalue())
            else:
                program = torch.onnx.export(
                    model, tuple(inputs.values()), dynamo=True, opset_version=OPSETS["dynamo"],
                    input_names=names, output_names=["output"],
                    dynamic_shapes=_dynamic_shapes(names, dynamic), optimize=True, verbose=False,
                )
                proto = program.model_proto
        except Exception as e:  # noqa: BLE001 - every exporter error becomes one clear failure
            raise ExportFailure(f"{spec.id}: {type(e).__name__}: {_summary(e)}") from e
    proto.ir_version = IR_VERSION
    proto.producer_name = f"ort_flash/models/families.py ({spec.id})"
    onnx.helper.set_model_props(proto, {"ort_flash.family": json.dumps(
        dict(dataclasses.asdict(spec), attention_layers=attention_layers(spec.family)))})
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        text = " ".join(str(e).split())[:600]
        raise ExportFailure(f"{spec.id}: the exporter wrote an invalid model: {text}") from e
    return proto


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


def _dynamic_shapes(names: list[str], dynamic: dict[str, dict[int, str]]) -> dict:
    from torch.export import Dim

    dims: dict[str, object] = {}
    return tuple({a: dims.setdefault(d, Dim(d, min=1, max=1024) if d == "batch" else
                                     Dim(d, min=2, max=1024))
                  for a, d in dynamic.get(n, {}).items()} or None for n in names)


def build(spec: ExportSpec):
    """(torch module returning one tensor, example inputs by name, dynamic axes by name)."""
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
    dtype = getattr(torch, spec.dtype)
    net = model_cls(config).eval().to(dtype)
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


def load(spec: ExportSpec) -> onnx.ModelProto:
    return onnx.load(export(spec))


def specs() -> list[ExportSpec]:
    return [ExportSpec(f, e, a, d) for f in FAMILIES for e in EXPORTERS
            for a in ATTN_IMPLEMENTATIONS for d in DTYPES]
