"""`ort-flash demo`: rewrite the bundled GPT-2-style model, verify it, time it against the original.

The bundled models (ort_flash/data, built by lab/models/build_demo.py) are a 2-layer GPT-2 with
random weights: fp32 for the CPU, fp16 for CUDA.
"""
from __future__ import annotations

import importlib.resources

import numpy as np

DEMO_MODELS = {"cpu": "gpt2_tiny.onnx", "cuda": "gpt2_tiny_fp16.onnx"}
PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


def demo_model_path(device: str) -> str:
    return str(importlib.resources.files("ort_flash").joinpath("data", DEMO_MODELS[device]))


def pick_device(requested: str) -> str:
    from ort_flash._onnxruntime import check_providers, import_onnxruntime

    ort = import_onnxruntime()
    if requested != "auto":
        check_providers(PROVIDERS[requested])  # CUDA on the CPU package: refused, with the reason
        return requested
    from ort_flash._cuda_device import cuda_device_arch
    if "CUDAExecutionProvider" in ort.get_available_providers() and cuda_device_arch() is not None:
        return "cuda"
    return "cpu"


def run_demo(provider: str = "auto", seq_lens=None, repeat=None, batches=None) -> int:
    import onnx

    import ort_flash
    from ort_flash.timing import SessionTimer, interleaved_medians, node_placements
    from ort_flash.verify import make_inputs, verify

    device = pick_device(provider)
    import onnxruntime as ort  # present: pick_device said what to install otherwise

    providers = PROVIDERS[device]
    if device == "cuda":
        ort.preload_dlls()
    seq_lens = seq_lens or ([512, 1024, 2048] if device == "cuda" else [256, 1024])
    repeat = repeat or (50 if device == "cuda" else 30)
    batches = batches or ([1, 8] if device == "cuda" else [1])
    path = demo_model_path(device)
    print(f"== ort-flash demo on {device.upper()} ({providers[0]}), model {path}")

    original = onnx.load(path)
    result = ort_flash.rewrite(original)
    print(result.report.format_table())
    if result.report.total_fused == 0:
        print("FAIL: nothing was fused")
        return 1

    fast_result = ort_flash.rewrite(original, exact_masked_rows=False)
    for name, model in (("default", result.model), ("--fast-padded-rows", fast_result.model)):
        check = verify(original, model, providers=providers, batch=2, seq_len=128)
        print(f"rewrite {name}:\n" + check.format_table())
        if not check.passed:
            return 1

    rewritten = result.model.SerializeToString()
    feeds = make_inputs(original, batch=1, seq_len=64, seed=0)
    placed = node_placements(rewritten, feeds, providers, ort_flash.session_options())
    fa = {prov: n for (op, prov), n in placed.items() if op == "FlashAttention"}
    print("FlashAttention nodes run by: " + ", ".join(f"{p} x{n}" for p, n in fa.items())
          + "   (from ONNX Runtime's profiler)")
    if device == "cuda" and "CUDAExecutionProvider" not in fa:
        print("FAIL: the fused op did not run on CUDA")
        return 1

    base = ort.InferenceSession(original.SerializeToString(), providers=providers)
    fused = ort_flash.InferenceSession(rewritten, providers=providers)
    fused_fast = ort_flash.InferenceSession(fast_result.model.SerializeToString(), providers=providers)
    rows = []
    for batch in batches:
        for s in seq_lens:
            sets = [make_inputs(original, batch=batch, seq_len=s, seed=i) for i in range(3)]
            timers = [SessionTimer(sess, sets, device) for sess in (base, fused, fused_fast)]
            rows.append((batch, s) + tuple(interleaved_medians(timers, repeat)))
    print(f"\nlatency in ms, median of {repeat} runs, the three models in turn (ORT default graph "
          f"optimizations for all):")
    print(f"  {'batch':>5}  {'seq':>6}  {'original':>9}  {'ort_flash':>9}  {'speedup':>8}"
          f"  {'--fast-padded-rows':>18}  {'speedup':>8}")
    for batch, s, a, b, c in rows:
        print(f"  {batch:>5}  {s:>6}  {a:>9.3f}  {b:>9.3f}  {a / b:>7.2f}x  {c:>18.3f}  {a / c:>7.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_demo())
