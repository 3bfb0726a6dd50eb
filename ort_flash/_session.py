"""Where the custom-op library lives, and ONNX Runtime sessions that have it registered."""
from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

LIBRARY_NAME = "libort_flash.so"


def library_path() -> str:
    """Absolute path of the ONNX Runtime custom-op library (libort_flash.so).

    Register it in any ONNX Runtime session: Python `SessionOptions.register_custom_ops_library`,
    C `RegisterCustomOpsLibrary_V2`, C++ `Ort::SessionOptions::RegisterCustomOpsLibrary`.
    """
    override = os.environ.get("ORT_FLASH_LIBRARY")
    if override:
        return str(Path(override).resolve())
    candidate = importlib.resources.files("ort_flash").joinpath(LIBRARY_NAME)
    if candidate.is_file():
        return str(Path(str(candidate)).resolve())
    # Editable installs place compiled files beside the extension module, not the sources.
    try:
        from . import _C
    except ImportError as e:  # pragma: no cover - a broken install
        raise FileNotFoundError(
            f"{LIBRARY_NAME} is not installed with ort_flash; reinstall with "
            f"`pip install .` ({e})") from None
    path = Path(_C.__file__).resolve().with_name(LIBRARY_NAME)
    if not path.is_file():
        raise FileNotFoundError(f"{LIBRARY_NAME} not found beside {_C.__file__}; reinstall ort_flash")
    return str(path)


def session_options(so=None):
    """`onnxruntime.SessionOptions` with the ort_flash library registered (a new one if None)."""
    import onnxruntime as ort

    so = ort.SessionOptions() if so is None else so
    so.register_custom_ops_library(library_path())
    return so


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


def InferenceSession(model, providers=None, sess_options=None, **kwargs):
    """`onnxruntime.InferenceSession` with ort_flash registered.

    `model` is a path, serialized bytes or an `onnx.ModelProto`. `providers` defaults to
    CUDA (when available) then CPU.
    """
    import onnxruntime as ort

    if providers is None:
        available = ort.get_available_providers()
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
    _preload_cuda(providers)
    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    elif isinstance(model, Path):
        model = str(model)
    return ort.InferenceSession(model, sess_options=session_options(sess_options),
                                providers=providers, **kwargs)
