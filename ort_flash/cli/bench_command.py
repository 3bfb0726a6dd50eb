"""``ort-flash bench``: arguments, and running the suites of ``ort_flash.bench`` (each in its own
process under ``all``).

Under ``--suite all`` every suite runs in a child process of its own: a CUDA error in one
cannot poison the next, each end-to-end memory reading starts from a clean device, and a suite
that overruns its time budget is stopped while the others still run. Each suite writes its JSON
after every configuration, so whatever was measured survives.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from ort_flash.bench import results

NAME = "bench"
HELP = ("time the fused op, ONNX Runtime's attention and torch SDPA; "
        "tables and JSON (docs/PERFORMANCE.md via --report)")
SUITES_BY_DEVICE = {"cuda": ("op", "decode", "e2e", "decode_e2e"), "cpu": ("cpu", "op")}
# Seconds per suite (full, quick); None = unlimited. The op suite's 300 s is the budget.
BUDGETS = {"op": (300, 60), "decode": (120, 40), "e2e": (300, 150), "decode_e2e": (480, 170),
           "cpu": (None, None), "gqa": (420, 180),
           "genai": (None, None), "genai_fidelity": (None, None)}
GRACE_S = 45  # a child past its budget gets this long to finish its current step


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", choices=("op", "decode", "e2e", "decode_e2e", "cpu", "gqa", "genai", "genai_fidelity", "all"),
                   default="all", help="all = the device's published suites (gqa, genai and genai_fidelity: "
                   "GroupQueryAttention op level, end to end through ONNX Runtime GenAI, and its teacher-forced "
                   "logits step by step, run when named)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--quick", action="store_true", help="a smaller grid (op suite ~1 minute on the H200)")
    p.add_argument("--out", default="bench-results.json", help="result JSON (written as it goes)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="wall-clock seconds for the run (split over suites under --suite all); "
                        "configurations past it are listed as not run")
    p.add_argument("--peers", nargs="+", default=None, help="only these peers (names as in the tables)")
    p.add_argument("--seqlens", type=int, nargs="+", default=None, help="op/e2e/cpu sequence lengths; gqa prefill lengths")
    p.add_argument("--dtypes", nargs="+", default=None, choices=("float16", "bfloat16", "float32"))
    p.add_argument("--head-dims", type=int, nargs="+", default=None)
    p.add_argument("--batches", type=int, nargs="+", default=None, help="decode / decode_e2e / gqa decode batch sizes")
    p.add_argument("--caches", type=int, nargs="+", default=None,
                   help="decode and gqa KV cache lengths; decode_e2e past lengths")
    p.add_argument("--models", nargs="+", default=None,
                   help="e2e models (bert-base gpt2-medium llama-1b); decode_e2e: llama-1b")
    p.add_argument("--genai-model", type=int, nargs=4, default=None, metavar=("LAYERS", "HIDDEN", "HEADS", "KV_HEADS"),
                   help="genai: the LLaMA-shaped model (default 16 2048 32 8 on CUDA, 2 256 8 2 on the CPU)")
    p.add_argument("--sinks", action="store_true",
                   help="gqa: every node with attention sinks (head_sink, as gpt-oss)")
    p.add_argument("--qk-norm", action="store_true",
                   help="gqa: every node with fused Q/K norms (q_norm_weight, k_norm_weight, as Qwen3's CUDA builds)")
    p.add_argument("--window", type=int, default=None, metavar="W",
                   help="gqa: every node with a window-sized KV cache (local_window_size=W, sliding_window_cache=1, "
                        "a buffer of W rows, as GenAI's builder writes Mistral's and Gemma 2's windowed layers)")
    p.add_argument("--with-fp8", action="store_true",
                   help="genai and genai_fidelity suites: also the rewrite with --attention-precision fp8 "
                        "(a third variant, ort_flash_fp8)")
    p.add_argument("--steps", type=int, default=None,
                   help="genai_fidelity: decode steps fed after the prompt (default 128 on CUDA)")
    p.add_argument("--e2e-layers", type=int, default=None,
                   help="cut every e2e / decode_e2e model to this many layers")
    p.add_argument("--cache-dir", default=os.environ.get("ORT_FLASH_BENCH_CACHE",
                                                        os.path.join(tempfile.gettempdir(), "ort_flash_bench")),
                   help="where e2e / decode_e2e exports and genai models are cached")
    p.add_argument("--cuda-graph", choices=("auto", "on", "off"), default="auto",
                   help="capture CUDA graphs (auto: the op, decode and gqa suites, where launch cost matters)")
    p.add_argument("--report", default=None, metavar="MD",
                   help="also write this Markdown report (PNG plots beside it) from --out and --merge")
    p.add_argument("--merge", nargs="*", default=[], help="earlier result JSON files for --report")
    p.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0)


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    from ort_flash.demo import pick_device
    return pick_device("auto")


def suite_budget(args, suite: str, device: str, share: float = 1.0) -> float | None:
    """--budget-s (its share under `all`), else the suite's GPU budget; unlimited on the CPU."""
    if args.budget_s is not None:
        return args.budget_s * share
    return BUDGETS[suite][1 if args.quick else 0] if device == "cuda" else None


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    if device == "cpu" and "torch" not in sys.modules:
        # Peers take turns on the same cores: torch's OpenMP workers must not keep spinning
        # after their call returns, or the next peer (ours, in the round-robin) runs on busy
        # cores. Only where the user has not chosen a policy; torch reads it when first imported.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    suites = SUITES_BY_DEVICE[device] if args.suite == "all" else (args.suite,)
    if len(suites) == 1 or args.in_process:
        status = 0
        for s in suites:
            status |= run_in_process(args, s, device)
    else:
        status = run_children(args, suites, device)
    if args.report:
        from ort_flash.bench.report import write_report
        write_report([*args.merge, args.out], args.report)
        print(f"wrote {args.report}")
    return status


def run_in_process(args, suite_name: str, device: str) -> int:
    from ort_flash.bench import suites

    return suites.run_suite(args, suite_name, device, suite_budget(args, suite_name, device))


def run_children(args, suite_names, device: str) -> int:
    """Each suite in a child process; their documents merged into --out."""
    weights = {s: BUDGETS[s][1 if args.quick else 0] or 60 for s in suite_names}
    total = sum(weights.values())
    merged, status = None, 0
    out = pathlib.Path(args.out)
    for s in suite_names:
        budget = suite_budget(args, s, device, weights[s] / total)
        part = out.with_name(f"{out.stem}.{s}{out.suffix or '.json'}")
        cmd = [sys.executable, "-m", "ort_flash.cli", "bench", "--suite", s, "--device", device,
               "--out", str(part), "--in-process", *_passthrough(args)]
        if budget is not None:
            cmd += ["--budget-s", f"{budget:.0f}"]
        print(f"== suite {s}: {' '.join(cmd[2:])}", flush=True)
        t0 = time.monotonic()
        try:
            rc = subprocess.run(cmd, timeout=None if budget is None else budget + GRACE_S).returncode
        except subprocess.TimeoutExpired:
            rc = 124
            print(f"== suite {s} stopped after {time.monotonic() - t0:.0f} s (budget {budget:.0f} s)")
        status |= int(rc != 0)
        try:
            doc = json.loads(part.read_text())
        except (OSError, json.JSONDecodeError):
            print(f"== suite {s} left no results (exit {rc})")
            continue
        if rc != 0 and s in doc["suites"]:
            doc["suites"][s]["status"] = "partial" if doc["suites"][s]["rows"] else "failed"
            doc["suites"][s]["notes"].append(f"suite process ended with exit status {rc}")
        if merged is None:
            merged = doc
        else:
            merged["suites"].update(doc["suites"])
        results.save(merged, out)
    if merged is not None:
        merged["command"] = " ".join(sys.argv)
        results.save(merged, out)
        print(f"wrote {out}")
    return status


def _passthrough(args) -> list[str]:
    out = []
    if args.quick:
        out.append("--quick")
    if getattr(args, "sinks", False):
        out.append("--sinks")
    if getattr(args, "qk_norm", False):
        out.append("--qk-norm")
    for flag in ("peers", "seqlens", "dtypes", "head_dims", "batches", "caches", "models", "genai_model"):
        v = getattr(args, flag)
        if v:
            out += ["--" + flag.replace("_", "-"), *map(str, v)]
    for flag in ("e2e_layers", "steps", "window", "cache_dir", "cuda_graph", "seed"):
        v = getattr(args, flag)
        if v is not None:
            out += ["--" + flag.replace("_", "-"), str(v)]
    return out
