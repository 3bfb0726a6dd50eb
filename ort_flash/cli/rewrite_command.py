"""``ort-flash rewrite``: fuse a model's attention (or a GenAI folder's decoder's) and write it.

Exit status: 0 attention fused and the model written; 2 a user error (one line on stderr, nothing
written); 3 nothing fused (``EXIT_NOTHING_FUSED``: the output, an unchanged copy, is still written
unless ``--require-fusion``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import textwrap

from ort_flash.cli.common import (
    EXIT_NOTHING_FUSED, EXIT_OK, check_writable, same_file, user_error, write_atomic, write_text,
)
from ort_flash.ort_fusions import CHOICES as ORT_FUSION_CHOICES
from ort_flash.ort_fusions import MODEL_TYPES as ORT_MODEL_TYPES
from ort_flash.rewriter.model_io import ModelLoadError

NAME = "rewrite"
HELP = "fuse attention subgraphs into ort_flash.FlashAttention"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("exit status: 0 attention fused and the model written; 2 a user error (nothing "
                     "written); 3 nothing fused (the unchanged model written, with a warning; "
                     "with --require-fusion nothing written)")
    parser.add_argument("input", help="ONNX model to rewrite (never modified), an ONNX Runtime GenAI "
                                      "model folder (or its decoder model file), or a Hugging Face "
                                      "Optimum export folder (config.json and ONNX files)")
    parser.add_argument("-o", "--output", required=True,
                        help="where to write the rewritten model; where the input keeps its weights as "
                             "external data (or the output would pass 2 GB) they go to OUTPUT.data beside "
                             "it, one file with every weight the output uses (the input's files are "
                             "never referred to or changed). For a GenAI folder: the folder to write (a "
                             "copy of the input's with the decoder rewritten, genai_config.json naming "
                             "the ort_flash library and the library beside it). For an Optimum folder: "
                             "the folder to write (every ONNX file rewritten, every other file copied)")
    parser.add_argument(
        "--fast-padded-rows", action="store_true",
        help="map causal + key-padding masks with a finite mask value (eager finfo.min) to "
             "is_causal + a (B,1,1,S) mask: much faster, but query rows whose visible keys are all "
             "padding (left padding) then average over their causal window instead of all keys; "
             "and fuse eager masked_fill with float16's finfo.min (-65504) as -inf, so a query "
             "row whose every key is hidden gives 0 instead of the average of V")
    parser.add_argument(
        "--fp32-precision", choices=("ieee", "tf32"), default="ieee",
        help="float32 models on the GPU: exact IEEE dots (default) or faster TF32 dots (opt-in)")
    parser.add_argument(
        "--ort-fusions", metavar="MODEL_TYPE", choices=ORT_FUSION_CHOICES, default="auto",
        help="ONNX Runtime's transformer optimizer (onnxruntime.transformers, opt_level 0) with its "
             "attention fusion off, for its other fusions (LayerNorm, SkipLayerNorm, Gelu, ...), "
             "before the attention rewrite: auto (the default) runs its bert fusions on an encoder it "
             f"knows (BERT, RoBERTa, ViT, ...) and says so; none never runs it; "
             f"{' or '.join(ORT_MODEL_TYPES)} always runs it with that model type (gpt2 also for "
             "LLaMA-style decoders). Best on a float32 model (ORT's fusions match float32 graphs)")
    parser.add_argument(
        "--float16", action="store_true",
        help="with --ort-fusions: convert to float16 between ORT's optimizer and the attention "
             "rewrite (ORT's convert_float_to_float16; inputs and outputs stay float32)")
    parser.add_argument(
        "--gqa-cuda", choices=("measured", "all", "none"), default=None,
        help="float16/bfloat16 GroupQueryAttention nodes (CUDA): map those at head sizes where "
             "ort_flash's op was measured faster than ONNX Runtime's (measured, the default unless "
             "ORT_FLASH_GQA_CUDA=1 (all) or 0 (none) says otherwise), all, or none")
    parser.add_argument(
        "--attention-precision", choices=("model", "fp8"), default="model",
        help="model (the default): attention computes in each node's dtype; fp8: opt-in FP8 (e4m3) "
             "attention on Hopper: float16/bfloat16 nodes run their prefill on FP8 tensor cores on "
             "sm_90 GPUs (H100/H200), every other call in the node's dtype; measure its error with "
             "`ort-flash verify`. Never a default")
    parser.add_argument("--report", metavar="FILE.json", help="also write the report as JSON")
    parser.add_argument(
        "--require-fusion", action="store_true",
        help="fail (exit status 3, nothing written) when no attention was fused; without it such a "
             "model is written unchanged with a warning and exit status 3")


def run(args: argparse.Namespace) -> int:
    from ort_flash import ort_fusions
    from ort_flash.progress import Progress, wanted
    from ort_flash.rewriter import RewriteRefusedError

    model_type = getattr(args, "ort_fusions", None) or "auto"
    if getattr(args, "float16", False) and model_type not in ORT_MODEL_TYPES:
        return user_error("--float16 converts between ONNX Runtime's optimizer and the rewrite: "
                           f"it needs --ort-fusions {' or '.join(ORT_MODEL_TYPES)}")
    from ort_flash import genai

    from ort_flash import optimum
    if os.path.isdir(args.input) and not genai.is_genai(args.input) and optimum.is_optimum(args.input):
        return _rewrite_optimum(args, model_type)

    with Progress(wanted()) as progress:
        try:
            folder = _genai_folder(args.input, args.output)
            source = str(folder.decoder) if folder else args.input
            if folder is None and same_file(args.input, args.output):
                raise ModelLoadError(f"{args.output}: is the input model; choose another output path")
            if folder is None:
                check_writable(args.output)  # before the work, not after it
            else:
                genai.check_output_folder(folder, args.output)
            if args.report:
                check_writable(args.report)
            progress("loading")
            done = _rewrite_file(source, args, model_type, progress=progress)
            result = done.result
            if done.ort_fusions:
                summary = "\n".join(textwrap.wrap(result.summary(), 100, subsequent_indent="  "))
                report = json.dumps({**result.report.to_dict(), "ort_fusions": result.to_dict()}, indent=2)
            else:
                summary, report = None, result.report.to_json()
            progress.close()
            if summary:
                print(summary)
            print(result.report.format_table())
            if done.note:
                print("\n".join(textwrap.wrap(done.note, 100, subsequent_indent="  ")))
            suggestion = (ort_fusions.suggested_model_type(result.model, result.report)
                          if model_type == "auto" and not done.ort_fusions and not done.note else None)
            if suggestion:
                print(f"note: this model still computes LayerNorm / Gelu from their parts, which ONNX Runtime's "
                      f"optimizer fuses; `--ort-fusions {suggestion}` adds those fusions to the attention "
                      f"rewrite (the faster path on the README's BERT, GPT-2 and LLaMA measurements)")
            nothing = result.report.total_fused == 0
            if nothing and getattr(args, "require_fusion", False):
                print(f"ort-flash: error: no attention was fused in {args.input} (--require-fusion): "
                      f"nothing written", file=sys.stderr)
                return EXIT_NOTHING_FUSED
            progress("writing")
            if folder is not None:
                written = []
                genai.write_folder(folder.folder, args.output,
                                   lambda path: written.append(write_model(result, str(path))))
                data = written[0] if written else None
            else:
                data = write_model(result, args.output)
            if args.report:
                write_atomic(args.report, lambda path: write_text(path, report))
        except (ModelLoadError, RewriteRefusedError, ort_fusions.OrtFusionError, genai.GenAIFolderError,
                OSError) as e:
            progress.close()
            return user_error(e)
    if folder is not None:
        print(f"wrote the GenAI folder {args.output}: {folder.decoder.name} rewritten"
              f"{' with its weights in ' + os.path.basename(data) if data else ''}, genai_config.json "
              f"naming the ort_flash library copied beside it")
    elif data is None:
        print(f"wrote {args.output}")
    else:
        why = ("as the input's were" if result.external else
               "as the model would pass protobuf's 2 GB limit in one file")
        print(f"wrote {args.output} and its weights {data} ({_gb(os.path.getsize(data))}; external "
              f"data, {why})")
    if nothing:
        unfused = len(result.report.unfused)
        why = (f"its {unfused} Softmax node(s) stay unfused, for the reasons in the table above" if unfused
               else "it holds no Softmax or Attention node the rewriter looks for")
        print(f"ort-flash: warning: no attention was fused in {args.input}: {why}; {args.output} "
              f"computes the same graph (exit status {EXIT_NOTHING_FUSED})", file=sys.stderr)
        return EXIT_NOTHING_FUSED
    return EXIT_OK


def _genai_folder(source: str, output: str):
    """The GenAI folder to rewrite (ort_flash.genai.GenAIFolder) where ``source`` is one, or its
    decoder model with an ``output`` that is not a model file name; else None."""
    from ort_flash import genai

    if os.path.isdir(source):
        if not genai.is_genai(source):
            raise ModelLoadError(f"{source}: is a directory, not an ONNX model, an ONNX Runtime GenAI "
                                 f"model folder (no {genai.CONFIG_NAME} in it) or an Optimum export folder "
                                 "(config.json and ONNX files at its top level)")
        return genai.open_folder(source)
    if genai.is_genai(source) and (os.path.isdir(output) or not output.endswith(".onnx")):
        return genai.open_folder(source)
    return None


def _rewrite_file(source: str, args: argparse.Namespace, model_type: str, progress=None):
    """``ort_fusions.rewrite_default`` of one model file with the command's options: the attention
    rewrite, after ONNX Runtime's optimizer where ``--ort-fusions`` names a model type or "auto"
    finds an encoder it knows."""
    from ort_flash import ort_fusions

    options = dict(exact_masked_rows=not getattr(args, "fast_padded_rows", False),
                   fp32_precision=getattr(args, "fp32_precision", "ieee"),
                   gqa_cuda=getattr(args, "gqa_cuda", None),
                   attention_precision=getattr(args, "attention_precision", "model"), progress=progress)
    with _optimizer_messages_in_our_terms(model_type):
        return ort_fusions.rewrite_default(source, model_type, float16=getattr(args, "float16", False), **options)


class _NothingFused(Exception):
    pass


def _rewrite_optimum(args: argparse.Namespace, model_type: str) -> int:
    """``ort-flash rewrite`` of an Optimum export folder: each ONNX file as a model of its own (its
    report under its name), every other file copied; nothing written where any file fails, or,
    with --require-fusion, where no file had attention to fuse."""
    from ort_flash import optimum, ort_fusions
    from ort_flash.rewriter import RewriteRefusedError

    files = optimum.onnx_files(args.input)
    reports, fused = {}, {}

    def write(source, output):
        done = _rewrite_file(str(source), args, model_type)
        result = done.result
        print(f"== {source.name}")
        print(result.report.format_table())
        if done.note:
            print(done.note)
        reports[source.name] = result.report.to_dict()
        fused[source.name] = result.report.total_fused
        if len(fused) == len(files) and not any(fused.values()) and getattr(args, "require_fusion", False):
            raise _NothingFused
        write_model(result, str(output))

    try:
        optimum.check_output_folder(args.input, args.output)
        if args.report:
            check_writable(args.report)
        optimum.write_folder(args.input, args.output, write)
        if args.report:
            write_atomic(args.report, lambda path: write_text(path, json.dumps({"files": reports}, indent=2)))
    except _NothingFused:
        print(f"ort-flash: error: no attention was fused in any file of {args.input} (--require-fusion): "
              f"nothing written", file=sys.stderr)
        return EXIT_NOTHING_FUSED
    except (ModelLoadError, RewriteRefusedError, ort_fusions.OrtFusionError, optimum.OptimumFolderError,
            OSError) as e:
        return user_error(e)
    counts = ", ".join(f"{name} {n}" for name, n in fused.items())
    print(f"wrote the Optimum folder {args.output}: attention fused per file: {counts}; every other file copied")
    if not any(fused.values()):
        print(f"ort-flash: warning: no attention was fused in any file of {args.input}; {args.output} "
              f"computes the same graphs (exit status {EXIT_NOTHING_FUSED})", file=sys.stderr)
        return EXIT_NOTHING_FUSED
    return EXIT_OK


def write_model(result, output: str) -> str | None:
    """Write ``result.model`` (a RewriteResult's or an OrtFusionsResult's) to ``output``, and its
    weights to ``output + ".data"`` where the input kept them as external data or the model would
    pass 2 GB: ``external_data.save_atomic``, what ``RewriteResult.save`` writes with, so that a
    failure leaves neither file. Returns the data file's path, or None."""
    from ort_flash.rewriter import external_data

    return external_data.save_atomic(result.model, output, result.base_dir, external=result.external)


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


@contextlib.contextmanager
def _optimizer_messages_in_our_terms(model_type: str):
    """ONNX Runtime's optimizer warns, for a model not exported by the producer it expects,
    "Please specify correct --model_type parameter", a flag of its own script: say it in
    ort-flash's terms (the ``--ort-fusions`` value) instead."""
    log = logging.getLogger("onnxruntime.transformers.optimizer")

    def translate(record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "Please specify correct --model_type" in text:
            found = re.search(r'Expected "(.*?)", Got "(.*?)"', text)
            expected, got = found.groups() if found else ("?", "?")
            flag = "auto (an encoder: bert)" if model_type == "auto" else model_type
            record.msg = (f"ort-flash: note: --ort-fusions {flag} runs ONNX Runtime's optimizer "
                          f"for models exported by {expected!r}; this model's producer is {got!r}. It "
                          "ran anyway: its fused counts are below (another --ort-fusions value may "
                          "match more)")
            record.args = ()
        return True

    log.addFilter(translate)
    try:
        yield
    finally:
        log.removeFilter(translate)


