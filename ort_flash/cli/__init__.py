"""The ``ort-flash`` command (``python -m ort_flash.cli``): ``main`` parses the arguments and runs
one of the commands, each in a module of its own (``rewrite_command``, ``verify_command``,
``info_command``, ``demo_command``, ``bench_command``: NAME, HELP, ``add_arguments``, ``run``);
``common`` holds what they share (exit codes, the one-line error, atomic writes)."""
from __future__ import annotations

from ort_flash.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
