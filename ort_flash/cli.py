"""`ort-flash`: rewrite, verify, info, demo, bench."""
from __future__ import annotations

import argparse
import sys

from ort_flash import commands


def _cmd_info(args: argparse.Namespace) -> int:
    from ort_flash._onnxruntime import problem
    from ort_flash.info import format_info
    try:
        print(format_info())
    except FileNotFoundError as e:  # no compiled library next to the imported package
        return commands._user_error(e)
    return 1 if problem() else 0  # no ONNX Runtime or two of them: said on the onnxruntime line


def _cmd_demo(args: argparse.Namespace) -> int:
    from ort_flash.demo import demo_model_path, run_demo
    if args.export:  # the bundled model, to try the other commands on
        import shutil
        try:
            commands._check_writable(args.export)
            commands._write_atomic(args.export, lambda path: shutil.copyfile(demo_model_path("cpu"), path))
        except (OSError, commands.ModelLoadError) as e:
            return commands._user_error(e)
        print(f"wrote {args.export} (the demo's GPT-2-style model, float32, 2 layers, random weights)")
        return 0
    try:
        return run_demo(provider=args.provider, seq_lens=args.seq_lens, repeat=args.repeat)
    except ImportError as e:  # no ONNX Runtime: one line saying what to install
        return commands._user_error(e)
    except (OSError, *commands._onnxruntime_errors()) as e:  # a missing or broken library
        return commands._user_error(e)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ort-flash", description="FlashAttention for ONNX Runtime models")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("rewrite", help="fuse attention subgraphs into ort_flash.FlashAttention")
    commands.add_rewrite_arguments(r)
    r.set_defaults(func=commands.cmd_rewrite)
    v = sub.add_parser("verify", help="run original and rewritten models on the same random inputs")
    commands.add_verify_arguments(v)
    v.set_defaults(func=commands.cmd_verify)
    i = sub.add_parser("info", help="library path, ONNX Runtime version, compiled kernels, this GPU")
    i.set_defaults(func=_cmd_info)
    d = sub.add_parser("demo", help="rewrite, verify and time the bundled GPT-2-style model")
    d.add_argument("--provider", choices=("auto", "cpu", "cuda"), default="auto")
    d.add_argument("--seq-lens", type=commands.positive_int, nargs="+", default=None,
                   help="sequence lengths to time (default: 256 1024 on CPU, 512 1024 2048 on CUDA)")
    d.add_argument("--repeat", type=commands.positive_int, default=None, help="timed runs per model and length")
    d.add_argument("--export", metavar="MODEL.onnx", default=None,
                   help="only write the bundled demo model (float32) there, to try the other commands on")
    d.set_defaults(func=_cmd_demo)
    b = sub.add_parser("bench", help="time the fused op, ONNX Runtime's attention and torch SDPA; "
                       "tables and JSON (docs/PERFORMANCE.md via --report)")
    from ort_flash.bench import add_arguments, run_command
    add_arguments(b)
    b.set_defaults(func=run_command)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except MemoryError:
        return commands._user_error("out of memory")
    except Exception as e:  # noqa: BLE001 - any other failure: one line, exit 2, no traceback
        return commands._user_error(f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    sys.exit(main())
