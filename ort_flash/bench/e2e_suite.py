"""End to end: whole models in ONNX Runtime, four variants of each, fp16 on CUDA.

* ``original``: the TorchScript export (``ort_flash.bench.bench_models``, eager attention, fp16);
* ``ort_flash``: what ``ort-flash rewrite`` writes by default from that export
  (``ort_fusions.rewrite_default``: the attention rewrite, after ONNX Runtime's bert fusions for an
  encoder the optimizer knows; then verified against the original as ``ort_flash_opt`` is);
* ``ort_optimizer``: ``onnxruntime.transformers.optimizer.optimize_model`` (model_type bert /
  gpt2, ``opt_level=0``, ``use_gpu=True``) of the fp32 export, then ``convert_float_to_float16
  (keep_io_types=True)``: the optimizer's documented recipe (its fusions match fp32 graphs);
* ``ort_flash_opt``: ort_flash + the ORT optimizer's non-attention fusions, as a user deploying
  with ONNX Runtime would combine them (``ort_flash.ort_fusions``): the same optimizer recipe with
  its attention fusion off (LayerNorm, SkipLayerNorm, BiasGelu / FastGelu, RotaryEmbedding, ...
  stay), converted to fp16 the same way, then ``ort_flash.rewrite`` (that order: see
  ``ort_fusions``). Before timing, ``ort_flash.verify`` compares it with the original on the
  suite's device (VERIFY's feeds); outputs that differ mark its rows ``mismatch`` (timed, no
  ratio), a rewrite that fused nothing leaves them without a time (``unsupported``).

All four run with ONNX Runtime's default session optimizations, batch 1, sequence ascending,
one session per variant. Latency: ``ort_flash.timing.SessionTimer`` (IOBinding, inputs on the
device, the median). Peak memory: device memory in use (``torch.cuda.mem_get_info``) after the
runs at each length minus the reading before the session was created. ONNX Runtime's arena only
grows (``kSameAsRequested``), so the reading after length N is the most the session has held up
to N: its peak, arena slack included, as a user pays it. ``act_mb`` subtracts the reading after
the session was created (weights, context) to leave activations and workspaces.
On the CPU (harness tests) tiny models run in fp32 and memory is the process's peak-RSS growth.
"""
from __future__ import annotations

import gc
import pathlib
import time

import numpy as np

from ort_flash.bench import bench_models, memory, results
from ort_flash.bench.measure import Budget, Context, add_ratios
from ort_flash.bench.op_suite import verdict
from ort_flash.bench.tables import fmt, text_table

VARIANTS = ("original", "ort_flash", "ort_optimizer", "ort_flash_opt")
OURS = ("ort_flash", "ort_flash_opt")  # the variants whose attention is ort_flash's op
OPTIMIZER_TYPE = {"bert": "bert", "gpt2": "gpt2", "llama": "gpt2"}
# ort_flash.verify's feeds for ort_flash_opt: batch 1 as timed (ONNX Runtime's RotaryEmbedding
# fusion of some LLaMA exports takes position ids of batch 1; its fused models refuse batch 2).
VERIFY = dict(batch=1, seq_len=37, seed=0)


def grid(device: str, quick: bool, overrides: dict | None = None) -> dict:
    o = overrides or {}
    if device == "cuda":
        g = dict(dtype="float16", models=["bert-base", "gpt2-medium", "llama-1b"], batch=1,
                 seqlens=[512, 2048, 8192] if quick else [512, 1024, 2048, 4096, 8192],
                 layers=o.get("layers") or (4 if quick else None), tiny=False)
    else:
        g = dict(dtype="float32", models=["bert-base", "gpt2-medium", "llama-1b"], batch=1,
                 seqlens=[64, 256] if quick else [128, 512, 1024], layers=o.get("layers") or 2, tiny=True)
    for key in ("models", "seqlens"):
        if o.get(key):
            g[key] = o[key]
    return g


def specs(g: dict) -> list:
    bm = bench_models
    out = []
    for name in g["models"]:
        spec = bm.SPECS[name].scaled(g["layers"])
        if g.get("tiny"):  # harness tests: same families, toy widths
            import dataclasses
            spec = dataclasses.replace(spec, hidden=128, heads=2 * (spec.heads // spec.kv_heads),
                                       kv_heads=2, intermediate=256, vocab=1000, max_positions=2048)
        out.append(spec)
    return out


def run(ctx: Context, suite: dict, ceilings: dict, budget: Budget, args, save, progress) -> None:
    g = suite["grid"]
    bm = bench_models
    cache_dir = pathlib.Path(getattr(args, "cache_dir", None) or "/tmp/ort_flash_bench")
    suite["models"] = {}
    for spec in progress(specs(g), desc=f"e2e ({ctx.device})", unit="model"):
        if not budget.allows(prepare_estimate_s(spec)):
            suite["not_run"] += [{"model": spec.name, "seqlen": s} for s in g["seqlens"]]
            suite["notes"].append(f"time budget reached before {spec.name}")
            continue
        t0 = time.monotonic()
        try:
            paths, info = prepare(bm, spec, g["dtype"], cache_dir, ctx.device)
        except Exception as e:  # noqa: BLE001 - an export that fails is a result; go on
            reason = f"export failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            paths, info = {}, {"spec": {**spec.__dict__, "parameters": spec.parameters()},
                               **{f"{v}_error": reason for v in VARIANTS}}
        if "ort_flash_opt" in paths:
            info["ort_flash_opt"]["verify"] = check(ctx.device, paths["original"], paths["ort_flash_opt"])
        if "ort_flash" in paths and (info.get("rewrite") or {}).get("ort_fusions"):  # the default ran ORT's fusions
            info["ort_flash"] = {"verify": check(ctx.device, paths["original"], paths["ort_flash"])}
        info["prepare_s"] = time.monotonic() - t0
        suite["models"][spec.name] = info
        save()
        for variant in VARIANTS:
            if variant not in paths:
                suite["rows"].extend({"config": _config(spec, s, g), "peer": variant, "status": "error",
                                      "reason": info.get(f"{variant}_error", "model not prepared")}
                                     for s in g["seqlens"])
                continue
            blocked = _blocked(variant, info)
            if blocked:
                suite["rows"].extend({"config": _config(spec, s, g), "peer": variant, "status": "unsupported",
                                      "reason": blocked} for s in g["seqlens"])
                continue
            suite["rows"].extend(time_variant(ctx, spec, g, variant, paths[variant], budget, suite))
            save()
        for s in g["seqlens"]:
            group = [r for r in suite["rows"] if r["config"] == _config(spec, s, g)]
            # best_peer / vs_best_peer of ort_flash: the best of original and ort_optimizer, as
            # before ort_flash_opt existed (that one is ort_flash too, not a competitor).
            add_ratios([r for r in group if r["peer"] != "ort_flash_opt"], "ms", higher_is_better=False)
            _vs_original(group)
        save()


def prepare_estimate_s(spec) -> float:
    """A rough lower bound on export (fp16 and fp32) + rewrite + optimizer + the first sessions
    (ort_flash_opt's optimizer run, rewrite and verification come on top); a model that cannot
    finish inside the budget is not started."""
    return 20.0 + 120.0 * spec.parameters() / 1e9


def _config(spec, seqlen: int, g: dict) -> dict:
    return {"model": spec.name, "layers": spec.layers, "seqlen": seqlen, "batch": g["batch"], "dtype": g["dtype"]}


def prepare(bm, spec, dtype: str, cache_dir: pathlib.Path, device: str, *,
            cache: bool = False) -> tuple[dict, dict]:
    """The model file of each variant, and what was done to make them (fusion counts, times).
    ``cache``: of the model's decoding step with a KV cache (the decode_e2e suite, which has the
    first three variants: no ort_flash_opt); the rewrite report then also counts the attentions
    whose Concat(past, new) became the op's past/present."""
    import onnx

    from ort_flash import ort_fusions

    info = {"spec": {**spec.__dict__, "head_dim": spec.head_dim, "parameters": spec.parameters()}}
    paths = {}
    t0 = time.monotonic()
    original, cached = bm.cached_export(spec, cache_dir, dtype, cache=cache)
    info.update(export_s=time.monotonic() - t0, export_cached=cached)
    paths["original"] = original
    try:
        t0 = time.monotonic()
        done = ort_fusions.rewrite_default(str(original))  # what `ort-flash rewrite` does by default
        result = done.result
        out = original.with_name("model.flash.onnx")
        bm.save(result.model, out)
        paths["ort_flash"] = out
        report = result.report
        info["rewrite"] = {"fused": report.total_fused, "seconds": time.monotonic() - t0,
                           "unfused": sorted({u.reason for u in report.unfused}),
                           "ort_fusions": done.ort_fusions.to_dict() if done.ort_fusions else None,
                           "note": done.note}
        if cache:
            info["rewrite"].update(
                past_present=sum(bool(f.cache) for f in report.fused),
                causal=sum(f.causal for f in report.fused),
                masks=sorted({f.mask for f in report.fused}),
                declined=sorted({f"{rule}: {why}" for d in report.declined.values() for rule, why in d.items()}))
        del result, report
    except Exception as e:  # noqa: BLE001
        info["ort_flash_error"] = f"rewrite failed: {type(e).__name__}: {e}"
    try:
        t0 = time.monotonic()
        paths["ort_optimizer"], info["optimizer"] = optimize(bm, spec, dtype, cache_dir, device, cache=cache)
        info["optimizer"]["seconds"] = time.monotonic() - t0
    except Exception as e:  # noqa: BLE001
        info["ort_optimizer_error"] = f"optimizer failed: {type(e).__name__}: {str(e)[:300]}"
    if not cache:
        try:
            t0 = time.monotonic()
            paths["ort_flash_opt"], info["ort_flash_opt"] = flash_with_ort_fusions(bm, spec, dtype, cache_dir, device)
            info["ort_flash_opt"]["seconds"] = time.monotonic() - t0
        except Exception as e:  # noqa: BLE001
            info["ort_flash_opt_error"] = f"ort_fusions failed: {type(e).__name__}: {str(e)[:300]}"
    info["attention_nodes"] = {k: _count_ops(onnx.load(str(p), load_external_data=False))
                               for k, p in paths.items()}
    gc.collect()
    return paths, info


def optimize(bm, spec, dtype: str, cache_dir, device: str, *, cache: bool = False):
    """The ORT-optimizer variant. A cached step converts its inputs and outputs to float16 too
    (``keep_io_types=False``): float32 past/present would cast the whole cache every step and
    take other buffers than the two other variants'."""
    from onnxruntime.transformers.optimizer import optimize_model

    fp32, _ = bm.cached_export(spec, cache_dir, "float32", cache=cache)
    out = fp32.with_name(f"model.ortopt.{dtype}.onnx")
    model_type = OPTIMIZER_TYPE[spec.family]
    opt = optimize_model(str(fp32), model_type=model_type, num_heads=spec.heads, hidden_size=spec.hidden,
                         opt_level=0, use_gpu=device == "cuda")
    stats = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
    if dtype == "float16":
        opt.convert_float_to_float16(keep_io_types=not cache)
    weights = sum(len(t.raw_data) for t in opt.model.graph.initializer)
    opt.save_model_to_file(str(out), use_external_data_format=weights > bm.TWO_GB - 2**26)
    return out, {"model_type": model_type, "opt_level": 0, "fused_ops": stats}


def flash_with_ort_fusions(bm, spec, dtype: str, cache_dir, device: str):
    """The ort_flash_opt variant: ``ort_flash.ort_fusions.rewrite`` of the fp32 export, i.e. the
    ort_optimizer recipe above with the optimizer's attention fusion off, the same fp16
    conversion, then ``ort_flash.rewrite`` of the result. Returns its path and what each step did."""
    from ort_flash import ort_fusions

    fp32, _ = bm.cached_export(spec, cache_dir, "float32")
    out = fp32.with_name(f"model.flashopt.{dtype}.onnx")
    result = ort_fusions.rewrite(str(fp32), OPTIMIZER_TYPE[spec.family], float16=dtype == "float16",
                                 num_heads=spec.heads, hidden_size=spec.hidden, use_gpu=device == "cuda")
    bm.save(result.model, out)
    report = result.report
    info = {"model_type": result.model_type, "opt_level": 0, "attention_fusion": False, "float16": result.float16,
            "fused_ops": result.ort_fused,
            "rewrite": {"fused": report.total_fused, "unfused": sorted({u.reason for u in report.unfused})}}
    return out, info


def check(device: str, original, candidate, feeds: dict | None = None) -> dict:
    """ort_flash.verify of a variant against the original on ``device`` (``feeds``: verify's
    input arguments, VERIFY by default; decode_e2e_suite passes its step's): passed, how many
    outputs were compared, and the worst output's error."""
    from ort_flash.verify import verify

    feeds = VERIFY if feeds is None else feeds
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    try:
        v = verify(str(original), str(candidate), providers=providers, **feeds)
    except Exception as e:  # noqa: BLE001 - cannot compare: say so on the rows
        return {"passed": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
    worst = max(v.outputs, key=lambda o: o.max_abs / (o.atol + o.rtol))
    return {"passed": v.passed, **feeds, "providers": v.rewritten_providers, "outputs": len(v.outputs),
            "failed": [o.name for o in v.outputs if not o.passed],
            "worst": {"output": worst.name, "max_abs": worst.max_abs, "atol": worst.atol, "rtol": worst.rtol}}


def _blocked(variant: str, info: dict) -> str | None:
    """Why a prepared variant is not timed: ort_flash_opt whose rewrite fused no attention (it
    would be the ORT optimizer's model without attention fusion, not ort_flash)."""
    rewrite = (info.get(variant) or {}).get("rewrite") or {}
    if variant == "ort_flash_opt" and not rewrite.get("fused"):
        why = "; ".join(rewrite.get("unfused") or []) or "no attention found"
        return f"the rewrite after ORT's fusions fused no attention ({why}): not timed as ort_flash_opt"
    return None


def _count_ops(model) -> dict:
    names = ("Softmax", "FlashAttention", "Attention", "MultiHeadAttention", "GroupQueryAttention")
    counts = {}
    for n in model.graph.node:
        if n.op_type in names:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def open_session(device: str, variant: str, path):
    """An ONNX Runtime session of one variant's model file, with ONNX Runtime's default
    optimizations; the ort_flash library registered for ``ort_flash``. CUDA: the CUDA EP (its
    arena growing by what is asked, so the memory readings are the session's own), with the CPU
    EP for the nodes ONNX Runtime places there (shape arithmetic)."""
    import onnxruntime as ort

    import ort_flash

    providers = (["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda"
                 else ["CPUExecutionProvider"])
    if device == "cuda":
        providers[0] = ("CUDAExecutionProvider", {"arena_extend_strategy": "kSameAsRequested"})
    so = ort_flash.session_options() if variant in OURS else ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=providers)


def time_variant(ctx: Context, spec, g: dict, variant: str, path, budget: Budget, suite) -> list[dict]:
    from ort_flash.timing import SessionTimer

    rows = []
    gc.collect()
    torch = ctx.tensors.torch
    mem0 = memory.used_bytes(ctx.device, torch)
    t0 = time.monotonic()
    try:
        sess = open_session(ctx.device, variant, path)
    except Exception as e:  # noqa: BLE001
        return [{"config": _config(spec, s, g), "peer": variant, "status": "error",
                 "reason": f"session: {str(e).splitlines()[0][:300]}"} for s in g["seqlens"]]
    load_s = time.monotonic() - t0
    mem_loaded = memory.used_bytes(ctx.device, torch)
    failed = None
    for s in g["seqlens"]:
        row = {"config": _config(spec, s, g), "peer": variant, "session_s": load_s}
        if failed:  # a longer sequence cannot fare better
            rows.append(row | {"status": "error", "reason": failed})
            continue
        if not budget.allows(5):
            suite["not_run"].append(row["config"] | {"variant": variant})
            continue
        rng = np.random.default_rng(s)
        feeds = [{"input_ids": rng.integers(1, spec.vocab, (g["batch"], s), dtype=np.int64),
                  "attention_mask": np.ones((g["batch"], s), dtype=np.int64)} for _ in range(3)]
        try:
            timer = SessionTimer(sess, feeds, ctx.device)
            t1 = time.perf_counter()
            timer.run_once(0)
            first = time.perf_counter() - t1
            repeat = int(min(20, max(3, ctx.target_s * 10 / max(first, 1e-3))))
            ms = timer.median_ms(repeat, warmup=2)
            mem = memory.used_bytes(ctx.device, torch)
            row.update(status="ok", ms=ms, repeats=repeat, tokens_per_s=g["batch"] * s / (ms * 1e-3),
                       peak_mb=(mem - mem0) / 2**20, act_mb=(mem - mem_loaded) / 2**20,
                       memory_method=memory.method(ctx.device, torch))
            verified = (suite["models"][spec.name].get(variant) or {}).get("verify")
            if verified is not None and not verified.get("passed"):
                why = verified.get("error") or \
                    f"outputs {verified.get('failed')} beyond tolerance ({verified.get('worst')})"
                row.update(status="mismatch", reason=f"ort_flash.verify against the original failed: {why}")
        except Exception as e:  # noqa: BLE001 - out of memory at long sequences is a result
            failed = f"failed at sequence {s}: {str(e).splitlines()[0][:300]}"
            row.update(status="error", reason=failed)
        rows.append(row)
        del feeds
    del sess
    gc.collect()
    return rows


def _vs_original(group: list[dict]) -> None:
    """Per successful row: its speed-up over the original and its activation memory relative to
    the original's; on ort_flash and ort_flash_opt also their speed-up over the ORT-optimizer
    model (peer ms / ours: > 1, ours is faster)."""
    by = {r["peer"]: r for r in group if r.get("status") == "ok"}
    base = by.get("original")
    opt = by.get("ort_optimizer")
    for r in by.values():
        if base is not None:
            r["speedup_vs_original"] = base["ms"] / r["ms"]
            if base.get("act_mb") and r.get("act_mb") is not None:
                r["act_mem_vs_original"] = r["act_mb"] / base["act_mb"] if base["act_mb"] > 0 else None
        if opt is not None and r["peer"] in OURS:
            r["speedup_vs_ort_optimizer"] = opt["ms"] / r["ms"]


def summary(suite: dict) -> tuple[list[str], list[list]]:
    """One row per (model, N): each variant's median ms and peak MB, then per ort_flash variant
    its speed-up over the original and over the ORT-optimizer model and its activation memory
    relative to the original's. Variants with no row in the suite (ort_flash_opt in results from
    before it existed) get no columns."""
    present = {r["peer"] for r in suite["rows"]}
    variants = [v for v in VARIANTS if v in present]
    ours = [v for v in OURS if v in present]
    header = ["model", "layers", "N"] + [f"{v} ms" for v in variants] + [f"{v} MB" for v in variants]
    for v in ours:
        header += [f"{v} vs original", f"{v} vs ORT optimizer", f"{v} act mem vs orig"]
    rows = []
    for cfg, group in results.group_by_config(suite["rows"]):
        by = {r["peer"]: r for r in group}
        ok = {v: r for v, r in by.items() if r.get("status") == "ok"}
        row = [cfg["model"], cfg["layers"], cfg["seqlen"], *(ms_cell(by.get(v)) for v in variants),
               *(ok[v].get("peak_mb") if v in ok else None for v in variants)]
        for v in ours:
            mine = ok.get(v, {})
            mem = mine.get("act_mem_vs_original")
            row += [verdict(_speedup(ok, "original", v)), verdict(_speedup(ok, "ort_optimizer", v)),
                    None if mem is None else f"{mem:.2f}"]
        rows.append(row)
    return header, rows


def _speedup(ok: dict, peer: str, ours: str) -> float | None:
    """peer ms / ours ms where both ran (computed from the times, so older results read the same)."""
    return ok[peer]["ms"] / ok[ours]["ms"] if peer in ok and ours in ok else None


def ms_cell(row: dict | None):
    """A variant's time (also a decode step's, decode_e2e_suite), or why there is none (n/a: not timed, WRONG: outputs differ; reasons
    below the table)."""
    if row is None:
        return None
    if row["status"] == "ok":
        return row["ms"]
    if row["status"] == "mismatch":
        return f"{fmt(row.get('ms'))} WRONG"
    return "n/a" if row["status"] == "unsupported" else "error"


def model_notes(suite: dict) -> list[str]:
    """One line per model: attention nodes per variant, what the ORT optimizer fused, what the
    rewrite fused and, for ort_flash_opt, what ORT fused around it and its verification."""
    lines = []
    for name, info in suite.get("models", {}).items():
        rw = info.get("rewrite") or {}
        line = (f"{name}: attention nodes {info.get('attention_nodes')}; ORT optimizer fused "
                f"{(info.get('optimizer') or {}).get('fused_ops')}; rewrite fused {rw.get('fused')}"
                f"{' ' + str(rw['unfused']) if rw.get('unfused') else ''}")
        if rw.get("ort_fusions"):
            v = (info.get("ort_flash") or {}).get("verify") or {}
            line += (f" after ORT's {rw['ort_fusions']['model_type']} fusions (the default for an encoder: "
                     f"{rw['ort_fusions']['fused']}), verify "
                     f"{'not run' if not v else 'passed' if v.get('passed') else 'FAILED'}")
        fo = info.get("ort_flash_opt")
        if fo:
            v = fo.get("verify") or {}
            check = "not run" if not v else "passed" if v.get("passed") else \
                f"FAILED ({v.get('error') or v.get('failed')})"
            worst = v.get("worst") or {}
            line += (f"; ort_flash_opt: ORT fused {fo.get('fused_ops')} (attention fusion off), then the rewrite "
                     f"fused {(fo.get('rewrite') or {}).get('fused')}, verify {check}"
                     + (f" (max abs {worst['max_abs']:.3g})" if worst else ""))
        elif info.get("ort_flash_opt_error"):
            line += f"; ort_flash_opt: {info['ort_flash_opt_error']}"
        lines.append(line)
    return lines


def print_summary(suite: dict) -> None:
    header, rows = summary(suite)
    print(text_table(header, rows, title=f"\nend to end on {suite['device']} ({suite['grid']['dtype']}, "
                     "batch 1): median latency, peak memory (see the method in the JSON)"))
    for line in model_notes(suite):
        print(f"  {line}")
    print(results.format_reasons(suite["rows"]))
