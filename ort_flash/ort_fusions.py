"""ONNX Runtime's transformer fusions for everything but attention, then ort_flash for attention.

    result = ort_flash.ort_fusions.rewrite("model.onnx", "bert", float16=True)
    onnx.save(result.model, "model.flash.onnx")

ONNX Runtime's transformers optimizer (``onnxruntime.transformers.optimizer.optimize_model``)
fuses more than attention: LayerNormalization, SkipLayerNormalization (residual Add +
LayerNorm), BiasGelu / FastGelu, RotaryEmbedding, EmbedLayerNormalization. ``rewrite`` runs it
(``opt_level=0``: its Python fusions only) with its attention fusion off
(``FusionOptions.enable_attention = False``), optionally converts the model to float16 as ONNX
Runtime documents it (``convert_float_to_float16(keep_io_types=True)``), and then
``ort_flash.rewrite`` fuses the attention the optimizer left as MatMul-Softmax-MatMul.

The order is not free (found on the e2e benchmark's BERT, GPT-2 and LLaMA exports):

* The optimizer before the rewrite. Its fusions are proven by ONNX Runtime's symbolic shape
  inference, which stops at an op it does not know: on a rewritten model it stops at the first
  FlashAttention, and then SkipLayerNormalization is not fused (BERT and GPT-2 keep LayerNorm
  after a separate residual Add) and LLaMA gets nothing fused at all. The rewriter's own shape
  inference knows ONNX Runtime's contrib ops, so it proves the attention of the optimized graph
  as it proves the export's.
* float16 before the rewrite. The converter types the graph by the same shape inference; after
  the rewrite it fails at FlashAttention, converts without types and leaves
  ``sym_shape_infer_temp.onnx`` in the working directory. Converted first, the rewriter sees a
  float16 graph as it sees a float16 export and emits FlashAttention with float16 inputs and
  outputs (no Cast around it); only the graph inputs and outputs stay float32 (keep_io_types).
* EmbedLayerNormalization (BERT) is left on: with no fused Attention node it can only take its
  "no mask" form (the mask index it computes is handed to fused Attention nodes only), so the
  mask the rewriter reads stays as exported. With attention fusion off, ONNX Runtime's check for
  an attention-like subgraph after the embeddings declines it on the TorchScript BERT export,
  whose head reshapes read the embeddings' shape: ``_fuse_embeddings`` runs the same fusion
  with those Shape readers set aside.

Whatever ONNX Runtime's fusions do to the model is theirs (the e2e benchmark verifies the result
against the original export). Two seen on LLaMA-style models: its RotaryEmbedding fusion of some
exports (transformers 5.17's, not 5.24's) takes position ids of batch 1, and the fused model then
refuses batch > 1, with or without ort_flash; and its SimplifiedLayerNormalization is written
into the ONNX domain, which ONNX Runtime runs but ``onnx.checker`` rejects ("No Op registered").
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os

import onnx

from ort_flash.rewriter import RewriteReport, external_data
from ort_flash.rewriter import rewrite as flash_rewrite
from ort_flash.rewriter.model_io import load

# ONNX Runtime's optimizer model types this was checked with (``gpt2`` also serves LLaMA-style
# decoders, as in the e2e benchmark).
MODEL_TYPES = ("bert", "gpt2")
# The choices of ``rewrite_default`` (the CLI's ``--ort-fusions``): "auto" runs the optimizer's
# ``bert`` fusions for an encoder (``auto_model_type``), "none" never runs the optimizer.
CHOICES = ("auto", "none") + MODEL_TYPES


class OrtFusionError(RuntimeError):
    """ONNX Runtime's optimizer or float16 conversion failed on the model."""


@dataclasses.dataclass
class OrtFusionsResult:
    model: onnx.ModelProto
    report: RewriteReport  # the attention rewrite's
    model_type: str
    ort_fused: dict[str, int]  # what ONNX Runtime's optimizer fused (its operator statistics, non-zero)
    float16: bool
    external: bool = False  # the input kept its weights as external data: so does the output
    base_dir: str = ""  # as RewriteResult's (the optimizer's model holds its weights in memory)

    def summary(self) -> str:
        fused = ", ".join(f"{k} {v}" for k, v in self.ort_fused.items()) or "nothing"
        return (f"ONNX Runtime optimizer (model_type {self.model_type}, attention fusion off) fused: {fused}"
                + ("; then converted to float16 (inputs and outputs stay float32)" if self.float16 else ""))

    def to_dict(self) -> dict:
        return {"model_type": self.model_type, "attention_fusion": False, "opt_level": 0,
                "fused": dict(self.ort_fused), "float16": self.float16}


def optimize(model_or_path: onnx.ModelProto | str | os.PathLike, model_type: str, *,
             float16: bool = False, num_heads: int = 0, hidden_size: int = 0, use_gpu: bool = False):
    """ONNX Runtime's optimizer with its attention fusion off (then float16 where asked): the
    ``onnxruntime.transformers.onnx_model.OnnxModel`` and its fused-operator counts. The input is
    not changed. ``num_heads`` / ``hidden_size`` serve only ONNX Runtime's attention fusions."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type must be one of {', '.join(MODEL_TYPES)}, not {model_type!r}")
    model, _ = load(model_or_path)  # a copy: the optimizer changes the proto it is given
    if external_data.has_external_data(model):  # the optimizer and converter read every weight
        base_dir = (os.path.dirname(os.path.abspath(model_or_path))
                    if isinstance(model_or_path, (str, os.PathLike)) else "")
        external_data.load_all(model, base_dir)
    options = FusionOptions(model_type)
    options.enable_attention = False
    try:
        with _quiet_about_heads():
            opt = optimize_model(model, model_type=model_type, num_heads=num_heads, hidden_size=hidden_size,
                                 optimization_options=options, opt_level=0, use_gpu=use_gpu)
        if model_type == "bert" and not opt.get_nodes_by_op_type("EmbedLayerNormalization"):
            _fuse_embeddings(opt)
        fused = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
        if float16:
            opt.convert_float_to_float16(keep_io_types=True)
        _import_contrib_domain(opt.model)
    except Exception as e:  # noqa: BLE001 - the optimizer raises whatever its fusions hit
        first = str(e).strip().splitlines()
        raise OrtFusionError(f"ONNX Runtime's optimizer (model_type {model_type}) failed: "
                             f"{type(e).__name__}: {first[0] if first else ''}") from e
    return opt, fused


def rewrite(model_or_path: onnx.ModelProto | str | os.PathLike, model_type: str, *, float16: bool = False,
            num_heads: int = 0, hidden_size: int = 0, use_gpu: bool = False, **rewrite_options) -> OrtFusionsResult:
    """``optimize`` and then ``ort_flash.rewrite`` (``rewrite_options``: its keyword arguments)."""
    external = (isinstance(model_or_path, (str, os.PathLike))
                and external_data.file_has_external_data(os.fspath(model_or_path)))
    opt, fused = optimize(model_or_path, model_type, float16=float16, num_heads=num_heads,
                          hidden_size=hidden_size, use_gpu=use_gpu)
    model = opt.model
    del opt  # the optimizer's copies of the weights
    result = flash_rewrite(model, **rewrite_options)
    return OrtFusionsResult(model=result.model, report=result.report, model_type=model_type,
                            ort_fused=fused, float16=float16, external=external or result.external)


def auto_model_type(model: onnx.ModelProto, report: RewriteReport) -> str | None:
    """The model type ``rewrite_default`` runs ONNX Runtime's optimizer with by itself: ``bert`` for
    an encoder whose LayerNorm or Gelu the graph computes from its parts (``suggested_model_type``),
    None otherwise. Decoders are left to an explicit ``--ort-fusions gpt2``: the optimizer's
    RotaryEmbedding fusion of some LLaMA exports takes position ids of batch 1 only."""
    return "bert" if suggested_model_type(model, report) == "bert" else None


@dataclasses.dataclass
class DefaultRewrite:
    """What ``rewrite_default`` did: ``result`` (a RewriteResult, or an OrtFusionsResult where ONNX
    Runtime's optimizer ran) and ``note``: one line on the path taken where the choice was
    "auto" and it mattered, else None."""
    result: object
    note: str | None = None

    @property
    def ort_fusions(self) -> OrtFusionsResult | None:
        return self.result if isinstance(self.result, OrtFusionsResult) else None


def rewrite_default(model_or_path: onnx.ModelProto | str | os.PathLike, choice: str = "auto", *,
                    float16: bool = False, **rewrite_options) -> DefaultRewrite:
    """The rewrite ``ort-flash rewrite`` runs: ``choice`` "none" is ``ort_flash.rewrite`` alone, a
    model type (``MODEL_TYPES``) ``rewrite`` after the optimizer; "auto" (the default) rewrites the
    attention, and where ``auto_model_type`` names an encoder ONNX Runtime's optimizer knows, runs
    the optimizer's fusions with it, keeping the plain rewrite (and saying why) where the optimizer
    fails or its graph leaves attention unfused that the plain rewrite fused."""
    if choice not in CHOICES:
        raise ValueError(f"choice must be one of {', '.join(CHOICES)}, not {choice!r}")
    if float16 and choice not in MODEL_TYPES:
        raise ValueError("float16 converts between ONNX Runtime's optimizer and the rewrite: it needs a model type")
    if choice in MODEL_TYPES:
        return DefaultRewrite(rewrite(model_or_path, choice, float16=float16, **rewrite_options))
    plain = flash_rewrite(model_or_path, **rewrite_options)
    model_type = auto_model_type(plain.model, plain.report) if choice == "auto" else None
    if model_type is None:
        return DefaultRewrite(plain)
    try:
        fused = rewrite(model_or_path, model_type, **rewrite_options)
    except OrtFusionError as e:
        return DefaultRewrite(plain, f"note: {e}; the attention rewrite alone was kept")
    if fused.report.total_fused < plain.report.total_fused:
        return DefaultRewrite(plain, f"note: after ONNX Runtime's {model_type} fusions {fused.report.total_fused} "
                                     f"attention(s) fuse, {plain.report.total_fused} without: the attention "
                                     "rewrite alone was kept")
    return DefaultRewrite(fused, f"note: an encoder ONNX Runtime's optimizer knows: its {model_type} fusions "
                                 "(LayerNorm, SkipLayerNorm, Gelu) ran with the attention rewrite "
                                 "(`--ort-fusions none`: the attention rewrite alone)")


def _fuse_embeddings(opt) -> None:
    """ONNX Runtime's EmbedLayerNormalization fusion (its "no mask" form), where the optimizer
    declined it only because its attention fusion is off: its check that an attention follows
    the embeddings accepts the three projections and the residual SkipLayerNormalization, but not
    the Shape nodes that TorchScript's BERT export hangs on the embeddings for its head reshapes
    (ONNX Runtime's attention fusion removes them first). A Shape reads no values, so the check
    runs here with them set aside; everything else is the optimizer's own fusion."""
    from onnxruntime.transformers.fusion_embedlayer import FusionEmbedLayerNoMask

    class ShapeReadersAside(FusionEmbedLayerNoMask):
        def check_attention_subgraph(self, layernorm, input_name_to_nodes, is_distil_bert):
            if super().check_attention_subgraph(layernorm, input_name_to_nodes, is_distil_bert):
                return True
            children = input_name_to_nodes.get(layernorm.output[0], [])
            if is_distil_bert or not any(c.op_type == "Shape" for c in children):
                return False
            rest = sorted(c.op_type for c in children if c.op_type != "Shape")
            return rest in (["MatMul", "MatMul", "MatMul", "SkipLayerNormalization"], ["Add", "MatMul", "MatMul", "MatMul"])

    ShapeReadersAside(opt).apply()
    opt.topological_sort()


def _import_contrib_domain(model: onnx.ModelProto) -> None:
    """Declares ("com.microsoft", 1), the domain of the optimizer's fused nodes, where they are
    used: the optimizer's in-memory model lacks it (its ``save_model_to_file`` adds it on the way
    to a file; ONNX Runtime loads the model without it, ``onnx.checker`` does not)."""
    domains = {o.domain for o in model.opset_import}
    if "com.microsoft" not in domains and any(n.domain == "com.microsoft" for n in model.graph.node):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))


@contextlib.contextmanager
def _quiet_about_heads():
    """Drops the optimizer's "Please specify parameters of num_heads and hidden_size" warning:
    only its attention fusions use them, and those are off."""
    log = logging.getLogger("onnxruntime.transformers.optimizer")

    def keep(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Please specify parameters of num_heads")

    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


def suggested_model_type(model: onnx.ModelProto, report: RewriteReport) -> str | None:
    """The ``--ort-fusions`` model type worth suggesting after a plain rewrite, or None: the
    attention was fused (the FlashAttention rules, not GroupQueryAttention, whose models GenAI's
    builder already fused) and the graph still computes LayerNorm or Gelu from their parts
    (ReduceMean ... Sqrt, Erf), which ONNX Runtime's optimizer fuses and ort_flash does not:
    ``bert`` where every fused attention is bidirectional (an encoder), else ``gpt2``."""
    fused = [f for f in report.fused if f.rule != "group_query_attention"]
    if not fused:
        return None
    ops = {n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")}
    if not ("Erf" in ops or {"ReduceMean", "Sqrt"} <= ops):
        return None
    return "gpt2" if any(f.causal for f in fused) else "bert"
