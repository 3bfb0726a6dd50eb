"""Test configuration: the `gpu` marker skips, with the reason, where no usable GPU exists."""
from __future__ import annotations

import functools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/ helpers (cases.py, _onnx_models.py)


@functools.lru_cache(maxsize=None)
def gpu_unavailable_reason(direct: bool = False) -> str | None:
    """None when a GPU and (unless `direct`: the kernels driven without ONNX Runtime) the CUDA
    execution provider are usable, else why not."""
    from ort_flash.info import cuda_device_arch
    if cuda_device_arch() is None:
        return "no NVIDIA GPU / driver (libcuda.so.1) on this machine"
    if direct:
        return None
    try:
        import onnxruntime as ort
    except ImportError as e:  # pragma: no cover
        return f"onnxruntime not importable: {e}"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (install onnxruntime-gpu)"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords:
            reason = gpu_unavailable_reason("direct" in item.keywords)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=f"GPU test: {reason}"))
