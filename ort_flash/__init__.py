"""ort_flash: FlashAttention for ONNX Runtime.

    import ort_flash
    result = ort_flash.rewrite("model.onnx")          # fuse attention subgraphs
    sess = ort_flash.InferenceSession(result.model, providers=["CUDAExecutionProvider"])

`library_path()` is the custom-op library to register in any ONNX Runtime session (Python,
C or C++); `session_options()` does that for Python sessions.
"""
from __future__ import annotations

from ._onnxruntime import warn_if_unusable as _warn_if_unusable
from ._library import library_path, session_options
from ._session import InferenceSession, check_op_version

_warn_if_unusable()  # one line where no ONNX Runtime, or two packages of it, are installed

__version__ = "0.1.0"

__all__ = ["InferenceSession", "check_op_version", "library_path", "session_options", "rewrite", "RewriteResult",
           "__version__"]


def __getattr__(name):
    # The rewriter pulls in onnxscript; import it only when asked for.
    if name in ("rewrite", "RewriteResult"):
        from . import rewriter as _rewrite_pkg
        return getattr(_rewrite_pkg, name)
    raise AttributeError(f"module 'ort_flash' has no attribute {name!r}")
