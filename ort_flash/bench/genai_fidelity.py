"""Teacher-forced fidelity through ONNX Runtime GenAI: does the rewritten folder compute, step by
step, what the original computes?

Greedy sequences of two low-precision models part at the first near tie, which proves nothing
either way. So both models are fed the same tokens: the prompt (one row, or two rows of different
lengths), then, one token per step, the original's greedy choice (each step one decode call of the
model over the shared KV buffer), through GenAI's ``append_tokens`` or a session fed as GenAI
feeds it (the drivers below). The logits of every step are compared.

The rounding bound is measured, not assumed. The original also runs every row's whole sequence
(prompt and the fed tokens) as one prefill, which gives the logits of every step a second time
from ONNX Runtime's other kernels. At step k, over the vocabulary, per row:

- ``diff``: max |logits(ort_flash) - logits(original)|, both decoding;
- ``noise``: the larger of max |original decoding - original prefill| at step k (ONNX Runtime's
  own two paths: the rounding between two correct implementations, at this step's logits) and
  ``diff`` at the prompt (step 0: the two prefill kernels, checked at op level against fp64);
- ``bound`` = 2 * noise + one unit of the dtype's rounding at the largest logit (the numerical
  contract of the op tests: at most twice the difference between plain implementations);
- the original's top-2 margin, and whether ort_flash's argmax is the original's.

A step passes where ``diff <= bound``. A step where the two argmaxes differ is a tie within
rounding where the original's margin there is below the bound; otherwise it is unexplained.
Folders and models come from ``genai_e2e`` (GenAI's own builder, random LLaMA-shaped weights).

``--with-fp8``: a third folder, rewritten with ``--attention-precision fp8``, fed the same tokens
in the same run; its rows (peer ``ort_flash_fp8``) report the same figures against the same
bound, as the difference FP8 makes: measured, not judged by the fp16 bound (a row fails only where
a step's logits are not finite).
"""
from __future__ import annotations

import pathlib
import time

import numpy as np

from ort_flash.bench import genai_e2e, results
from ort_flash.bench.genai_drivers import (  # noqa: F401 (the check's drivers, used by its callers too)
    DRIVERS, GenAIDriver, GenAIRewindDriver, SessionDriver, cache_windows, folder_config, padded)
from ort_flash.bench.measure import Budget, Context
from ort_flash.bench.tables import text_table

VARIANTS = genai_e2e.VARIANTS
FP8_VARIANT = genai_e2e.FP8_VARIANT
# One unit of rounding (2^-mantissa bits) at the largest logit: the floor of the bound.
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23}
TARGET_S = {False: 0.0, True: 0.0}  # nothing is timed


def grid(device: str, quick: bool, overrides: dict | None = None) -> dict:
    o = overrides or {}
    if device == "cuda":
        g = dict(models=[[16, 2048, 32, 8], [4, 4096, 32, 8]], dtypes=["float16", "bfloat16"],
                 vocab=32000, prompts=[128, 2048, 16384] if quick else [128, 512, 2048, 8192, 16384],
                 batches=[1, 2], steps=32 if quick else 128)
    else:
        g = dict(models=[[2, 256, 4, 2], [2, 256, 8, 2]], dtypes=["float32"], vocab=512,
                 prompts=[64, 200] if quick else [64, 128, 256, 512], batches=[1, 2],
                 steps=16 if quick else 64)
    if o.get("genai_model"):
        g["models"] = [list(o["genai_model"])]
    for key, name in (("dtypes", "dtypes"), ("seqlens", "prompts"), ("batches", "batches")):
        if o.get(key):
            g[name] = list(o[key])
    if o.get("steps"):
        g["steps"] = o["steps"]
    return g


def model_grid(g: dict, model: list[int], dtype: str, device: str) -> dict:
    """The genai_e2e grid of one model: the same folders (and cache) as the timing suite, whose
    default contexts set the positions the builder writes."""
    e2e = genai_e2e.grid(device, quick=False)
    layers, hidden, heads, kv_heads = model
    return dict(e2e, dtype=dtype, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                vocab=g["vocab"], prompts=g["prompts"],
                contexts=[max(max(e2e["contexts"]), max(g["prompts"]) + g["steps"])])


def prepare(g: dict, device: str, cache: pathlib.Path, models: list | None = None) -> list[pathlib.Path]:
    """GenAI's builder output for the grid's models (or ``models``) in every dtype, into the cache
    the suite reads (so that a GPU session can build them while it runs something else)."""
    return [genai_e2e.genai_folder(model_grid(g, m, dtype, device), device, cache)
            for m in (models or g["models"]) for dtype in g["dtypes"]]


def prompt_rows(rng: np.random.Generator, tokens: int, batch: int, vocab: int) -> list[np.ndarray]:
    """Random prompts: the first row ``tokens`` long, the second (batch 2) about three quarters of it
    and odd, so that GenAI pads it."""
    lengths = [tokens] + [max(1, (3 * tokens) // 4 - 1) | 1 for _ in range(batch - 1)]
    return [rng.integers(3, vocab, n).astype(np.int32) for n in lengths]


def teacher_forced(drivers: dict, rows: list[np.ndarray], steps: int) -> tuple[dict, np.ndarray]:
    """Every driver fed the same tokens: the prompt rows (one batch), then ``steps`` times the
    original's greedy choice of every row, one token a call. Returns each driver's logits of every
    step (float32, (steps + 1, B, vocabulary): step 0 is the prompt's) and the fed tokens
    (steps, B)."""
    max_length = max(len(r) for r in rows) + steps + 1
    logits = {v: [d.start(rows, max_length)] for v, d in drivers.items()}
    fed = []
    for _ in range(steps):
        token = logits["original"][-1].argmax(-1).astype(np.int32)
        fed.append(token)
        for v, d in drivers.items():
            logits[v].append(d.feed(token))
    for d in drivers.values():
        d.close()
    return {v: np.stack(x) for v, x in logits.items()}, np.stack(fed) if fed else np.zeros((0, len(rows)), np.int32)


def prefill(session, rows: list[np.ndarray], fed: np.ndarray) -> np.ndarray:
    """The model's logits of every step again, from one prefill per row of its whole sequence
    (float32, (steps + 1, B, vocabulary))."""
    steps = fed.shape[0]
    return np.stack([session.prefill(np.concatenate([row, fed[:, b]]), steps + 1) for b, row in enumerate(rows)], axis=1)


def compare(decode: dict, prefill: np.ndarray, dtype: str, variant: str = "ort_flash") -> list[dict]:
    """Per step and row: diff, noise, bound, the original's margin, argmax agreement (the module's
    docstring defines them) of ``variant`` against the original. ``prefill``: the original's
    logits of every step from its prefill."""
    do, df = decode["original"], decode[variant]
    at_prompt = np.abs(df[0] - do[0]).max(-1)
    out = []
    for k in range(do.shape[0]):
        diff = np.abs(df[k] - do[k]).max(-1)
        noise = np.maximum(np.abs(do[k] - prefill[k]).max(-1), at_prompt)
        bound = 2 * noise + EPS[dtype] * np.abs(do[k]).max(-1)
        top2 = np.sort(do[k], axis=-1)[:, -2:]
        margin = top2[:, 1] - top2[:, 0]
        agree = df[k].argmax(-1) == do[k].argmax(-1)
        out.append({"step": k, "diff": diff.tolist(), "noise": noise.tolist(), "bound": bound.tolist(),
                    "margin": margin.tolist(), "argmax_equal": agree.tolist(),
                    "within": bool((diff <= bound).all()),
                    "ties": [bool(not a and m <= b) for a, m, b in zip(agree, margin, bound)],
                    "unexplained": [bool(not a and m > b) for a, m, b in zip(agree, margin, bound)]})
    return out


def summarize(steps: list[dict]) -> dict:
    """One row's figures from its steps."""
    ratio = [max(d / b if b > 0 else (0.0 if d == 0 else float("inf")) for d, b in zip(s["diff"], s["bound"]))
             for s in steps]
    flips = [s["step"] for s in steps if not all(s["argmax_equal"])]
    return {"steps": len(steps) - 1, "max_diff": max(max(s["diff"]) for s in steps),
            "max_bound": max(max(s["bound"]) for s in steps), "min_bound": min(min(s["bound"]) for s in steps),
            "worst_diff_over_bound": max(ratio), "worst_step": int(np.argmax(ratio)),
            "steps_over_bound": [s["step"] for s in steps if not s["within"]],
            "prefill_diff": max(steps[0]["diff"]), "argmax_differs_at": flips,
            "ties": [s["step"] for s in steps if any(s["ties"])],
            "unexplained": [s["step"] for s in steps if any(s["unexplained"])],
            "min_margin": min(min(s["margin"]) for s in steps)}


def check(drivers: dict, reference, rows: list[np.ndarray], steps: int, dtype: str) -> dict:
    """The whole check for one prompt batch, decoding through ``drivers`` (original and ort_flash,
    and ort_flash_fp8 where given) and prefilling the original through ``reference`` (a
    SessionDriver): the row's summary, with every step's figures; an FP8 variant's own under
    ``fp8``."""
    t0 = time.monotonic()
    decode, fed = teacher_forced(drivers, rows, steps)
    ref = prefill(reference, rows, fed)
    per_step = compare(decode, ref, dtype)
    s = summarize(per_step)
    s.update(per_step=per_step, seconds=time.monotonic() - t0, prompt_lengths=[len(r) for r in rows],
             fed=fed.T.tolist())
    s["passed"] = not s["steps_over_bound"] and not s["unexplained"]
    if FP8_VARIANT in decode:
        fp8_steps = compare(decode, ref, dtype, FP8_VARIANT)
        s["fp8"] = dict(summarize(fp8_steps), per_step=fp8_steps,
                        finite=bool(np.isfinite(decode[FP8_VARIANT]).all()))
    return s


def run(ctx: Context, suite: dict, ceilings: dict, budget: Budget, args, save, progress) -> None:
    g = suite["grid"]
    cache = pathlib.Path(getattr(args, "cache_dir", None) or "/tmp/ort_flash_bench") / "genai"
    cache.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(getattr(args, "seed", 0))
    suite["models"] = []
    for model in g["models"]:
        for dtype in g["dtypes"]:
            mg = model_grid(g, model, dtype, ctx.device)
            todo = [(p, b, d) for p in g["prompts"] for b in g["batches"] for d in _drivers(b)]
            if not budget.allows():
                suite["not_run"].extend(_config(mg, p, b, d) for p, b, d in todo)
                continue
            try:
                original = genai_e2e.genai_folder(mg, ctx.device, cache)
                rewritten = original.with_name(original.name + "-ort_flash-all")
                info = {"original": str(original), "rewritten": str(rewritten), "dtype": dtype,
                        "model": model, "rewrite": _rewrite_all(original, rewritten)}
                folders = {"original": original, "ort_flash": rewritten}
                if getattr(args, "with_fp8", False):
                    fp8 = original.with_name(original.name + "-ort_flash-all-fp8")
                    info["rewrite_fp8"] = _rewrite_all(original, fp8, "fp8")
                    folders[FP8_VARIANT] = fp8
                suite["models"].append(info)
                drivers: dict = {}
                for name, cls in DRIVERS.items():  # the GenAI drivers share one og.Model per folder
                    drivers[name] = {v: cls(f, ctx.device, drivers.get("genai", {}).get(v)) for v, f in folders.items()}
            except Exception as e:  # noqa: BLE001 - a model that cannot be built is its rows' reason
                reason = _error(e)
                suite["rows"].extend({"config": _config(mg, p, b, d), "peer": "ort_flash", "status": "error",
                                      "reason": reason} for p, b, d in todo)
                save()
                continue
            for i, (p, b, d) in enumerate(progress(todo, desc=f"fidelity {model} {dtype}", unit="cfg")):
                if not budget.allows():
                    suite["not_run"].extend(_config(mg, q, c, e) for q, c, e in todo[i:])
                    break
                rows = prompt_rows(rng, p, b, mg["vocab"])
                suite["rows"].extend(_row(drivers[d], drivers["session"]["original"], _config(mg, p, b, d), rows, g["steps"]))
                suite["elapsed_s"] = budget.elapsed
                save()
            drivers.clear()


def _drivers(batch: int) -> list[str]:
    """Batch 1 runs through GenAI itself (fresh, and after a rewind over stale rows) and through the
    session driver; a batch of two only through the session driver (GenAI appends to such a batch
    once)."""
    return ["genai", "genai_rewind", "session"] if batch == 1 else ["session"]


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def _rewrite_all(original: pathlib.Path, rewritten: pathlib.Path, attention_precision: str = "model") -> dict:
    """Every GroupQueryAttention of the folder mapped (every head size too): the check covers what
    the rewriter may map, not only what it maps by default."""
    return genai_e2e.rewrite_folder(original, rewritten, gqa_cuda="all", attention_precision=attention_precision)


def _config(mg: dict, prompt: int, batch: int, driver: str) -> dict:
    return {"kind": "teacher_forced", "tokens": prompt, "batch": batch, "driver": driver, "layers": mg["layers"],
            "hidden": mg["hidden"], "heads": mg["heads"], "kv_heads": mg["kv_heads"],
            "head_dim": mg["hidden"] // mg["heads"], "dtype": mg["dtype"]}


def _row(drivers: dict, reference, cfg: dict, rows: list[np.ndarray], steps: int) -> list[dict]:
    """The configuration's rows: ort_flash's, and ort_flash_fp8's where the drivers have it."""
    try:
        s = check(drivers, reference, rows, steps, cfg["dtype"])
    except Exception as e:  # noqa: BLE001 - one configuration's failure is its row
        return [{"config": cfg, "peer": "ort_flash", "status": "error", "reason": _error(e)}]
    fp8 = s.pop("fp8", None)
    row = {"config": cfg, "peer": "ort_flash", "status": "ok" if s["passed"] else "mismatch", **s}
    if not s["passed"]:
        row["reason"] = (f"steps {s['steps_over_bound'][:8]} over the rounding bound, argmax differences "
                         f"unexplained by a tie at {s['unexplained'][:8]}")
    out = [row]
    if fp8 is not None:
        r8 = {"config": cfg, "peer": FP8_VARIANT, "status": "ok" if fp8["finite"] else "mismatch",
              "prompt_lengths": s["prompt_lengths"], **fp8}
        if not fp8["finite"]:
            r8["reason"] = "logits not finite"
        out.append(r8)
    return out


def summary(suite: dict) -> tuple[list[str], list[list]]:
    header = ["model", "dtype", "driver", "batch", "prompt", "variant", "steps", "max diff", "bound (min-max)",
              "worst diff/bound", "argmax differs (steps)", "ties", "unexplained", "passed"]
    rows = []
    for r in suite["rows"]:
        c = r["config"]
        name = f"L{c['layers']} d{c['head_dim']}"
        variant = "fp8" if r["peer"] == FP8_VARIANT else "fp16/bf16"
        if r["status"] == "error":
            rows.append([name, c["dtype"], c["driver"], c["batch"], c["tokens"], variant, "error", r["reason"][:60],
                         "", "", "", "", "", False])
            continue
        passed = r["passed"] if r["peer"] != FP8_VARIANT else "measured"
        rows.append([name, c["dtype"], c["driver"], c["batch"], "/".join(map(str, r["prompt_lengths"])), variant,
                     r["steps"], f"{r['max_diff']:.3g}", f"{r['min_bound']:.3g}-{r['max_bound']:.3g}",
                     f"{r['worst_diff_over_bound']:.2f} @{r['worst_step']}", len(r["argmax_differs_at"]),
                     len(r["ties"]), r["unexplained"][:4] or 0, passed])
    return header, rows


def print_summary(suite: dict) -> None:
    header, rows = summary(suite)
    if rows:
        print(text_table(header, rows, title=f"\nGenAI teacher-forced fidelity on {suite['device']}: the original's "
                         "greedy tokens fed to both, logits compared at every step"))
    print(results.format_reasons(suite["rows"]))
