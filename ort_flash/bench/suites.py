"""Running one suite in this process: set up the device, describe the machine, measure the
ceilings, run the suite's grid with a progress bar, print its table, write the JSON."""
from __future__ import annotations

import importlib
import sys

from ort_flash.bench import ceilings as ceilings_mod
from ort_flash.bench import environment, results
from ort_flash.bench.measure import Budget, Context

MODULES = {"op": "ort_flash.bench.op_suite", "decode": "ort_flash.bench.decode_suite",
           "e2e": "ort_flash.bench.e2e_suite", "decode_e2e": "ort_flash.bench.decode_e2e_suite",
           "cpu": "ort_flash.bench.cpu_suite", "gqa": "ort_flash.bench.gqa_suite",
           "genai": "ort_flash.bench.genai_e2e", "genai_fidelity": "ort_flash.bench.genai_fidelity"}
TARGET_S = {False: 0.2, True: 0.1}  # timed seconds per measurement (full, quick)


def setup_device(device: str) -> None:
    """torch first (its CUDA libraries then serve ONNX Runtime too), then onnxruntime's preload."""
    if device != "cuda":
        return
    try:
        import torch  # noqa: F401 - loads its CUDA libraries first
    except ImportError:
        pass
    import onnxruntime as ort
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise SystemExit(f"onnxruntime {ort.__version__} at {ort.__file__} has no CUDA EP: put "
                         "onnxruntime-gpu first on PYTHONPATH")
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()


def progress(iterable, **kwargs):
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, file=sys.stderr, dynamic_ncols=True, **kwargs)


def overrides(args) -> dict:
    return {"seqlens": args.seqlens, "dtypes": args.dtypes, "head_dims": args.head_dims,
            "batches": args.batches, "caches": args.caches, "models": args.models,
            "layers": args.e2e_layers, "genai_model": getattr(args, "genai_model", None),
            "steps": getattr(args, "steps", None), "sinks": getattr(args, "sinks", False),
            "qk_norm": getattr(args, "qk_norm", False), "window": getattr(args, "window", None)}


def run_suite(args, name: str, device: str, budget_s: float | None) -> int:
    budget = Budget(budget_s)  # counts the setup and the ceilings too
    if name == "cpu":
        device = "cpu"
    if name in ("decode", "e2e", "decode_e2e") and device != "cuda":
        print(f"note: the {name} suite is meant for CUDA; running it on the CPU at its CPU grid")
    setup_device(device)
    module = importlib.import_module(MODULES[name])
    env = environment.describe(device)
    ceil = ceilings_mod.measure(device, quick=args.quick)
    doc = results.new_document(env, ceil, {k: v for k, v in vars(args).items() if k != "func"})
    suite = results.new_suite(device, module.grid(device, args.quick, overrides(args)), budget_s)
    suite["ceilings"] = ceil
    doc["suites"][name] = suite
    results.save(doc, args.out)
    print(f"== {name} suite on {device}: {_where(env)}; ceilings: matmul {ceil['matmul_tflops']:.3g} "
          f"TFLOP/s, copy {ceil['copy_tbps']:.3g} TB/s ({ceil['source']})", flush=True)
    graphs = {"on": True, "off": False}.get(args.cuda_graph, name in ("decode", "gqa", "op"))
    target = getattr(module, "TARGET_S", TARGET_S)[bool(args.quick)]
    ctx = Context.create(device, args.seed, target, cuda_graph=graphs and device == "cuda")
    status = 0
    try:
        module.run(ctx, suite, ceil, budget, args, lambda: results.save(doc, args.out), progress)
        suite["status"] = "partial" if suite["not_run"] else "complete"
    except KeyboardInterrupt:
        suite["status"] = "partial"
        suite["notes"].append("interrupted")
        status = 130
    except Exception as e:  # noqa: BLE001 - keep what was measured, say what broke
        import traceback
        suite["status"] = "partial" if suite["rows"] else "failed"
        suite["notes"].append(f"suite stopped by {type(e).__name__}: {e}")
        traceback.print_exc()
        status = 1
    suite["elapsed_s"] = budget.elapsed
    suite["loadavg_at_end"] = environment.loadavg()
    if environment.library_fingerprint() != env["versions"].get("library"):
        suite["notes"].append("libort_flash.so was rebuilt while this suite ran: its numbers mix two builds")
    results.save(doc, args.out)
    module.print_summary(suite)
    print(f"\n{name} suite {suite['status']} in {budget.elapsed:.0f} s; results in {args.out}")
    return status


def _where(env: dict) -> str:
    gpu = env.get("gpu") or {}
    if gpu:
        return f"{gpu.get('name')}, driver {gpu.get('driver_version')}"
    return f"{env['host']['cpu']}, {env['host']['cores']} cores"
