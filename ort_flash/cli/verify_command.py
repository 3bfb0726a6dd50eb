"""``ort-flash verify``: the original and the rewritten model on the same random inputs.

Exit status: 0 every output within tolerance, 1 outputs differ (``EXIT_MISMATCH``), 2 a user
error, or ``--provider cuda`` where the fused op did not run on CUDA.
"""
from __future__ import annotations

import argparse

from ort_flash.cli.common import (
    EXIT_MISMATCH, EXIT_OK, onnxruntime_errors, positive_int, tolerance, user_error, write_atomic,
    write_text,
)
from ort_flash.rewriter.model_io import ModelLoadError, load_model

NAME = "verify"
HELP = "run original and rewritten models on the same random inputs"

PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ort_flash.verify import FP8_FACTOR, parse_shape

    parser.epilog = ("an output passes where |rewritten - original| <= atol + rtol * |original| at "
                     "every element. A rewritten model with FP8 attention (rewrite --attention-precision fp8) "
                     "also runs with that attribute removed (its dtype) and against a float32 copy of the "
                     "original (CPU EP); it passes where its dtype run passes that rule and its FP8 run "
                     f"stays within max({FP8_FACTOR:g} x the dtype run's error, atol + rtol * |reference|) of "
                     "the float32 reference. exit status: 0 pass; 1 outputs differ; 2 a user error, or "
                     "--provider cuda where the fused op did not run on CUDA")
    parser.add_argument("original", help="the model before rewriting (or an Optimum export folder: each of "
                                         "its ONNX files against the same file of the rewritten folder)")
    parser.add_argument("rewritten", help="the model after rewriting (or the rewritten folder)")
    parser.add_argument("--provider", choices=sorted(PROVIDERS), default="cpu")
    parser.add_argument("--seq-len", type=positive_int, default=None, help="size of dynamic sequence dims")
    parser.add_argument("--past-len", type=positive_int, default=None,
                        help="size of dynamic dims named like a KV cache's ('past...'; default 12)")
    parser.add_argument("--batch", type=positive_int, default=2, help="size of dynamic batch dims")
    parser.add_argument("--shape", type=parse_shape, action="append", default=None,
                        metavar="NAME=d0,d1,...",
                        help="the shape of one input, e.g. pixel_values=2,3,224,224 (repeatable); "
                             "its named dims take these sizes in the other inputs too")
    parser.add_argument("--seed", type=int, default=None, help="input seed (default: fresh)")
    parser.add_argument("--atol", type=tolerance, default=None,
                        help="absolute tolerance (default by output dtype: 1e-4 float32, 2e-2 float16); "
                             "e.g. 2e-2 for a model rewritten with --float16, whose float32 outputs are "
                             "computed in float16")
    parser.add_argument("--rtol", type=tolerance, default=None, help="relative tolerance (default by output dtype, as --atol)")
    parser.add_argument("--json", metavar="FILE.json", help="also write the result as JSON")


def run(args: argparse.Namespace) -> int:
    import os

    if os.path.isdir(args.original) or os.path.isdir(args.rewritten):
        return _verify_folders(args)
    return _verify_one(args)


def _verify_folders(args: argparse.Namespace) -> int:
    """Each ONNX file of the original folder against the rewritten folder's file of that name;
    passes where every file passes."""
    import copy
    import json
    import os

    from ort_flash import optimum

    if not (os.path.isdir(args.original) and os.path.isdir(args.rewritten)):
        return user_error("verify: give two model files or two folders, not one of each")
    names = [p.name for p in optimum.onnx_files(args.original)]
    theirs = {p.name for p in optimum.onnx_files(args.rewritten)}
    if not names:
        return user_error(f"{args.original}: no ONNX files at its top level to verify")
    if set(names) != theirs:
        return user_error(f"the folders hold different ONNX files: {', '.join(sorted(names))} against "
                          f"{', '.join(sorted(theirs)) or 'none'}")
    status, files = EXIT_OK, {}
    for name in names:
        one = copy.copy(args)
        one.original, one.rewritten = os.path.join(args.original, name), os.path.join(args.rewritten, name)
        print(f"== {name}")
        rc, result = _checked(one)
        if result is None:
            return rc
        files[name] = json.loads(result.to_json())
        status = status or rc
    print(f"verify: {len(names)} file(s), {'every one passed' if status == EXIT_OK else 'some differ'}")
    if getattr(args, "json", None):
        try:
            write_atomic(args.json, lambda path: write_text(path, json.dumps({"files": files}, indent=2)))
        except OSError as e:
            return user_error(e)
    return status


def _verify_one(args: argparse.Namespace) -> int:
    rc, result = _checked(args)
    if result is not None and getattr(args, "json", None):
        try:
            write_atomic(args.json, lambda path: write_text(path, result.to_json()))
        except OSError as e:
            return user_error(e)
    return rc


def _checked(args: argparse.Namespace):
    """(exit status, the verify result with its table printed), or (2, None) after a user error."""
    from ort_flash.verify import InputShapeError, ModelMismatchError, verify

    from ort_flash.progress import Progress, wanted

    with Progress(wanted(json_run=bool(getattr(args, "json", None)))) as progress:
        try:
            progress("loading")
            load_model(args.original)  # a clear message for a bad file before ONNX Runtime sees it
            load_model(args.rewritten)
            if args.seq_len is not None and args.seq_len < 1:
                raise ModelLoadError(f"--seq-len must be at least 1, not {args.seq_len}")
            result = verify(
                args.original, args.rewritten, providers=PROVIDERS[args.provider],
                batch=getattr(args, "batch", 2), seq_len=args.seq_len,
                past_len=getattr(args, "past_len", None), seed=getattr(args, "seed", None),
                atol=getattr(args, "atol", None), rtol=getattr(args, "rtol", None),
                shapes=dict(getattr(args, "shape", None) or []), progress=progress,
            )
        except (ModelLoadError, ModelMismatchError, InputShapeError, OSError, ImportError) as e:
            progress.close()
            return user_error(e), None
        except onnxruntime_errors() as e:  # a model ORT cannot load or run, a missing library
            progress.close()
            return user_error(f"onnxruntime: {e}"), None
    if args.provider == "cuda":
        not_on_cuda = _fused_op_off_cuda(args, result)
        if not_on_cuda:
            return user_error(f"verify --provider cuda: {not_on_cuda}; nothing was verified on CUDA"), None
    print(result.format_table())
    return (EXIT_OK if result.passed else EXIT_MISMATCH), result


def _fused_op_off_cuda(args: argparse.Namespace, result) -> str:
    """Why the rewritten model's FlashAttention nodes did not run on CUDA ("" if they did),
    from the session's providers and ONNX Runtime's profiler (as ``demo --provider cuda``)."""
    if "CUDAExecutionProvider" not in result.rewritten_providers:
        return ("ONNX Runtime could not create a CUDA session here (it needs onnxruntime-gpu, an "
                "NVIDIA GPU and the CUDA libraries; see its messages above), so the rewritten model "
                f"ran on {', '.join(result.rewritten_providers)}")
    import ort_flash
    from ort_flash.timing import node_placements
    from ort_flash.verify import DEFAULT_PAST_LEN, DEFAULT_SEQ_LEN, make_inputs

    feeds = make_inputs(load_model(args.original), batch=getattr(args, "batch", 2),
                        seq_len=args.seq_len or DEFAULT_SEQ_LEN,
                        past_len=getattr(args, "past_len", None) or DEFAULT_PAST_LEN, seed=result.seed,
                        shapes=dict(getattr(args, "shape", None) or []))
    placed = node_placements(args.rewritten, feeds, PROVIDERS["cuda"],
                             ort_flash.session_options())
    elsewhere = {p: n for (op, p), n in placed.items() if op == "FlashAttention" and p != "CUDAExecutionProvider"}
    if elsewhere:
        return ("the FlashAttention nodes ran on " + ", ".join(f"{p} x{n}" for p, n in elsewhere.items())
                + " (ONNX Runtime's profiler); `ort-flash info` says which GPUs this build has kernels for")
    return ""
