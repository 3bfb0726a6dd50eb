"""Reading memory use: the GPU's (device-wide, as a user pays it) and this process's RSS.

* GPU: ``torch.cuda.mem_get_info`` (total − free), else ``nvidia-smi --query-gpu=memory.used``.
  Device-wide readings include every allocator in the process (ONNX Runtime's arena, cuDNN and
  cuBLAS workspaces, torch's cache) and any other process on the GPU: the benchmark machine
  runs nothing else, and readings are differences around one session.
* Process: current RSS from /proc/self/status; the peak (VmHWM) after resetting it through
  /proc/self/clear_refs ("5"), or ``getrusage`` ru_maxrss where the reset is refused.
"""
from __future__ import annotations

import resource
import subprocess


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def rss_mb() -> float:
    kb = _status_kb("VmRSS")
    return kb / 1024 if kb is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> bool:
    """Starts a new high-water mark of this process's RSS; False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb(after_reset: bool) -> float:
    kb = _status_kb("VmHWM") if after_reset else None
    return kb / 1024 if kb is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def device_used_bytes(torch=None) -> float:
    if torch is not None:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return float(total - free)
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return float(out.splitlines()[0]) * 2**20


def used_bytes(device: str, torch=None) -> float:
    """Device memory in use on CUDA; this process's current RSS on the CPU."""
    return device_used_bytes(torch) if device == "cuda" else rss_mb() * 2**20


def method(device: str, torch=None) -> str:
    if device == "cuda":
        return "device memory in use (torch.cuda.mem_get_info)" if torch is not None else \
            "device memory in use (nvidia-smi memory.used)"
    return "process RSS (/proc/self/status VmRSS)"
