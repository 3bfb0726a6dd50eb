"""One-node ONNX models of ``ort_flash.FlashAttention`` and a runner over ONNX Runtime.

The runner binds every input and output through IOBinding: outputs are preallocated, poisoned
with NaN (so an element the op never writes shows up) and bfloat16 travels as uint16 buffers
tagged BFLOAT16 (ONNX Runtime's numpy bridge has no bfloat16).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import ml_dtypes
import numpy as np
import onnx
from onnx import helper

from ort_flash.bench.onnx_graphs import flash_attention_model as _model_of


def _elem_type(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def flash_attention_model(
    inputs: Mapping[str, np.ndarray],
    outputs: Mapping[str, np.dtype],
    **attrs,
) -> bytes:
    """A model whose one node is FlashAttention (``ort_flash.bench.onnx_graphs``'s builder).

    ``inputs`` maps the FlashAttention input names present (onnx_graphs.FLASH_INPUTS) to example arrays (their dtype
    and rank become the graph input types; dims are left symbolic); absent optional inputs
    become the empty name. ``outputs`` maps wanted output names (FLASH_OUTPUTS) to dtypes. ``attrs``
    are the node attributes; None values are left out.
    """
    return _model_of({n: (_elem_type(a.dtype), a.ndim) for n, a in inputs.items()},
                     {n: (_elem_type(dt), None) for n, dt in outputs.items()}, **attrs)


def _ort_value(array: np.ndarray):
    import onnxruntime as ort

    if array.dtype == ml_dtypes.bfloat16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            array.view(np.uint16), onnx.TensorProto.BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(array)


def run_model(
    model: bytes,
    feeds: Mapping[str, np.ndarray],
    outputs: Mapping[str, tuple[Sequence[int], np.dtype]],
    providers: Sequence[str],
) -> dict[str, np.ndarray]:
    """Runs ``model`` in an ort_flash session; ``outputs`` maps names to (shape, dtype)."""
    import ort_flash

    session = ort_flash.InferenceSession(model, providers=list(providers))
    return run_bound(session, feeds, outputs, poison=np.nan)  # every output is floating point


def run_bound(sess, feeds: Mapping[str, np.ndarray],
              outputs: Mapping[str, tuple[Sequence[int], np.dtype]],
              poison: float) -> dict[str, np.ndarray]:
    """One run of ``sess`` with inputs and preallocated outputs (filled with ``poison``) bound
    through IOBinding; safe to call from many threads at once (one binding per call)."""
    binding = sess.io_binding()
    keep = []  # the numpy buffers behind the OrtValues must outlive the run
    for name, array in feeds.items():
        array = np.ascontiguousarray(array)
        keep.append(array)
        binding.bind_ortvalue_input(name, _ort_value(array))
    results = {}
    for name, (shape, dtype) in outputs.items():
        results[name] = np.full(shape, poison, dtype=dtype)
        binding.bind_ortvalue_output(name, _ort_value(results[name]))
    sess.run_with_iobinding(binding)
    return results
