"""`ort-flash`: rewrite, verify, info, demo, bench (one module each: ``<name>_command.py``)."""
from __future__ import annotations

import argparse

from ort_flash.cli import bench_command, demo_command, info_command, rewrite_command, verify_command
from ort_flash._onnxruntime import NoOnnxRuntimeError
from ort_flash.cli.common import user_error

# In the order `ort-flash --help` lists them; each has NAME, HELP, add_arguments(parser), run(args).
COMMANDS = (rewrite_command, verify_command, info_command, demo_command, bench_command)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ort-flash", description="FlashAttention for ONNX Runtime models")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        parser = sub.add_parser(command.NAME, help=command.HELP)
        command.add_arguments(parser)
        parser.set_defaults(func=command.run)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except MemoryError:
        return user_error("out of memory")
    except NoOnnxRuntimeError as e:  # its message, not its type: what to install (as demo and verify say it)
        return user_error(e)
    except Exception as e:  # noqa: BLE001 - any other failure: one line, exit 2, no traceback
        return user_error(f"{type(e).__name__}: {e}")

