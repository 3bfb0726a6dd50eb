"""One-node ONNX models of ``GroupQueryAttention``: ONNX Runtime's (``com.microsoft``) or
ort_flash's drop-in (``ort_flash``), the same node in either domain. The gqa suite, the decode
suite's ``ort_gqa`` peer and the tests (tests/_gqa_models.py) build their models here.

Input and output names are the op's (INPUT_NAMES, OUTPUT_NAMES); an absent optional input becomes
the empty name. The shapes are those of the arrays or benchmark buffers given, so a model serves
one shape; IR version 10 (onnxruntime 1.31 loads IR <= 13, onnx's helpers would write a newer one).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from onnx import helper

from ort_flash.bench.tensors import ONNX_TYPES

INPUT_NAMES = (
    "query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
    "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale",
    "q_norm_weight", "k_norm_weight",
)
OUTPUT_NAMES = ("output", "present_key", "present_value")
IR_VERSION = 10
OPSETS = (("", 21), ("com.microsoft", 1))


def _elem_type(dtype) -> int:
    """ONNX element type of a numpy dtype or of a benchmark buffer's dtype name."""
    if isinstance(dtype, str):
        return ONNX_TYPES[dtype]
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def gqa_model(inputs: Mapping[str, object], domain: str = "com.microsoft", **attrs) -> bytes:
    """A model whose one node is GroupQueryAttention of ``domain`` (ONNX Runtime's, or
    "ort_flash") over the present ``inputs`` (names from INPUT_NAMES mapped to anything with
    ``shape`` and ``dtype``: numpy arrays or ``tensors.Buffer``); attributes with None are left out."""
    node_inputs = [n if n in inputs else "" for n in INPUT_NAMES]
    while node_inputs[-1] == "":
        node_inputs.pop()
    node = helper.make_node(
        "GroupQueryAttention", node_inputs, list(OUTPUT_NAMES), domain=domain,
        **{k: v for k, v in attrs.items() if v is not None})
    elem = _elem_type(inputs["query"].dtype)
    graph = helper.make_graph(
        [node], "gqa",
        [helper.make_tensor_value_info(n, _elem_type(a.dtype), list(a.shape)) for n, a in inputs.items()],
        [helper.make_tensor_value_info("output", elem, ["batch", "sequence", "hidden"]),
         helper.make_tensor_value_info("present_key", elem, ["batch", "kv_heads", "total", "head_size"]),
         helper.make_tensor_value_info("present_value", elem, ["batch", "kv_heads", "total", "head_size"])],
    )
    opsets = OPSETS if domain == "com.microsoft" else (*OPSETS, (domain, 1))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = IR_VERSION
    return model.SerializeToString()
