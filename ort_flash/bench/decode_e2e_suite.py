"""End to end, one decoding step: the LLaMA-style ~1B GQA model (``ort_flash.bench.bench_models``
spec ``llama-1b``: 16 layers, hidden 2048, 32 query / 8 KV heads, head dim 64) generating one
token against a KV cache of P tokens, in ONNX Runtime, fp16 on CUDA. Three variants of the same step:

* ``original``: the TorchScript export of one cached step (``bench_models.export(...,
  cache=True)``: input_ids (B, 1), attention_mask (B, P + 1), past_key_i / past_value_i
  (B, 8, P, 64) per layer -> last_hidden_state (B, 1, 2048), present_key_i / present_value_i
  (B, 8, P + 1, 64)). Its attention is MatMul-Softmax-MatMul over Concat(past, new), with the
  8 KV heads expanded to 32 (repeat_kv) and an additive mask built from attention_mask;
* ``ort_flash``: ``ort_flash.rewrite`` of that export. Each layer's attention becomes one
  FlashAttention node that reads the 8 KV heads as they are and takes the cache as its
  past_key / past_value inputs (the ``kv_cache`` rule: present = past ++ new is the op's output);
* ``ort_optimizer``: ``onnxruntime.transformers.optimizer`` of the fp32 step (the e2e suite's
  recipe: model_type gpt2, opt_level 0), then converted to fp16 inputs and outputs included (a
  float32 cache would be cast every step). What it fused is recorded in the JSON.

Before timing, the rewrite report is checked (attentions fused, how many took the cache as
past/present) and ``ort_flash.verify`` compares the rewritten step with the original on the
suite's device (batch 2, one new token, a 64-token cache, every output including the presents).
A rewrite that fused nothing gives ``ort_flash`` rows without a time that say so; outputs that
differ mark its rows ``mismatch`` (timed, no ratio).

What is timed: one step, ``run_with_iobinding``, the host clock around the run and the device
synchronization after it, the median over up to 100 steps after warm-up
(``ort_flash.timing.SessionTimer``): the latency of one generation step in a loop without CUDA
graphs, ONNX Runtime's host work included, as a user pays it. Every input (ids, an all-ones
mask, each layer's past filled with N(0, 1) on the device) and every output (last_hidden_state
and each present) is bound by pointer to a buffer allocated on the device beforehand, several
sets rotated where one is small, so no host copy or allocation is timed; the three variants get
the same values. Each step writes past ++ new into present (the ONNX past/present interface,
in all three variants alike), so it moves the cache about three times (attention reads it, the
copy reads and writes it); the op-level decode suite times the op on a static cache, no copy.

``ort_mb`` (CUDA): device memory in use after the steps at a shape minus the reading before the
session existed, less what torch reserved for the bound buffers meanwhile: what ONNX Runtime
holds (weights, arena: activations and workspaces). The arena only grows, so shapes run smallest
cache first and each reading is the most held up to that shape. On the CPU (harness tests) the
model has the e2e suite's tiny CPU width, fp32 on the CPU EP, and memory is not read (the
process RSS at those sizes is allocator noise).
"""
from __future__ import annotations

import dataclasses
import gc
import pathlib
import time

import numpy as np

from ort_flash.bench import bench_models, e2e_suite, memory, results
from ort_flash.bench.measure import Budget, Context, add_ratios
from ort_flash.bench.op_suite import verdict
from ort_flash.bench.tables import text_table
from ort_flash.bench.tensors import Tensors, rotation_sets

VARIANTS = e2e_suite.VARIANTS[:3]  # original, ort_flash, ort_optimizer (no ort_flash_opt for the step)
# The context the cache lengths assume (LLaMA 3.2 1B's); LLaMA's rotary embedding computes its
# angles from the position ids, so the export does not depend on it.
MAX_POSITIONS = 131072
VERIFY = dict(batch=2, seq_len=1, past_len=64, seed=0)  # ort_flash.verify's feeds for the step
MAX_REPEAT = 100


def grid(device: str, quick: bool, overrides: dict | None = None) -> dict:
    o = overrides or {}
    if device == "cuda":
        g = dict(dtype="float16", models=["llama-1b"], batches=[1, 8],
                 pasts=[1024, 4096, 16384] if quick else [1024, 4096, 16384, 32768],
                 layers=o.get("layers") or (4 if quick else None), tiny=False)
    else:
        g = dict(dtype="float32", models=["llama-1b"], batches=[1, 2],
                 pasts=[64, 256] if quick else [128, 512, 1024], layers=o.get("layers") or 2, tiny=True)
    if o.get("models"):
        g["models"] = o["models"]
    if o.get("batches"):
        g["batches"] = o["batches"]
    if o.get("caches"):
        g["pasts"] = o["caches"]
    return g


def specs(g: dict) -> list:
    """The e2e suite's specs of the grid's models (tiny on the CPU), LLaMA family only, with the
    context raised to MAX_POSITIONS."""
    out = []
    for spec in e2e_suite.specs(g):
        if spec.family != "llama":
            raise ValueError(f"decode_e2e times the LLaMA-style model; {spec.name} is {spec.family}")
        out.append(dataclasses.replace(spec, max_positions=MAX_POSITIONS))
    return out


def configs(g: dict) -> list[tuple[int, int]]:
    """(batch, past) pairs, smallest cache first (the memory readings only grow)."""
    return sorted(((b, p) for b in g["batches"] for p in g["pasts"]), key=lambda bp: (bp[0] * bp[1], bp[1]))


def _config(spec, batch: int, past: int, g: dict) -> dict:
    return {"model": spec.name, "layers": spec.layers, "batch": batch, "past": past, "dtype": g["dtype"]}


def run(ctx: Context, suite: dict, ceilings: dict, budget: Budget, args, save, progress) -> None:
    g = suite["grid"]
    bm = bench_models
    cache_dir = pathlib.Path(getattr(args, "cache_dir", None) or "/tmp/ort_flash_bench")
    seed = getattr(args, "seed", 0) or 0
    suite["models"] = {}
    for spec in progress(specs(g), desc=f"decode_e2e ({ctx.device})", unit="model"):
        todo = configs(g)
        if not budget.allows(e2e_suite.prepare_estimate_s(spec)):
            suite["not_run"] += [_config(spec, b, p, g) for b, p in todo]
            suite["notes"].append(f"time budget reached before {spec.name}")
            continue
        t0 = time.monotonic()
        try:
            paths, info = e2e_suite.prepare(bm, spec, g["dtype"], cache_dir, ctx.device, cache=True)
        except Exception as e:  # noqa: BLE001 - an export that fails is a result; go on
            reason = f"export failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            paths, info = {}, {"spec": {**spec.__dict__, "parameters": spec.parameters()},
                               **{f"{v}_error": reason for v in VARIANTS}}
        if "ort_optimizer_error" in info:
            suite["notes"].append(f"{spec.name}: no ort_optimizer variant: {info['ort_optimizer_error']}")
        if "ort_flash" in paths:
            info["verify"] = e2e_suite.check(ctx.device, paths["original"], paths["ort_flash"], VERIFY)
        info["prepare_s"] = time.monotonic() - t0
        suite["models"][spec.name] = info
        save()
        for variant in VARIANTS:
            blocked = _blocked(variant, paths, info)
            if blocked:
                status = "unsupported" if variant in paths else "error"
                suite["rows"].extend({"config": _config(spec, b, p, g), "peer": variant, "status": status,
                                      "reason": blocked} for b, p in todo)
                continue
            suite["rows"].extend(time_variant(ctx, spec, g, variant, paths[variant], budget, suite, seed))
            save()
        for b, p in todo:
            _ratios([r for r in suite["rows"] if r["config"] == _config(spec, b, p, g)])
        save()


def _blocked(variant: str, paths: dict, info: dict) -> str | None:
    """Why a variant is not timed: no model file, or (ort_flash) a rewrite that fused nothing."""
    if variant not in paths:
        return info.get(f"{variant}_error", "model not prepared")
    rewrite = info.get("rewrite") or {}
    if variant == "ort_flash" and not rewrite.get("fused"):
        why = "; ".join(rewrite.get("unfused") or []) or "no attention found"
        return f"the rewrite fused no attention ({why}): the model is the original, not timed as ort_flash"
    return None


def _fusion_note(spec, info: dict) -> str | None:
    """What a partial rewrite left out (None when every layer fused and took the cache)."""
    rw = info.get("rewrite") or {}
    fused, cached = rw.get("fused", 0), rw.get("past_present", 0)
    if fused >= spec.layers and cached >= fused:
        return None
    return (f"the rewrite fused {fused} of {spec.layers} attention layers, {cached} with the cache as "
            f"past/present ({'; '.join(rw.get('unfused') or rw.get('declined') or []) or 'see the JSON'})")


def step_buffers(tensors: Tensors, spec, batch: int, past: int, dtype: str, rng) -> tuple[dict, dict]:
    """One set of bound buffers for a step: (inputs, outputs) by graph name."""
    kv = (batch, spec.kv_heads, past, spec.head_dim)
    inputs = {"input_ids": tensors.values(rng.integers(1, spec.vocab, (batch, 1)), "int64"),
              "attention_mask": tensors.values(np.ones((batch, past + 1)), "int64")}
    outputs = {"last_hidden_state": tensors.empty((batch, 1, spec.hidden), dtype)}
    for i in range(spec.layers):
        for name in ("key", "value"):
            inputs[f"past_{name}_{i}"] = tensors.randn(kv, dtype)
            outputs[f"present_{name}_{i}"] = tensors.empty(kv[:2] + (past + 1,) + kv[3:], dtype)
    return inputs, outputs


def bind(session, inputs: dict, outputs: dict):
    """An IOBinding of ``session`` to the buffers, by pointer (no copies, nothing allocated)."""
    io = session.io_binding()
    for name, buf in inputs.items():
        io.bind_input(name, buf.device, 0, buf.onnx_type, list(buf.shape), buf.ptr)
    for name, buf in outputs.items():
        io.bind_output(name, buf.device, 0, buf.onnx_type, list(buf.shape), buf.ptr)
    return io


def cache_bytes(spec, batch: int, past: int, dtype: str) -> int:
    """Bytes of every layer's past K and V."""
    item = 4 if dtype == "float32" else 2
    return 2 * spec.layers * batch * spec.kv_heads * past * spec.head_dim * item


def time_variant(ctx: Context, spec, g: dict, variant: str, path, budget: Budget, suite, seed: int) -> list[dict]:
    from ort_flash.timing import SessionTimer

    torch = ctx.tensors.torch
    rows = []
    gc.collect()
    ctx.tensors.release_cache()
    mem0, torch0 = _memory(ctx)
    t0 = time.monotonic()
    try:
        sess = e2e_suite.open_session(ctx.device, variant, path)
    except Exception as e:  # noqa: BLE001
        return [{"config": _config(spec, b, p, g), "peer": variant, "status": "error",
                 "reason": f"session: {str(e).splitlines()[0][:300]}"} for b, p in configs(g)]
    load_s = time.monotonic() - t0
    info = suite["models"][spec.name]
    note = _fusion_note(spec, info) if variant == "ort_flash" else None
    check = info.get("verify") or {}
    failed, failed_at = None, None
    for k, (b, p) in enumerate(configs(g)):
        row = {"config": _config(spec, b, p, g), "peer": variant, "session_s": load_s}
        if failed and b >= failed_at[0] and p >= failed_at[1]:  # as large in batch and cache: fails too
            rows.append(row | {"status": "error", "reason": failed})
            continue
        if not budget.allows(5):
            suite["not_run"].append(row["config"] | {"variant": variant})
            continue
        # The same values for every variant: buffers drawn from a generator seeded by the shape.
        tensors = Tensors(ctx.device, seed=seed * 1000 + k)
        rng = np.random.default_rng(seed * 1000 + k)
        nbytes = 2 * cache_bytes(spec, b, p, g["dtype"])  # past and present
        try:
            sets = [step_buffers(tensors, spec, b, p, g["dtype"], rng) for _ in range(rotation_sets(nbytes))]
            tensors.synchronize()  # the fills ran on torch's stream; ONNX Runtime reads on its own
            bound = sum(buf.nbytes for ins, outs in sets for buf in (*ins.values(), *outs.values()))
            timer = SessionTimer(sess, [], ctx.device, bindings=[bind(sess, ins, outs) for ins, outs in sets])
            estimate = timer.median_ms(3, warmup=2)
            repeat = int(min(MAX_REPEAT, max(5, ctx.target_s * 10e3 / max(estimate, 1e-3))))
            ms = timer.median_ms(repeat, warmup=1)
            row.update(status="ok", ms=ms, repeats=repeat, sets=len(sets), tokens_per_s=b / (ms * 1e-3),
                       cache_mb=cache_bytes(spec, b, p, g["dtype"]) / 2**20)
            if ctx.device == "cuda":
                mem, by_torch = _memory(ctx)
                buffers = by_torch - torch0 if torch is not None else bound
                row.update(ort_mb=(mem - mem0 - buffers) / 2**20, memory_method=memory.method(ctx.device, torch) +
                           (", less torch.cuda.memory_reserved growth" if torch is not None else ", less the buffers"))
            if note:
                row["note"] = note
            if variant == "ort_flash" and not check.get("passed"):
                why = check.get("error") or f"outputs {check.get('failed')} beyond tolerance ({check.get('worst')})"
                row.update(status="mismatch", reason=f"ort_flash.verify against the original failed: {why}")
        except Exception as e:  # noqa: BLE001 - out of memory at long caches is a result
            failed = f"failed at batch {b}, past {p}: {str(e).splitlines()[0][:300] if str(e) else type(e).__name__}"
            failed_at = (b, p)
            row.update(status="error", reason=failed)
        rows.append(row)
        timer = sets = None
        gc.collect()
        ctx.tensors.release_cache()
        tensors.release_cache()
    del sess
    gc.collect()
    return rows


def _memory(ctx: Context) -> tuple[float, float]:
    """(device memory in use, of which torch's caching allocator reserves); (0, 0) on the CPU."""
    if ctx.device != "cuda":
        return 0.0, 0.0
    torch = ctx.tensors.torch
    return memory.used_bytes("cuda", torch), float(torch.cuda.memory_reserved()) if torch is not None else 0.0


def _ratios(group: list[dict]) -> None:
    """On the ort_flash row: its speed-up over each peer (peer ms / ours), and the best peer."""
    add_ratios(group, "ms", higher_is_better=False)
    by = {r["peer"]: r for r in group if r.get("status") == "ok"}
    ours = by.get("ort_flash")
    if ours is None:
        return
    for peer in ("original", "ort_optimizer"):
        if peer in by:
            ours[f"speedup_vs_{peer}"] = by[peer]["ms"] / ours["ms"]


def summary(suite: dict) -> tuple[list[str], list[list]]:
    """One row per (model, batch, past): step ms per variant, ORT-held MB per variant (where
    memory was read), ort_flash's speed-up over the original and over the ORT-optimizer model."""
    memory_read = any("ort_mb" in r for r in suite["rows"])
    header = ["model", "layers", "B", "past", "cache MB"] + [f"{v} ms" for v in VARIANTS] + \
             ([f"{v} MB" for v in VARIANTS] if memory_read else []) + ["ort_flash vs original", "vs ORT optimizer"]
    rows = []
    for cfg, group in results.group_by_config(suite["rows"]):
        by = {r["peer"]: r for r in group}
        mb = [by[v].get("ort_mb") if by.get(v, {}).get("status") == "ok" else None for v in VARIANTS]
        cache = next((r["cache_mb"] for r in group if "cache_mb" in r), None)
        ours = by.get("ort_flash", {})
        rows.append([cfg["model"], cfg["layers"], cfg["batch"], cfg["past"], cache,
                     *(e2e_suite.ms_cell(by.get(v)) for v in VARIANTS), *(mb if memory_read else []),
                     verdict(ours.get("speedup_vs_original")), verdict(ours.get("speedup_vs_ort_optimizer"))])
    return header, rows


def model_notes(suite: dict) -> list[str]:
    """One line per model: its size, the attention nodes of each variant, what the rewrite did,
    its verification against the original, what the ORT optimizer fused."""
    lines = []
    for name, info in suite.get("models", {}).items():
        spec, rw, v = info.get("spec", {}), info.get("rewrite") or {}, info.get("verify") or {}
        check = "not run" if not v else "passed" if v.get("passed") else \
            f"FAILED ({v.get('error') or v.get('failed')})"
        worst = v.get("worst") or {}
        lines.append(
            f"{name}: {spec.get('parameters', 0) / 1e6:.3g} M parameters at {spec.get('layers')} layers; attention "
            f"nodes {info.get('attention_nodes')}; rewrite fused {rw.get('fused')}, "
            f"{rw.get('past_present')} with the cache as past/present, masks {rw.get('masks')}"
            + (f", declined {rw['declined']}" if rw.get("declined") else "")
            + (f", unfused {rw['unfused']}" if rw.get("unfused") else "")
            + f"; verify {check}" + (f" (largest error {worst['max_abs']:.3g} in {worst['output']})" if worst else "")
            + f"; ORT optimizer fused {(info.get('optimizer') or {}).get('fused_ops')}")
    return lines


def print_summary(suite: dict) -> None:
    header, rows = summary(suite)
    memory_read = " and the memory ONNX Runtime holds" if any("ort_mb" in r for r in suite["rows"]) else ""
    print(text_table(header, rows, title=f"\ndecode step end to end on {suite['device']} ({suite['grid']['dtype']}): "
                     f"median latency of one new token against a KV cache of `past` tokens{memory_read}"))
    for line in model_notes(suite):
        print("  " + line)
    print(results.format_reasons(suite["rows"]))
