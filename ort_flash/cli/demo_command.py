"""``ort-flash demo``: rewrite, verify and time the bundled GPT-2-style model (``ort_flash.demo``);
``--export`` only writes that model, to try the other commands on."""
from __future__ import annotations

import argparse

from ort_flash.cli.common import check_writable, onnxruntime_errors, positive_int, user_error, write_atomic
from ort_flash.rewriter.model_io import ModelLoadError

NAME = "demo"
HELP = "rewrite, verify and time the bundled GPT-2-style model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--provider", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--seq-lens", type=positive_int, nargs="+", default=None,
                        help="sequence lengths to time (default: 256 1024 on CPU, 512 1024 2048 on CUDA)")
    parser.add_argument("--repeat", type=positive_int, default=None, help="timed runs per model and length")
    parser.add_argument("--export", metavar="MODEL.onnx", default=None,
                        help="only write the bundled demo model (float32) there, to try the other commands on")


def run(args: argparse.Namespace) -> int:
    from ort_flash.demo import demo_model_path, run_demo
    if args.export:  # the bundled model, to try the other commands on
        import shutil
        try:
            check_writable(args.export)
            write_atomic(args.export, lambda path: shutil.copyfile(demo_model_path("cpu"), path))
        except (OSError, ModelLoadError) as e:
            return user_error(e)
        print(f"wrote {args.export} (the demo's GPT-2-style model, float32, 2 layers, random weights)")
        return 0
    try:
        return run_demo(provider=args.provider, seq_lens=args.seq_lens, repeat=args.repeat)
    except ImportError as e:  # no ONNX Runtime: one line saying what to install
        return user_error(e)
    except (OSError, *onnxruntime_errors()) as e:  # a missing or broken library
        return user_error(e)
