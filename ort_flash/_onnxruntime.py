"""Which ONNX Runtime package is installed, and the one-line message when none or two are.

ort_flash requires no ONNX Runtime package of its own (a user's own runtime is respected); the
extras pick one: ``ort-flash[gpu]`` onnxruntime-gpu (CUDA and CPU), ``ort-flash[cpu]`` onnxruntime.
The packages of the family all install the same ``onnxruntime/`` folder, so two of them in one
environment overwrite each other's files, and uninstalling either breaks the other.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
import warnings

# Distributions that install the `onnxruntime` import package.
DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino",
                 "onnxruntime-qnn", "onnxruntime-rocm", "onnxruntime-migraphx", "onnxruntime-training",
                 "ort-nightly", "ort-nightly-gpu")

INSTALL = ("pip install onnxruntime-gpu (CUDA and CPU; `pip install ort-flash[gpu]`) or onnxruntime "
           "(CPU only; `ort-flash[cpu]`)")


class OnnxRuntimeWarning(UserWarning):
    """No ONNX Runtime, or two packages of it, in this environment."""


class NoOnnxRuntimeError(ImportError):
    """No ONNX Runtime is importable; the message is the one line that says what to install."""


# An installed distribution's metadata folder: `{name}-{version}.dist-info`, the name with `_` for `-`.
_DIST_INFO = re.compile(r"^([A-Za-z0-9_.-]+?)-([^-]+)\.dist-info$")


def installed() -> list[tuple[str, str]]:
    """(distribution, version) of each ONNX Runtime package on sys.path, in DISTRIBUTIONS order.

    Read from the dist-info folder names, as importlib.metadata finds them, without importing it
    (it costs `import ort_flash` some 60 ms)."""
    found = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            m = _DIST_INFO.match(name)
            if m:
                dist = re.sub(r"[-_.]+", "-", m[1]).lower()
                if dist in DISTRIBUTIONS:
                    found.setdefault(dist, m[2])
    return [(d, found[d]) for d in DISTRIBUTIONS if d in found]


def problem() -> str:
    """The one-line message for an environment ort_flash cannot use as it is ("" if it can)."""
    found = installed()
    if len(found) > 1:
        names = " and ".join(f"{n} {v}" for n, v in found)
        return (f"ort_flash: {names} are installed together; they share one onnxruntime/ folder, "
                f"so one has overwritten the other and uninstalling either breaks both: run "
                f"`pip uninstall -y {' '.join(n for n, _ in found)}`, then {INSTALL}")
    if not found and importlib.util.find_spec("onnxruntime") is None:
        return f"ort_flash: no ONNX Runtime is installed: {INSTALL}"
    return ""


def warn_if_unusable(stacklevel: int = 2) -> None:
    """Warn (OnnxRuntimeWarning) where ``problem()`` has something to say."""
    message = problem()
    if message:
        warnings.warn(message, OnnxRuntimeWarning, stacklevel=stacklevel + 1)


def import_onnxruntime():
    """The `onnxruntime` module, or NoOnnxRuntimeError (an ImportError) with the one-line message
    when none is installed."""
    try:
        import onnxruntime
    except ModuleNotFoundError as e:
        if e.name != "onnxruntime":
            raise
        raise NoOnnxRuntimeError(problem() or f"ort_flash: no ONNX Runtime is installed: {INSTALL}") from None
    return onnxruntime


def check_providers(providers) -> None:
    """RuntimeError where CUDA is asked for and the installed ONNX Runtime has no CUDA execution
    provider (the CPU package): ONNX Runtime itself would only warn and run on the CPU."""
    names = [p[0] if isinstance(p, (tuple, list)) else p for p in (providers or [])]
    if "CUDAExecutionProvider" not in names:
        return
    ort = import_onnxruntime()
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" in available:
        return
    found = installed()
    which = " and ".join(f"{n} {v}" for n, v in found) or f"onnxruntime {ort.__version__}"
    fix = (f"pip uninstall -y {' '.join(n for n, _ in found) or 'onnxruntime'} && pip install "
           "onnxruntime-gpu (or `pip install ort-flash[gpu]`)")
    raise RuntimeError(f"ort_flash: CUDA was requested, but the installed ONNX Runtime ({which}) has "
                       f"no CUDA execution provider (it has {', '.join(available)}): {fix}")
