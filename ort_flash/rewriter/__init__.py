"""Rewrite attention subgraphs of an ONNX model into ``ort_flash.FlashAttention``.

    result = ort_flash.rewriter.rewrite("model.onnx")
    result.save("model.flash.onnx")  # + model.flash.onnx.data where the weights are external
    print(result.report.format_table())

``pipeline`` says what ``rewrite`` does, in order (its docstring is the whole story).
"""

from __future__ import annotations

from ort_flash.rewriter.model_io import ModelLoadError, load_model
from ort_flash.rewriter.output_check import RewriteRefusedError
from ort_flash.rewriter.pipeline import RewriteResult, rewrite
from ort_flash.rewriter.report import FusedSubgraph, RewriteReport, UnfusedSoftmax

__all__ = [
    "FusedSubgraph", "ModelLoadError", "RewriteRefusedError", "RewriteReport", "RewriteResult",
    "UnfusedSoftmax", "load_model", "rewrite",
]
