"""ONNX Runtime sessions that have the ort_flash library registered, and the op versions it
implements."""
from __future__ import annotations

import os
from pathlib import Path

from ort_flash._library import session_options


def _preload_cuda(providers) -> None:
    """onnxruntime-gpu finds the CUDA/cuDNN libraries of the nvidia-* wheels only after
    preload_dlls(); harmless where they are absent."""
    import onnxruntime as ort

    names = [p[0] if isinstance(p, (tuple, list)) else p for p in (providers or [])]
    if "CUDAExecutionProvider" in names and hasattr(ort, "preload_dlls"):
        try:
            ort.preload_dlls()
        except Exception:  # noqa: BLE001 - missing optional CUDA wheels; ORT reports later
            pass


# The op versions the library implements. A plain onnxruntime session cannot refuse a later
# import: ORT registers a custom-op domain for opsets 1-1000 with one schema per op name (since
# its start version), so ("ort_flash", 2 or 99) resolves to the version-1 schema and kernel, even
# with the op's end version set to 1 (tried on onnxruntime 1.31.1: versions 1, 2, 99 all load and
# run); the kernel sees only that since-version, not the import. So it is checked here instead.
OP_VERSIONS = (1,)


def check_op_version(model) -> None:
    """Raise ValueError when the model imports an ort_flash opset the library does not implement.

    `model` is a path, serialized bytes or an `onnx.ModelProto` (external data is not read)."""
    import onnx

    if isinstance(model, (str, os.PathLike)):
        model = onnx.load(os.fspath(model), load_external_data=False)
    elif isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    for imp in getattr(model, "opset_import", ()):
        if imp.domain == "ort_flash" and imp.version not in OP_VERSIONS:
            raise ValueError(
                f"the model imports opset ('ort_flash', {imp.version}); this ort_flash library "
                f"implements version {', '.join(map(str, OP_VERSIONS))} of FlashAttention only: "
                f"rewrite the original model with this ort_flash, or install the version that "
                f"wrote it")


def InferenceSession(model, providers=None, sess_options=None, **kwargs):
    """`onnxruntime.InferenceSession` with ort_flash registered.

    `model` is a path, serialized bytes or an `onnx.ModelProto`. `providers` defaults to
    CUDA (when ONNX Runtime has it and the driver sees a GPU) then CPU. Asking for CUDA where the
    installed ONNX Runtime is the CPU package raises RuntimeError saying so (ONNX Runtime would
    run on the CPU with a warning).
    """
    from ._onnxruntime import check_providers, import_onnxruntime

    ort = import_onnxruntime()

    if providers is None:
        from ort_flash._cuda_device import cuda_device_arch

        # onnxruntime-gpu lists CUDA on machines without a GPU too, and then logs its failure.
        available = ort.get_available_providers()
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available
                     and (p != "CUDAExecutionProvider" or cuda_device_arch() is not None)]
    check_providers(providers)
    _preload_cuda(providers)
    check_op_version(model)
    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    elif isinstance(model, Path):
        model = str(model)
    return ort.InferenceSession(model, sess_options=session_options(sess_options),
                                providers=providers, **kwargs)
