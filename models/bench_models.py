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
that hands the flat tensors to transformers as a Cache is ``models/families.py``'s
``cached_step`` (the rewriter's family tests export their tiny cached steps through it too).

``layers`` can be cut (``--e2e-layers``) to fit a time budget: per-layer cost and the attention
share of it do not change, so ratios between variants stay meaningful; the result JSON records
the sizes used. Exports are cached on disk, keyed by everything that shapes the file.

    python models/bench_models.py --name bert-base --dtype float16 --out /tmp/bert.onnx
    python models/bench_models.py --name llama-1b --layers 4 --cache --out /tmp/llama-step.onnx
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
import sys
import tempfile
import warnings

OPSET = 17
IR_VERSION = 10
SEED = 0
TWO_GB = 2 * 1024**3
# Bump when the cached-step export changes in a way the spec does not show (families.cached_step).
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


def _families():
    """models/families.py beside this file (its ``cached_step`` wraps a model for a cached export)."""
    root = str(pathlib.Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from models import families

    return families


def build_cached_step(spec: ModelSpec, dtype: str = "float16", device: str = "cpu"):
    """(module, example inputs by name, dynamic axes by name, output names) of one decoding step
    of the base model with a KV cache (module docstring), through families.cached_step."""
    import torch

    if spec.family not in ("gpt2", "llama"):
        raise ValueError(f"{spec.name}: no cached decoding step for the {spec.family} family")
    families = _families()
    torch_dtype = getattr(torch, dtype)
    inner = _base_model(spec).eval().to(device=device, dtype=torch_dtype)
    module, inputs, dynamic = families.cached_step(inner, inner.config, spec.layers, torch_dtype,
                                                   output="last_hidden_state")
    outputs = {"last_hidden_state": dynamic["input_ids"], **families.present_axes(dynamic, spec.layers)}
    return module, {k: v.to(device) for k, v in inputs.items()}, {**dynamic, **outputs}, list(outputs)


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
