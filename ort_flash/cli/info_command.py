"""``ort-flash info``: the library, ONNX Runtime, the compiled kernels and this GPU (``ort_flash.info``).

Exit status 1 where no ONNX Runtime, or two packages of it, are installed (said on the onnxruntime
line); 2 where the imported ort_flash has no compiled library beside it.
"""
from __future__ import annotations

import argparse

from ort_flash.cli.common import user_error

NAME = "info"
HELP = "library path, ONNX Runtime version, compiled kernels, this GPU"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass  # no options


def run(args: argparse.Namespace) -> int:
    from ort_flash._onnxruntime import problem
    from ort_flash.info import format_info
    try:
        print(format_info())
    except FileNotFoundError as e:  # no compiled library next to the imported package
        return user_error(e)
    return 1 if problem() else 0  # no ONNX Runtime or two of them: said on the onnxruntime line
