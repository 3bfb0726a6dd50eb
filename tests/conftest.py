"""Test configuration: the `gpu` marker skips, with the reason, where no usable GPU exists."""
from __future__ import annotations

import functools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/ helpers (cases.py, _onnx_models.py)
# The repository root, for the build-time package `aot` (`python -m pytest` from the root has it
# already); appended, so that an installed ort_flash (tools/ort_versions.sh) still comes first.
if os.path.dirname(os.path.dirname(os.path.abspath(__file__))) not in sys.path:
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@functools.lru_cache(maxsize=None)
def gpu_unavailable_reason(direct: bool = False) -> str | None:
    """None when a GPU and (unless `direct`: the kernels driven without ONNX Runtime) the CUDA
    execution provider are usable, else why not."""
    from ort_flash._cuda_device import cuda_device_arch
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


# A GPU test that hangs (a kernel that never finishes, a deadlocked launch) must not hang the
# machine unnoticed: past this many seconds the process dumps every thread's stack and exits,
# which frees its CUDA context; under pytest-xdist the worker's crash names the test.
GPU_TEST_TIMEOUT_S = float(os.environ.get("ORT_FLASH_GPU_TEST_TIMEOUT", "300"))


_WATCHDOG_FILE = []  # faulthandler writes to a file object that must outlive the test


def _terminal_fd(config) -> int:
    """The process's stderr before pytest captured it (the fd capture saves a copy)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    err = getattr(getattr(capman, "_global_capturing", None), "err", None)
    fd = getattr(err, "targetfd_save", None)
    return fd if isinstance(fd, int) else 2


@pytest.fixture(autouse=True)
def _gpu_watchdog(request):
    if "gpu" not in request.keywords or GPU_TEST_TIMEOUT_S <= 0:
        yield
        return
    import faulthandler

    fd = _terminal_fd(request.config)
    os.write(fd, f"\n[ort_flash GPU watchdog: {request.node.nodeid} must finish within "
                 f"{GPU_TEST_TIMEOUT_S:g} s, else the process ends]\n".encode())
    if not _WATCHDOG_FILE:
        _WATCHDOG_FILE.append(os.fdopen(os.dup(fd), "w"))
    faulthandler.dump_traceback_later(GPU_TEST_TIMEOUT_S, exit=True, file=_WATCHDOG_FILE[0])
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
