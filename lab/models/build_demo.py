"""Build the small GPT-2 models bundled with ort_flash for the demo and the tests.

How the bundled files were made (run from the repository root):

    . .venv/bin/activate
    pip install torch==2.13.0 transformers      # build-time only; torch 2.13.0+cpu
    python lab/models/build_demo.py                 # writes ort_flash/data/gpt2_tiny*.onnx

Recipe, so the files can be reproduced bit for bit on the same versions:

- transformers ``GPT2LMHeadModel`` from ``GPT2Config(vocab_size=512, n_positions=2048,
  n_embd=128, n_head=2, n_layer=2, bos/eos 0)``: head dim 64 (the GPU kernels cover 64 and
  128), sequences up to 2048 (the CUDA demo times 2048), and a 512-token vocabulary so the
  two files stay under 5 MB together (the exporter stores the tied LM head twice),
  ``attn_implementation="eager"``, random weights after ``torch.manual_seed(0)``, eval mode,
  no downloads from any hub, no KV cache (``use_cache=False``).
- Exported with the TorchScript exporter, ``torch.onnx.export(..., dynamo=False)``,
  opset 17, inputs ``input_ids`` and ``attention_mask`` (int64, dynamic ``batch`` and
  ``sequence`` axes), output ``logits`` (dynamic ``batch`` and ``sequence``).
- ``gpt2_tiny.onnx`` is fp32 (for the CPU EP); ``gpt2_tiny_fp16.onnx`` is the same weights
  after ``model.half()``, exported on the CPU (for the CUDA EP).
- ``ir_version`` is set to 10 (onnxruntime 1.31 loads IR <= 13); weights are stored inside
  the file (no external data); the config is stored as JSON in the model's metadata under
  ``ort_flash.demo.gpt2_config``.

Each attention layer is exported as the unfused subgraph
MatMul(Q, Transpose(K, perm=[0,2,3,1])) -> Mul(0.125) -> Add(additive causal+padding mask)
-> Softmax -> Cast(no-op) -> MatMul(V), which ``ort_flash.rewriter`` fuses into
``ort_flash.FlashAttention``. The exporter warns that masking_utils' padding check is traced as
a constant and about aten::index; after writing, the script checks the ONNX model in ONNX
Runtime against torch at other batch/sequence sizes (padded rows included), so the dynamic axes
are known to be right.
"""

from __future__ import annotations

import argparse
import io
import json
import pathlib

import onnx
import torch
import transformers

DATA_DIR = pathlib.Path(__file__).resolve().parents[2] / "ort_flash" / "data"
CONFIG = dict(vocab_size=512, n_positions=2048, n_embd=128, n_head=2, n_layer=2,
              bos_token_id=0, eos_token_id=0)
METADATA_KEY = "ort_flash.demo.gpt2_config"  # CONFIG as JSON, so tests need not import torch
OPSET = 17
IR_VERSION = 10
SEED = 0


class _LogitsOnly(torch.nn.Module):
    """Wraps the LM so the exported graph has exactly one output, ``logits``."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def build_model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(SEED)
    config = transformers.GPT2Config(**CONFIG, attn_implementation="eager")
    lm = transformers.GPT2LMHeadModel(config).eval()
    return _LogitsOnly(lm.to(dtype)).eval()


def export(model: torch.nn.Module, path: pathlib.Path) -> onnx.ModelProto:
    input_ids = torch.randint(0, CONFIG["vocab_size"], (2, 8), dtype=torch.int64)
    attention_mask = torch.ones(2, 8, dtype=torch.int64)
    attention_mask[1, 6:] = 0
    buffer = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(
            model,
            (input_ids, attention_mask),
            buffer,
            dynamo=False,
            opset_version=OPSET,
            input_names=["input_ids", "attention_mask"],
            output_names=["logits"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "sequence"},
                "logits": {0: "batch", 1: "sequence"},
            },
            do_constant_folding=True,
        )
    proto = onnx.load_from_string(buffer.getvalue())
    proto.ir_version = IR_VERSION
    proto.producer_name = "ort_flash/models/build_demo.py"
    onnx.helper.set_model_props(proto, {METADATA_KEY: json.dumps(CONFIG, sort_keys=True)})
    onnx.checker.check_model(proto, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(proto, path)
    return proto


def check_against_torch(model: torch.nn.Module, path: pathlib.Path, dtype: torch.dtype) -> float:
    """Largest |ORT - torch| over a few (batch, sequence) sizes unlike the export's (2, 8)."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    reference = model.float()  # the fp16 weights, computed in fp32 on the CPU
    worst = 0.0
    for batch, seq in [(3, 13), (1, 1), (2, 100), (1, CONFIG["n_positions"])]:
        ids = torch.randint(0, CONFIG["vocab_size"], (batch, seq))
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[batch // 2, seq // 2 + 1:] = 0
        with torch.no_grad():
            want = reference(ids, mask).numpy()
        got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
        worst = max(worst, float(np.abs(got.astype(np.float64) - want).max()))
    limit = 1e-4 if dtype == torch.float32 else 5e-2
    if worst > limit:
        raise SystemExit(f"{path}: ONNX Runtime differs from torch by {worst:.3g} (> {limit})")
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=pathlib.Path, default=DATA_DIR)
    args = parser.parse_args(argv)
    targets = [("gpt2_tiny.onnx", torch.float32), ("gpt2_tiny_fp16.onnx", torch.float16)]
    for name, dtype in targets:
        path = args.out_dir / name
        model = build_model(dtype)
        export(model, path)
        worst = check_against_torch(model, path, dtype)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB); |ORT - torch| <= {worst:.2g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
