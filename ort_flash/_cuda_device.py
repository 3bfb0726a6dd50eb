"""Which CUDA GPU this process sees, through the driver alone (no CUDA toolkit, no ONNX Runtime)."""
from __future__ import annotations


def cuda_device_arch() -> tuple[int, str] | None:
    """(SM version, name) of CUDA device 0 through the driver, or None without a usable GPU."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if cuda.cuInit(0) != 0:
        return None
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return None
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, 0)
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, 0)
    name = ctypes.create_string_buffer(256)
    cuda.cuDeviceGetName(name, 256, 0)
    return major.value * 10 + minor.value, name.value.decode(errors="replace")
