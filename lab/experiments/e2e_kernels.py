"""Where the GPU time of an end-to-end model goes: every CUDA kernel each variant of the e2e
benchmark launches (``ort_flash/bench/e2e_suite.py``: original, ort_flash, ort_optimizer,
ort_flash_opt), read by CUPTI through torch.profiler, summed per kernel class and per kernel.

ONNX Runtime's own profiler times a CUDA node by its launch on the host, not by its kernels;
CUPTI sees every kernel the process launches (ONNX Runtime's cuBLAS and fused kernels, and the
ort_flash cubins launched through the driver API) with its device start and end.

    python lab/experiments/e2e_kernels.py --model bert-base --layers 4 --shapes 8x512p 1x2048 1x4096 --out kernels.json
    python lab/experiments/e2e_kernels.py ... --without bias_fold packed_qkv,bias_fold   # same-run A/B of those steps

Run on the GPU machine with onnxruntime-gpu and the ort_flash build importable (lab/gpu/gpu_env.sh).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

# Kernel classes by name, first match wins (lower-case substrings).
CLASSES = (
    ("attention (ort_flash)", ("flash_fwd", "flash_decode", "flash_combine", "gluon")),
    ("attention (ORT)", ("fmha", "flash", "attention", "attn", "softmax")),
    ("GEMM", ("gemm", "xmma", "cutlass", "cublas", "sm90_", "sm80_", "wgmma")),
    ("layer norm", ("layernorm", "layer_norm", "skiplayernorm")),
    ("bias / transpose", ("transpose", "addbias", "add_bias", "biasgelu", "fastgelu", "gelu")),
    ("copy", ("memcpy", "memset", "copy", "concat", "split", "slice")),
)


def classify(name: str) -> str:
    low = name.lower()
    for label, keys in CLASSES:
        if any(k in low for k in keys):
            return label
    return "elementwise / other"


def kernels_per_run(timer, runs: int) -> tuple[dict[str, float], int]:
    """{kernel name: device microseconds per run} and the kernel launches per run, over ``runs`` runs."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(runs):
            timer.run_once(i)
        torch.cuda.synchronize()
    # The trace, not prof.events(): kernels launched outside torch (by ONNX Runtime, and through
    # the driver API) have no torch op to hang under, and the trace lists every one.
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    per = collections.Counter()
    launches = 0
    for e in trace.get("traceEvents", []):
        if e.get("cat") == "kernel":
            per[e["name"]] += e["dur"] / runs  # microseconds
            launches += 1
    return dict(per), launches // runs


def ablated(bm, spec, flash_opt_path: pathlib.Path, without: tuple[str, ...]) -> pathlib.Path:
    """ort_flash_opt as the recipe writes it without some of its steps, for a same-run A/B:
    ``without`` names rewriter refinement families (``packed_qkv``, ``bias_fold``, ...) left out
    of the rewriter's list for this one rewrite, and/or ``embed`` (ort_fusions' EmbedLayerNormalization
    step after ONNX Runtime's optimizer declined it)."""
    from ort_flash import ort_fusions
    from ort_flash.bench.e2e_suite import OPTIMIZER_TYPE
    from ort_flash.rewriter import pipeline

    fp32 = flash_opt_path.with_name("model.onnx")
    saved, saved_embed = pipeline.REFINEMENTS, ort_fusions._fuse_embeddings
    pipeline.REFINEMENTS = tuple(r for r in saved if r.FAMILY not in without)
    if "embed" in without:
        ort_fusions._fuse_embeddings = lambda opt: None
    try:
        result = ort_fusions.rewrite(str(fp32), OPTIMIZER_TYPE[spec.family], float16=True,
                                     num_heads=spec.heads, hidden_size=spec.hidden, use_gpu=True)
    finally:
        pipeline.REFINEMENTS, ort_fusions._fuse_embeddings = saved, saved_embed
    assert not set(without) & {family for f in result.report.fused for family in f.refined_by}
    out = flash_opt_path.with_name(f"model.flashopt.without-{'-'.join(without)}.onnx")
    bm.save(result.model, out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert-base")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--shapes", nargs="+", default=["1x512", "1x2048"],
                    help="BxS per run; a trailing p pads the batch as a tokenizer would (row 0 full, the "
                         "others right-padded to a length drawn from [S/2, S]), e.g. 8x512p")
    ap.add_argument("--runs", type=int, default=10, help="runs profiled per variant (the kernel sums)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds per shape (the wall medians)")
    ap.add_argument("--variants", nargs="+", default=["ort_flash", "ort_optimizer", "ort_flash_opt"])
    ap.add_argument("--cache-dir", default="/tmp/ort_flash_bench")
    ap.add_argument("--without", nargs="+", default=[], metavar="STEP[,STEP]",
                    help="also ort_flash_opt made without these steps (rewriter refinement families such as "
                         "packed_qkv or bias_fold, or embed: the EmbedLayerNormalization step), one variant per "
                         "argument, for a same-run A/B, e.g. --without bias_fold bias_fold,embed packed_qkv,bias_fold")
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args()

    import onnxruntime as ort

    from ort_flash.bench import bench_models as bm
    from ort_flash.bench import e2e_suite
    from ort_flash.timing import SessionTimer, interleaved_medians

    ort.preload_dlls()
    spec = bm.SPECS[args.model].scaled(args.layers)
    paths, info = e2e_suite.prepare(bm, spec, "float16", pathlib.Path(args.cache_dir), "cuda")
    if "ort_flash_opt" in paths:
        info["ort_flash_opt"]["verify"] = e2e_suite.check("cuda", paths["original"], paths["ort_flash_opt"])
    result = {"model": args.model, "layers": args.layers, "runs": args.runs,
              "fused": info.get("attention_nodes"), "verify": (info.get("ort_flash_opt") or {}).get("verify"),
              "rows": []}
    ablations = {}
    for arg in args.without:
        without = tuple(arg.split(","))
        name = "ort_flash_opt-" + "-".join(without)
        paths[name] = ablated(bm, spec, paths["ort_flash_opt"], without)
        ablations[name] = {"without": list(without),
                           "verify": e2e_suite.check("cuda", paths["original"], paths[name])}
    result["ablations"] = ablations
    sessions = {v: e2e_suite.open_session("cuda", v.split("-")[0], paths[v])
                for v in [*args.variants, *ablations] if v in paths}
    for shape in args.shapes:
        padded = shape.endswith("p")
        batch, s = (int(x) for x in shape.rstrip("p").split("x"))
        rng = np.random.default_rng(s)
        feeds = []
        for _ in range(3):
            mask = np.ones((batch, s), dtype=np.int64)
            if padded:
                for row in range(1, batch):
                    mask[row, rng.integers(s // 2, s + 1):] = 0
            feeds.append({"input_ids": rng.integers(1, spec.vocab, (batch, s), dtype=np.int64),
                          "attention_mask": mask})
        timers = {v: SessionTimer(sess, feeds, "cuda") for v, sess in sessions.items()}
        walls = dict(zip(timers, interleaved_medians(list(timers.values()), args.rounds, warmup=3)))
        print(f"\n{args.model} L{args.layers} {shape}: median wall ms "
              + ", ".join(f"{v} {ms:.3f}" for v, ms in walls.items()))
        for v, timer in timers.items():
            per, launches = kernels_per_run(timer, args.runs)
            by_class = collections.Counter()
            for name, us in per.items():
                by_class[classify(name)] += us
            busy = sum(per.values())
            result["rows"].append({"variant": v, "batch": batch, "seqlen": s, "padded": padded, "wall_ms": walls[v], "kernel_us": busy,
                                   "launches": launches, "by_class_us": dict(by_class),
                                   "kernels_us": dict(sorted(per.items(), key=lambda kv: -kv[1]))})
            print(f"  {v}: kernels {busy:.1f} us in {launches} launches, wall {walls[v] * 1e3:.1f} us")
            for label, us in by_class.most_common():
                print(f"    {label:22s} {us:8.1f} us")
            for name, us in sorted(per.items(), key=lambda kv: -kv[1])[:8]:
                print(f"      {us:8.1f} us  {name[:100]}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
