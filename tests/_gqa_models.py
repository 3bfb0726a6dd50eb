"""One-node ONNX models of ONNX Runtime's ``com.microsoft.GroupQueryAttention`` and a runner
over ONNX Runtime's CPU execution provider (graph optimizations off).

``shared=True`` runs the node the way ONNX Runtime GenAI does: past_key/present_key (and the
values) bound through IOBinding to one OrtValue, so the op sees one buffer; the runner returns
that buffer's content after the run. Otherwise the presents are fresh outputs.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from onnx import helper

INPUT_NAMES = (
    "query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
    "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink",
)
OUTPUT_NAMES = ("output", "present_key", "present_value")
IR_VERSION = 10  # onnxruntime loads IR <= 13; onnx's helpers would write a newer one
OPSETS = (("", 21), ("com.microsoft", 1))


def gqa_model(inputs: Mapping[str, np.ndarray], **attrs) -> bytes:
    """A model whose one node is GroupQueryAttention over the present ``inputs`` (names from
    INPUT_NAMES; absent optional inputs become the empty name); attributes with None are left out."""
    node_inputs = [n if n in inputs else "" for n in INPUT_NAMES]
    while node_inputs[-1] == "":
        node_inputs.pop()
    node = helper.make_node(
        "GroupQueryAttention", node_inputs, list(OUTPUT_NAMES), domain="com.microsoft",
        **{k: v for k, v in attrs.items() if v is not None})
    dtype = inputs["query"].dtype
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    graph = helper.make_graph(
        [node], "gqa",
        [helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)) for n, a in inputs.items()],
        [helper.make_tensor_value_info("output", elem, None),
         helper.make_tensor_value_info("present_key", elem, None),
         helper.make_tensor_value_info("present_value", elem, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in OPSETS])
    model.ir_version = IR_VERSION
    return model.SerializeToString()


def run_gqa(inputs: Mapping[str, np.ndarray], *, shared: bool = False, **attrs):
    """(output, present_key, present_value) of ONNX Runtime's CPU GroupQueryAttention."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(gqa_model(inputs, **attrs), opts, providers=["CPUExecutionProvider"])
    if not shared:
        return tuple(sess.run(list(OUTPUT_NAMES), dict(inputs)))
    binding = sess.io_binding()
    caches = {}
    for name, array in inputs.items():
        # ORT-owned memory: a numpy-backed OrtValue does not keep its array alive.
        value = ort.OrtValue.ortvalue_from_shape_and_type(array.shape, array.dtype)
        value.update_inplace(np.ascontiguousarray(array))
        binding.bind_ortvalue_input(name, value)
        if name in ("past_key", "past_value"):
            caches[name] = value
    binding.bind_output("output")
    binding.bind_ortvalue_output("present_key", caches["past_key"])
    binding.bind_ortvalue_output("present_value", caches["past_value"])
    sess.run_with_iobinding(binding)
    out = binding.get_outputs()[0].numpy().copy()
    return out, caches["past_key"].numpy().copy(), caches["past_value"].numpy().copy()

