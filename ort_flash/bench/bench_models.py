"""Transformer models for the end-to-end benchmark (`ort-flash bench --suite e2e`), exported to ONNX.

Three families at the sizes the benchmark issue names, with random weights (no downloads):

| name         | family | layers | hidden | heads (kv) | head dim | MLP   | vocab  | parameters |
|--------------|--------|--------|--------|------------|----------|-------|--------|------------|
| bert-base    | BERT   | 12     | 768    | 12         | 64       | 3072  | 30522  | ~110 M     |
| gpt2-medium  | GPT-2  | 24     | 1024   | 16         | 64       | 4096  | 50257  | ~355 M     |
| llama-1b     | LLaMA  | 16     | 2048   | 32 (8 GQA) | 64       | 8192  | 32000  | ~1.0 B     |

Each is the base model (hidden states out, no LM head: at 8k tokens a 50k-vocabulary head's
logits would dominate memory and time and say nothing about attention), with
``attn_implementation="eager"`` so the exporter writes attention as MatMul-Softmax-MatMul, exported
by the TorchScript exporter (``torch.onnx.export(..., dynamo=False)``, opset 17) with inputs
``input_ids`` and ``attention_mask`` (int64, dynamic ``batch`` and ``sequence``), output
``last_hidden_state``; IR version 10 (onnxruntime 1.31 loads IR <= 13); weights in external data
beside the model when the file would pass 2 GB.

``cache=True`` (the decoders: GPT-2, LLaMA) exports one decoding step with a KV cache instead,
for ``ort-flash bench --suite decode_e2e``: inputs ``input_ids`` (B, S), ``attention_mask``
(B, "past_sequence + sequence") and per layer ``past_key_i`` / ``past_value_i`` (B, Hkv,
"past_sequence", D) in the model's dtype; outputs ``last_hidden_state`` (B, S, hidden) and
``present_key_i`` / ``present_value_i`` (B, Hkv, "past_sequence + sequence", D). The wrapper
that hands the flat tensors to transformers as a Cache is ``cached_step`` here (``lab/models/families.py``
exports the rewriter's tiny cached family tests through it too).

``layers`` can be cut (``--e2e-layers``) to fit a time budget: per-layer cost and the attention
share of it do not change, so ratios between variants stay meaningful; the result JSON records
the sizes used. Exports are cached on disk, keyed by everything that shapes the file.

torch and transformers are imported inside the functions that need them (benchmark
dependencies, not the package's).

    python -m ort_flash.bench.bench_models --name bert-base --dtype float16 --out /tmp/bert.onnx
    python -m ort_flash.bench.bench_models --name llama-1b --layers 4 --cache --out /tmp/llama-step.onnx
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
import tempfile
import warnings

OPSET = 17
IR_VERSION = 10
SEED = 0
TWO_GB = 2 * 1024**3
# Bump when the cached-step export changes in a way the spec does not show (cached_step).
CACHED_STEP_REVISION = 1


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str  # "bert" | "gpt2" | "llama"
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    max_positions: int = 8192

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def scaled(self, layers: int | None) -> "ModelSpec":
        return self if not layers or layers >= self.layers else dataclasses.replace(self, layers=layers)

    def parameters(self) -> int:
        """Approximate parameter count (attention, MLP, embeddings; norms and biases left out)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = 2 * h * h + 2 * h * kv
        mlp = (3 if self.family == "llama" else 2) * h * self.intermediate
        return self.layers * (attn + mlp) + self.vocab * h


SPECS = {
    "bert-base": ModelSpec("bert-base", "bert", 12, 768, 12, 12, 3072, 30522),
    "gpt2-medium": ModelSpec("gpt2-medium", "gpt2", 24, 1024, 16, 16, 4096, 50257),
    "llama-1b": ModelSpec("llama-1b", "llama", 16, 2048, 32, 8, 8192, 32000),
}


def _config(spec: ModelSpec):
    import transformers

    common = dict(attn_implementation="eager")
    if spec.family == "bert":
        return transformers.BertConfig(
            vocab_size=spec.vocab, hidden_size=spec.hidden, num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads, intermediate_size=spec.intermediate,
            max_position_embeddings=spec.max_positions, **common)
    if spec.family == "gpt2":
        return transformers.GPT2Config(
            vocab_size=spec.vocab, n_embd=spec.hidden, n_layer=spec.layers, n_head=spec.heads,
            n_inner=spec.intermediate, n_positions=spec.max_positions, bos_token_id=0,
            eos_token_id=0, **common)
    if spec.family == "llama":
        return transformers.LlamaConfig(
            vocab_size=spec.vocab, hidden_size=spec.hidden, num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
            intermediate_size=spec.intermediate, max_position_embeddings=spec.max_positions,
            head_dim=spec.head_dim, bos_token_id=0, eos_token_id=0, pad_token_id=0, **common)
    raise ValueError(f"unknown family {spec.family!r}")


def _base_model(spec: ModelSpec):
    """The transformers base model (no head) with random weights (seeded), in float32."""
    import torch
    import transformers

    torch.manual_seed(SEED)
    if spec.family == "bert":
        model = transformers.BertModel(_config(spec), add_pooling_layer=False)
    else:
        cls = {"gpt2": transformers.GPT2Model, "llama": transformers.LlamaModel}[spec.family]
        model = cls(_config(spec))
    # transformers initializes biases to zero; a trained checkpoint's are not, and a rewrite may
    # not profit from zeros (an Add of zeros it could drop): random biases, as trained ones.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.02)
    return model


def build_torch_model(spec: ModelSpec, dtype: str = "float16", device: str = "cpu"):
    """The transformers base model with random weights (seeded), eval mode, hidden states out."""
    import torch

    class HiddenStatesOnly(torch.nn.Module):
        def __init__(self, inner, extra):
            super().__init__()
            self.inner, self.extra = inner, extra

        def forward(self, input_ids, attention_mask):
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask, **self.extra)
            return out.last_hidden_state

    extra = {} if spec.family == "bert" else {"use_cache": False}
    model = HiddenStatesOnly(_base_model(spec).eval(), extra)
    return model.to(device=device, dtype=getattr(torch, dtype)).eval()


def build_cached_step(spec: ModelSpec, dtype: str = "float16", device: str = "cpu"):
    """(module, example inputs by name, dynamic axes by name, output names) of one decoding step
    of the base model with a KV cache (module docstring), through cached_step."""
    import torch

    if spec.family not in ("gpt2", "llama"):
        raise ValueError(f"{spec.name}: no cached decoding step for the {spec.family} family")
    torch_dtype = getattr(torch, dtype)
    inner = _base_model(spec).eval().to(device=device, dtype=torch_dtype)
    module, inputs, dynamic = cached_step(inner, inner.config, spec.layers, torch_dtype,
                                          output="last_hidden_state")
    outputs = {"last_hidden_state": dynamic["input_ids"], **present_axes(dynamic, spec.layers)}
    return module, {k: v.to(device) for k, v in inputs.items()}, {**dynamic, **outputs}, list(outputs)


PAST = "past_sequence"  # the cache's length P in the dynamic axes ("past_sequence + sequence")
PAST_LEN = 3  # P of the example inputs the exporters trace with


def cached_step(net, config, layers: int, dtype, *, output: str | None = None):
    """(module, example inputs by name, dynamic axes by name) of one decoding step of ``net``
    (a transformers model of ``config``, ``layers`` layers, weights in ``dtype``) with a KV
    cache, wrapped so the export has flat tensors:

    - gpt2, llama, qwen2: (input_ids (B, S), attention_mask (B, P + S), past_key_i,
      past_value_i (B, Hkv, P, D) per layer) -> (logits, present_key_i, present_value_i);
    - bart, whisper: the decoder alone: (decoder_input_ids (B, S), [whisper:
      decoder_attention_mask (B, P + S)], encoder_hidden_states (B, E, d), [bart:
      encoder_attention_mask (B, E)], past self-attention key/value_i (B, H, P, D), past
      cross-attention key/value_i (B, H, E, D)) -> (last_hidden_state, present self-attention
      key/value_i). The cross-attention reads its cached K/V (as a decoding step after the
      first does); they are inputs only, the step does not change them.

    The model gets its cache as a transformers Cache object built from the flat tensors
    (DynamicCache, EncoderDecoderCache for the decoders) and returns the updated one.
    ``output`` names the model output returned first (default: logits, last_hidden_state for
    the decoders); ``build_cached_step`` exports its base LLaMA model's step through here with
    "last_hidden_state". Example sizes: B 2, S 4, P ``PAST_LEN``; the dims are dynamic.
    """
    import torch

    family = config.model_type
    batch, seq, past, enc = 2, 4, PAST_LEN, 6
    heads = getattr(config, "num_key_value_heads", None) or getattr(
        config, "n_head", None) or config.decoder_attention_heads
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or config.d_model
    head_dim = hidden // (getattr(config, "num_attention_heads", None) or getattr(
        config, "n_head", None) or config.decoder_attention_heads)
    ids = torch.randint(1, config.vocab_size, (batch, seq))
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    mask[1, -1:] = 0
    cache = lambda n: torch.randn(batch, heads, n, head_dim, dtype=dtype)  # noqa: E731
    step = {0: "batch", 1: "sequence"}
    total = {0: "batch", 1: f"{PAST} + sequence"}
    past_axes = {0: "batch", 2: PAST}
    inputs: dict[str, torch.Tensor] = {}
    dynamic: dict[str, dict[int, str]] = {}
    if family in ("gpt2", "llama", "qwen2"):
        inputs.update(input_ids=ids, attention_mask=mask)
        dynamic.update(input_ids=step, attention_mask=total)
    else:
        inputs["decoder_input_ids"] = ids
        dynamic["decoder_input_ids"] = step
        if family == "whisper":  # see build(): without it, aten::diff (TorchScript fails)
            inputs["decoder_attention_mask"] = mask
            dynamic["decoder_attention_mask"] = total
        inputs["encoder_hidden_states"] = torch.randn(batch, enc, hidden, dtype=dtype)
        dynamic["encoder_hidden_states"] = {0: "batch", 1: "encoder_sequence"}
        if family == "bart":
            enc_mask = torch.ones(batch, enc, dtype=torch.int64)
            enc_mask[1, -2:] = 0
            inputs["encoder_attention_mask"] = enc_mask
            dynamic["encoder_attention_mask"] = {0: "batch", 1: "encoder_sequence"}
    for i in range(layers):
        for kv in ("key", "value"):
            inputs[f"past_{kv}_{i}"] = cache(past)
            dynamic[f"past_{kv}_{i}"] = past_axes
    if family in ("bart", "whisper"):
        for i in range(layers):
            for kv in ("key", "value"):
                inputs[f"past_cross_{kv}_{i}"] = cache(enc)
                dynamic[f"past_cross_{kv}_{i}"] = {0: "batch", 2: "encoder_sequence"}
    return _CachedStep(net, tuple(inputs), layers, output), inputs, dynamic


def present_axes(dynamic: dict[str, dict[int, str]], layers: int) -> dict[str, dict[int, str]]:
    """The cached step's present_key_i / present_value_i outputs, in output order, with their
    dynamic axes (batch, ·, "past_sequence + sequence", ·); empty for ``layers`` 0 (an uncached
    export, which may have no token input at all: ViT's pixel_values)."""
    if layers == 0:
        return {}
    new = dynamic["input_ids" if "input_ids" in dynamic else "decoder_input_ids"][1]
    return {f"present_{kv}_{i}": {0: "batch", 2: f"{PAST} + {new}"}
            for i in range(layers) for kv in ("key", "value")}


def cache_argument(module) -> str:
    """The name of ``module``'s (a transformers model's) Cache: its forward argument and the
    field of its output that returns the updated one.

    transformers renamed both from ``past_key_values`` to ``cache``: 5.17 and 5.18 know only
    ``past_key_values`` (and put an unknown ``cache=`` in ``**kwargs`` without a word, so the
    step would run without its past), 5.24 has ``cache`` and keeps ``past_key_values`` as a
    deprecated alias (a warning; removal planned for 5.40). Hence the name from the signature.
    """
    import inspect

    params = inspect.signature(module.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise TypeError(f"{type(module).__name__}.forward takes neither cache nor past_key_values")


class _CachedStep:
    """Calls the model (or its decoder) with a Cache built from flat past tensors and returns
    (output, present_key_0, present_value_0, ...)."""

    def __new__(cls, net, names: tuple[str, ...], layers: int, output: str | None = None):
        import torch
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        decoder = net.config.model_type in ("bart", "whisper")
        module = net.get_decoder() if decoder else net
        key = cache_argument(module)

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.net = module

            def forward(self, *args):
                named = dict(zip(names, args))
                pasts = [(named.pop(f"past_key_{i}"), named.pop(f"past_value_{i}"))
                         for i in range(layers)]
                cache = DynamicCache(pasts)
                if decoder:
                    cross = DynamicCache([(named.pop(f"past_cross_key_{i}"),
                                           named.pop(f"past_cross_value_{i}")) for i in range(layers)])
                    cache = EncoderDecoderCache(cache, cross)
                    named = {k.removeprefix("decoder_"): v for k, v in named.items()}
                out = self.net(**named, **{key: cache}, use_cache=True, return_dict=True)
                cache = getattr(out, key)
                cache = cache.self_attention_cache if decoder else cache
                first = getattr(out, output or ("last_hidden_state" if decoder else "logits"))
                flat = [t for layer in cache.layers for t in (layer.keys, layer.values)]
                return (first, *flat)

        return Wrapped().eval()


def cache_key(spec: ModelSpec, dtype: str, cache: bool = False) -> str:
    import torch
    import transformers

    recipe = [dataclasses.asdict(spec), dtype, OPSET, IR_VERSION, SEED, torch.__version__,
              transformers.__version__, {"biases": "random"}]
    if cache:  # the uncached exports keep the keys they had before cached steps existed
        recipe.append({"cache": True, "revision": CACHED_STEP_REVISION})
    blob = json.dumps(recipe, sort_keys=True)
    kv = "-kv" if cache else ""
    return f"{spec.name}-L{spec.layers}-{dtype}{kv}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def export(spec: ModelSpec, path: str | os.PathLike, dtype: str = "float16", device: str = "cpu",
           *, cache: bool = False) -> pathlib.Path:
    """Exports the model (``cache``: one decoding step with a KV cache) to ``path`` (external
    data ``<name>.data`` beside it when > 2 GB)."""
    import onnx
    import torch

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if cache:
        model, inputs, dynamic_axes, output_names = build_cached_step(spec, dtype, device)
    else:
        model = build_torch_model(spec, dtype, device)
        ids = torch.randint(1, spec.vocab, (2, 16), dtype=torch.int64, device=device)
        mask = torch.ones(2, 16, dtype=torch.int64, device=device)
        mask[1, 12:] = 0
        inputs = {"input_ids": ids, "attention_mask": mask}
        output_names = ["last_hidden_state"]
        dynamic_axes = {"input_ids": {0: "batch", 1: "sequence"},
                        "attention_mask": {0: "batch", 1: "sequence"},
                        "last_hidden_state": {0: "batch", 1: "sequence"}}
    with tempfile.TemporaryDirectory(dir=path.parent) as tmpdir:
        tmp = pathlib.Path(tmpdir) / "export.onnx"  # large exports scatter weights beside it
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings about masks traced as constants
            torch.onnx.export(
                model, tuple(inputs.values()), str(tmp), dynamo=False, opset_version=OPSET,
                input_names=list(inputs), output_names=output_names, dynamic_axes=dynamic_axes,
                do_constant_folding=True)
        proto = onnx.load(str(tmp))  # pulls in any external data the exporter wrote
    proto.ir_version = IR_VERSION  # producer stays "pytorch": ORT's optimizer checks it
    props = dict(dataclasses.asdict(spec), **({"cache": True} if cache else {}))
    onnx.helper.set_model_props(proto, {"ort_flash.bench.model": json.dumps(props)})
    save(proto, path)
    return path


def save(proto, path: str | os.PathLike) -> pathlib.Path:
    """Saves with external data (one ``.data`` file) when the model would pass 2 GB."""
    import onnx

    path = pathlib.Path(path)
    weights = sum(len(t.raw_data) for t in proto.graph.initializer)
    if weights > TWO_GB - 64 * 1024**2:
        data = path.name + ".data"
        (path.parent / data).unlink(missing_ok=True)
        onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data, size_threshold=1024)
    else:
        onnx.save_model(proto, str(path))
    return path


def cached_export(spec: ModelSpec, cache_dir: str | os.PathLike, dtype: str = "float16",
                  device: str = "cpu", *, cache: bool = False) -> tuple[pathlib.Path, bool]:
    """(path, was_cached): the export of ``spec`` (``cache``: its decoding step) under
    ``cache_dir``, made if missing."""
    path = pathlib.Path(cache_dir) / cache_key(spec, dtype, cache) / "model.onnx"
    if path.is_file():
        return path, True
    return export(spec, path, dtype, device, cache=cache), False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", choices=sorted(SPECS), required=True)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--dtype", choices=("float16", "float32"), default="float16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cache", action="store_true", help="one decoding step with a KV cache (gpt2, llama)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    spec = SPECS[args.name].scaled(args.layers)
    path = export(spec, args.out, args.dtype, args.device, cache=args.cache)
    print(f"wrote {path} ({spec.parameters() / 1e6:.0f} M parameters)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
