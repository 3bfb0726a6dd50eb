"""What every ``ort-flash`` command shares: the exit codes, the one-line error, the argparse
types, and writing a file whole or not at all.

A user error (a missing file, a file that is not ONNX, a truncated one, an unwritable output)
prints one line on stderr (``user_error``) and gives ``EXIT_USAGE``, with no traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

from ort_flash.rewriter.external_data import write_atomic  # noqa: F401 (the commands write through it)
from ort_flash.rewriter.model_io import ModelLoadError

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_NOTHING_FUSED = 0, 1, 2, 3


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse reports a bad value as a usage error, exit code 2)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def tolerance(text: str) -> float:
    """argparse type: a finite float >= 0."""
    value = float(text)
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, not {text}")
    return value


def onnxruntime_errors() -> tuple[type[BaseException], ...]:
    """ONNX Runtime's Python exceptions (Fail, InvalidGraph, ...), which derive from Exception only."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = ("Fail", "InvalidArgument", "InvalidGraph", "InvalidProtobuf", "NoSuchFile",
             "NoModel", "RuntimeException", "NotImplemented", "EPFail", "ModelLoaded")
    return (RuntimeError, *(getattr(state, n) for n in names if hasattr(state, n)))


def user_error(error: Exception | str) -> int:
    text = str(error).strip().splitlines()
    print(f"ort-flash: error: {text[0] if text else type(error).__name__}", file=sys.stderr)
    return EXIT_USAGE


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def check_writable(path: str) -> None:
    """Fails now, naming ``path``, where ``write_atomic`` would fail after the work: a missing
    folder, a directory in the way, a folder this process cannot create files in."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ModelLoadError(f"{path}: cannot write there: folder {folder} does not exist")
    if os.path.isdir(path):
        raise ModelLoadError(f"{path}: cannot write there: it is a directory")
    try:  # the real test (permissions, read-only file systems, root included): create a file there
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".probe")
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot write there: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(probe)


def write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
