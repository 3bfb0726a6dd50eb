"""Running one ort_flash session many times (the reliability tests): sessions with quiet logging,
static-shape one-node models, and a bound run with a chosen poison value.

``_onnx_models.run_model`` builds a fresh session per call and poisons outputs with NaN; the
reliability tests reuse sessions across runs and threads, and the NaN tests need a poison that
is not NaN (an output the op never wrote must not pass for a propagated NaN).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

import _onnx_models
from _onnx_models import flash_attention_model

CPU = ["CPUExecutionProvider"]
POISON = 1234.5  # exactly representable in float16, bfloat16 and float32


def session(model: bytes, providers: Sequence = CPU, threads: int | None = None):
    """An ort_flash session with ONNX Runtime's own error logging off (tests read the exception)."""
    import onnxruntime as ort

    import ort_flash

    so = ort.SessionOptions()
    so.log_severity_level = 4
    if threads is not None:
        so.intra_op_num_threads = threads
    return ort_flash.InferenceSession(model, providers=list(providers), sess_options=so)


def run_bound(sess, feeds: Mapping[str, np.ndarray],
              outputs: Mapping[str, tuple[Sequence[int], np.dtype]],
              poison: float = POISON) -> dict[str, np.ndarray]:
    """_onnx_models.run_bound with this module's default poison value."""
    return _onnx_models.run_bound(sess, feeds, outputs, poison)


def static_model(inputs: Mapping[str, tuple[np.dtype, Sequence[int | None]]],
                 outputs: Mapping[str, np.dtype] | None = None, name: str = "attn0",
                 **attrs) -> bytes:
    """A one-node FlashAttention model whose graph inputs have the given element types and
    shapes (None = a symbolic dim), and whose node is called ``name``. Built by
    ``_onnx_models.flash_attention_model``; only the recorded shapes and the node name differ."""
    examples = {n: np.zeros([1] * len(shape), dtype) for n, (dtype, shape) in inputs.items()}
    if outputs is None:
        q_dtype = inputs["Q"][0]
        outputs = {"Y": q_dtype if np.dtype(q_dtype).kind == "f" else np.float32}
    model = onnx.load_from_string(flash_attention_model(examples, outputs, **attrs))
    model.graph.node[0].name = name
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        for dim, size in zip(dims, inputs[value.name][1]):
            dim.Clear()
            if size is not None:
                dim.dim_value = size
    return model.SerializeToString()
