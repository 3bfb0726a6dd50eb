"""GroupQueryAttention, op level, like for like: ort_flash::GroupQueryAttention against
ONNX Runtime's com.microsoft.GroupQueryAttention on the inputs ONNX Runtime GenAI gives it (packed
QKV, rotary on the new tokens, the cache appended in place in one max-length buffer bound as past
and present; ``gqa_peers``), torch's cuDNN SDPA on CUDA for information.

CUDA grid: fp16, Hq 32, Hkv 8, d 128 and 64; prefill (a first prompt) N 128 … 16k at B·N = 16k;
decode (one token) against caches of 1k … 128k at B 1, 8, 32. ``--quick``: d 128, fewer lengths.
CPU grid (fp32, Hq 8, Hkv 2, d 64; prefill N 128 … 1024, decode caches 1k and 4k at B 1 and 4):
the harness and the CPU op, in minutes on two cores. The buffer holds ``headroom`` tokens past the
call's total. Configurations whose buffers do not fit in device memory are listed as unsupported.
``--window W``: every node keeps a window-sized cache (local_window_size=W, sliding_window_cache=1, a
buffer of W rows; prompts and caches may be longer, rates count the window's keys); no plain op or sdpa.

Before timing, the correctness guard (``guard``) runs each op once on set 0: the output of
ort_flash against ONNX Runtime's (relative L2, the spot check's limit for the dtype) and the
cache rows ort_flash wrote against the rotated new K and the new V. A failed guard marks
ort_flash's row ``mismatch`` (timed, never a ratio). Every timed peer is also spot-checked
against the float64 reference of the rotated Q, K, V (``measure``); where the timed calls shift a
window-sized cache, on one call from set 0's cache before them instead (``first_call_error``).

Reported: ms; prefill TFLOP/s (causal, 2·B·Hq·N²·D), decode GB/s of K and V read
(2·B·Hkv·C·D·size); ``vs_ort`` = ours / ORT's rate; on first prompts ``vs_plain`` = ours /
ort_flash::FlashAttention's rate on the same attention (``ort_flash_fa``: no rotary, no cache
write); on CUDA the kernel ORT's op ran (``gqa_probe``, ``ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO=1``
in a child process, so its per-call print never lands in a timed run) and the goals per row
(``GOALS``: prefill ≥ 2× ORT's op up to 2k tokens and ≥ 1.2× above, ≥ 0.75× the plain op up to
1024 tokens and ≥ 0.9× from 2k; decode ≥ 1.0× ORT's op).
"""
from __future__ import annotations

import itertools

import numpy as np

from ort_flash.bench import gqa_peers, gqa_probe, results
from ort_flash.bench.measure import Budget, Context, measure, release, run_grid
from ort_flash.bench.op_suite import verdict
from ort_flash.bench.ort_session import Unsupported
from ort_flash.bench.spot_check import LIMITS, SpotCheck
from ort_flash.bench.tables import text_table
from ort_flash.bench.tensors import rotation_sets
from ort_flash.bench.workload import tflops

PEERS = ("ort_flash", "ort_gqa", "ort_flash_fa", "sdpa")
# Ours over ORT's op (prefill up to SHORT_PROMPT tokens, above, decode) and over the plain op on the
# same attention (prefill below PLAIN_LONG tokens, from there).
GOALS = {"prefill_short": 2.0, "prefill_long": 1.2, "decode": 1.0, "plain_short": 0.75, "plain_long": 0.9}
SHORT_PROMPT = 2048
PLAIN_LONG = 2048


def grid(device: str, quick: bool, overrides: dict | None = None) -> dict:
    o = overrides or {}
    if device == "cuda":
        g = dict(dtype="float16", hq=32, hkv=8, head_dims=[128] if quick else [128, 64], tokens=16384,
                 seqlens=[128, 2048, 16384] if quick else [128, 512, 2048, 8192, 16384],
                 caches=[1024, 16384, 131072] if quick else [1024, 4096, 16384, 32768, 131072],
                 batches=[1, 32] if quick else [1, 8, 32], headroom=256)
    else:
        g = dict(dtype="float32", hq=8, hkv=2, head_dims=[64], tokens=512,
                 seqlens=[128, 512] if quick else [128, 256, 512, 1024],
                 caches=[1024, 4096], batches=[1, 4], headroom=256)
    for key in ("seqlens", "caches", "batches", "head_dims"):
        if o.get(key):
            g[key] = o[key]
    for key in ("sinks", "qk_norm"):
        if o.get(key):
            g[key] = True
    if o.get("window") is not None:
        if o["window"] < 1:
            raise ValueError(f"--window {o['window']}: a window-sized cache needs W >= 1")
        g["window"] = int(o["window"])
    if o.get("dtypes"):
        if len(o["dtypes"]) > 1:
            raise ValueError(f"--dtypes {' '.join(o['dtypes'])}: the gqa suite times one dtype a run; "
                             "run it once per dtype")
        g["dtype"] = o["dtypes"][0]
    return g


def options(g: dict) -> list[str]:
    """The grid's node options as the tables name them (Q/K norms, sinks, a window-sized cache)."""
    words = [what for key, what in (("qk_norm", "Q/K norms"), ("sinks", "attention sinks")) if g.get(key)]
    return words + ([f"window-sized cache {g['window']}"] if g.get("window") else [])


def configs(g: dict) -> list[dict]:
    base = dict(dtype=g["dtype"], hq=g["hq"], hkv=g["hkv"], **{k: True for k in ("sinks", "qk_norm") if g.get(k)})
    w = g.get("window")
    if w:
        base["window"] = w

    def buffer(total: int) -> int:  # a window-sized cache, else the max-length one
        return w or total + g["headroom"]
    out = []
    for d, n in itertools.product(g["head_dims"], g["seqlens"]):
        out.append(dict(base, d=d, phase="prefill", batch=max(1, g["tokens"] // n), seqlen=n, cache=n,
                        buffer=buffer(n)))
    for d, c, b in itertools.product(g["head_dims"], g["caches"], g["batches"]):
        out.append(dict(base, d=d, phase="decode", batch=b, seqlen=1, cache=c, buffer=buffer(c)))
    return out


def goal(cfg: dict) -> float:
    if cfg["phase"] == "decode":
        return GOALS["decode"]
    return GOALS["prefill_short"] if cfg["seqlen"] <= SHORT_PROMPT else GOALS["prefill_long"]


def plain_goal(cfg: dict) -> float:
    return GOALS["plain_long"] if cfg["seqlen"] >= PLAIN_LONG else GOALS["plain_short"]


def run(ctx: Context, suite: dict, ceilings: dict, budget: Budget, args, save, progress) -> None:
    todo = configs(suite["grid"])
    builders = gqa_peers.peers_for(ctx.device)
    kernels = {}
    if ctx.device == "cuda" and "ort_gqa" in (getattr(args, "peers", None) or builders):
        kernels = gqa_probe.probe(todo, getattr(args, "seed", 0))
        suite["ort_kernels"] = [{"config": c, "kernel": kernels.get(results.config_key(c))} for c in todo]
    else:
        suite["notes"].append("ORT's kernel is named on CUDA only (its CPU op prints no debug info)")
    if any(gqa_peers.shifts(c) for c in todo):
        suite["notes"].append("decode past the window-sized cache: each timed call moves the cache's rows, so its "
                              "peers' ref_err is of one call from set 0's cache before them (row 'check')")

    def one(ctx, cfg, builders, ceilings, bar=None):
        return run_config(ctx, cfg, builders, ceilings, bar, kernels.get(results.config_key(cfg)))
    run_grid(ctx, suite, todo, builders, one, ceilings, budget, args, save, progress, "gqa")


def run_config(ctx: Context, cfg: dict, builders: dict, ceilings: dict, bar=None, ort_kernel=None) -> list[dict]:
    per_set = gqa_peers.set_bytes(cfg)
    try:
        ctx.require(per_set, "the input set (packed QKV and the max-length K/V buffer)")
    except Unsupported as e:
        return [{"config": cfg, "peer": p, "status": "unsupported", "reason": f"skipped: {e}"} for p in builders]
    sets, shared = gqa_peers.make_sets(ctx.tensors, cfg, rotation_sets(per_set, limit=4))
    for s in sets:
        s["ref"] = gqa_peers.attention_inputs(cfg, s, shared)
    q, k, v, *_ = sets[0]["ref"]
    check = SpotCheck(q, k, v, causal=True, scale=cfg["d"] ** -0.5, dtype=cfg["dtype"],
                      sinks=shared.get("head_sink"), window=cfg.get("window"))
    shifting = gqa_peers.shifts(cfg)  # the timed calls move the cache: set 0's before them, for the check
    before = [gqa_peers.clone(sets[0][c].data) for c in ("k_cache", "v_cache")] if shifting else None
    guarded = guard(ctx, cfg, sets[0], shared) if "ort_flash" in builders else {}
    prefill = cfg["phase"] == "prefill"
    flops, kv = gqa_peers.work(cfg)
    rows = []
    for name, build in builders.items():
        if bar is not None and hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(f"{cfg['phase']} d{cfg['d']} B{cfg['batch']} "
                                f"{'N' if prefill else 'cache '}{cfg['cache']}: {name}")
        row = measure(ctx, name, lambda build=build: build(ctx, cfg, sets, shared), check=None if shifting else check,
                      graph_torch=ctx.cuda_graph)
        row["config"] = cfg
        if shifting and row["status"] == "ok":
            _check_first_call(ctx, cfg, name, sets[0], shared, before, check, row)
        if row["status"] in ("ok", "mismatch"):
            row["tflops"] = tflops(flops, row["ms"])
            row["gbps"] = kv / (row["ms"] * 1e-3) / 1e9
        if name == "ort_gqa" and ort_kernel:
            row["ort_kernel"] = ort_kernel
        if name == "ort_flash" and guarded:
            row["guard"] = guarded
            if row["status"] in ("ok", "mismatch") and not guarded["passed"]:
                reason = "correctness guard: " + guarded["reason"]
                row.update(status="mismatch", reason="; ".join(filter(None, [reason, row.get("reason")])))
        rows.append(row)
    _vs_ort(rows, cfg, ctx.device)
    del sets, shared
    release(ctx)
    return rows


def _check_first_call(ctx: Context, cfg: dict, name: str, s: dict, shared: dict, before: list, check: SpotCheck,
                      row: dict) -> None:
    """The spot check of a peer whose timed calls shifted set ``s``'s cache: on one call from the
    cache ``before`` them (a mismatch above the check's limit, as ``measure``'s)."""
    if name not in gqa_peers.DOMAINS:
        row["check"] = "none: not a GroupQueryAttention node, and its timed calls moved the cache"
        return
    try:
        err = first_call_error(ctx, cfg, s, shared, gqa_peers.DOMAINS[name], before, check)
    except Unsupported as e:
        row.update(status="error", reason=f"the first-call check did not run: {e}")
        return
    row.update(ref_err=err, check="one call from set 0's cache before the timed calls")
    if not err <= check.limit:
        row.update(status="mismatch", reason=f"output differs from the float64 reference: relative error "
                                             f"{err:.3g} > {check.limit:g} on sampled rows of a first call")


def first_call_error(ctx: Context, cfg: dict, s: dict, shared: dict, domain: str, before: list,
                     check: SpotCheck) -> float:
    """``check``'s error of one plain call of ``domain``'s node on set ``s``, its caches first set
    back to ``before`` (their content when ``check`` was made)."""
    for c, b in zip((s["k_cache"], s["v_cache"]), before):
        c.data[...] = b
    run = gqa_peers.session(ctx, cfg, [s], shared, domain, n=1)
    run.check_runs(ctx.synchronize)
    return check.error(run.output())


def guard(ctx: Context, cfg: dict, s: dict, shared: dict) -> dict:
    """One plain run of each op on set ``s`` from the same cache: ours against ONNX Runtime's
    output, and the cache rows ours wrote (NaN before its run, but for a shifting call, which
    reads them all) against what the call writes (``gqa_peers.cache_writes``)."""
    limit = LIMITS.get(cfg["dtype"], 3e-2)
    rows, k_want, v_want = gqa_peers.cache_writes(cfg, s)
    caches = (s["k_cache"], s["v_cache"])
    before = [gqa_peers.clone(c.data[:, :, rows]) for c in caches]
    out = {"limit": limit}
    try:
        if not gqa_peers.shifts(cfg):
            for c in caches:
                c.data[:, :, rows] = float("nan")
        ours = gqa_peers.session(ctx, cfg, [s], shared, "ort_flash", n=1)
        ours.check_runs(ctx.synchronize)
        y_ours = ours.ys[0].data
        out["present_err"] = max(_rel_err(s["k_cache"].data[:, :, rows], k_want),
                                 _rel_err(s["v_cache"].data[:, :, rows], v_want))
        del ours
    except Unsupported as e:
        return {"passed": False, "reason": f"ort_flash did not run: {e}"}
    finally:  # ONNX Runtime's op starts from the cache ours started from
        for c, b in zip(caches, before):
            c.data[:, :, rows] = b
    try:
        theirs = gqa_peers.session(ctx, cfg, [s], shared, "com.microsoft", n=1)
        theirs.check_runs(ctx.synchronize)
        out["agree_err"] = _rel_err(y_ours, theirs.ys[0].data)
        del theirs
    except Unsupported as e:
        out["agree_err"] = None
        out["note"] = f"ONNX Runtime's op did not run, nothing to agree with: {e}"
    bad = [f"{what} relative error {err:.3g} > {limit:g}" for what, err in
           (("output vs ONNX Runtime's:", out.get("agree_err")), ("cache rows written:", out["present_err"]))
           if err is not None and not err <= limit]
    out["passed"] = not bad
    out["reason"] = "; ".join(bad) if bad else "agrees"
    return out


def _rel_err(got, want) -> float:
    """Relative L2 error, NaN where ``got`` holds one."""
    if hasattr(got, "detach"):
        g, w = got.detach().double(), want.detach().double()
        return float((g - w).norm() / max(float(w.norm()), 1e-30))
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))


def _vs_ort(rows: list[dict], cfg: dict, device: str) -> None:
    by = {r["peer"]: r for r in rows}
    ours, theirs, plain = by.get("ort_flash"), by.get("ort_gqa"), by.get("ort_flash_fa")
    if not (ours and ours["status"] == "ok"):
        return
    if plain and plain["status"] == "ok":
        ours["vs_plain"] = plain["ms"] / ours["ms"]
        if device == "cuda":
            ours["plain_goal"] = plain_goal(cfg)
            ours["plain_goal_met"] = ours["vs_plain"] >= plain_goal(cfg)
    if not (theirs and theirs["status"] == "ok"):
        return
    ours["vs_ort"] = theirs["ms"] / ours["ms"]
    if device == "cuda":
        ours["goal"] = goal(cfg)
        ours["goal_met"] = ours["vs_ort"] >= goal(cfg)


def summary(suite: dict, phase: str) -> tuple[list[str], list[list]]:
    rate = "tflops" if phase == "prefill" else "gbps"
    peers = [p for p in PEERS if any(r["peer"] == p and r["config"]["phase"] == phase and r["status"] != "unsupported"
                                     for r in suite["rows"])]
    length = ["N", "B"] if phase == "prefill" else ["B", "cache", "KV MB"]
    header = ["d", *length] + [f"{p} ms" for p in peers] + [f"{p} {'TFLOP/s' if rate == 'tflops' else 'GB/s'}"
                                                          for p in peers]
    header += ["spread (ours/ORT)", "ORT kernel", "ours/ORT", "goal"]
    if phase == "prefill":
        header += ["ours/plain", "goal"]
    header += ["guard"]
    rows = []
    for cfg, group in results.group_by_config(suite["rows"]):
        if cfg["phase"] != phase:
            continue
        by = {r["peer"]: r for r in group}
        ours = by.get("ort_flash", {})
        if phase == "prefill":
            cells = [cfg["d"], cfg["seqlen"], cfg["batch"]]
        else:
            cells = [cfg["d"], cfg["batch"], cfg["cache"], gqa_peers.work(cfg)[1] / 1e6]
        cells += [_cell(by.get(p), "ms") for p in peers] + [_cell(by.get(p), rate) for p in peers]
        g = ours.get("guard") or {}
        guard_cell = None
        if g:
            guard_cell = (f"ok {g['agree_err']:.1e}" if g.get("agree_err") is not None else "ok (no ORT)") \
                if g["passed"] else "FAILED"
        goal_cell = None
        if "goal" in ours:
            goal_cell = f"≥{ours['goal']:g}x {'met' if ours['goal_met'] else 'missed'}"
        spread = "/".join(f"{100 * by[p]['spread']:.0f}%" if "spread" in by.get(p, {}) else "–"
                          for p in ("ort_flash", "ort_gqa"))
        cells += [spread, by.get("ort_gqa", {}).get("ort_kernel"), verdict(ours.get("vs_ort")), goal_cell]
        if phase == "prefill":
            plain_cell = None
            if "plain_goal" in ours:
                plain_cell = f"≥{ours['plain_goal']:g}x {'met' if ours['plain_goal_met'] else 'missed'}"
            cells += [verdict(ours.get("vs_plain")), plain_cell]
        cells += [guard_cell]
        rows.append(cells)
    return header, rows


def _cell(row: dict | None, key: str):
    if row is None:
        return None
    if row["status"] == "ok":
        return row.get(key)
    if row["status"] == "mismatch":
        return f"{row.get(key, 0):.3g} WRONG"
    return "n/a" if row["status"] == "unsupported" else "error"


def print_summary(suite: dict) -> None:
    g = suite["grid"]
    where = f"{suite['device']}, {g['dtype']}, Hq {g['hq']}, Hkv {g['hkv']}, packed QKV, rotary, shared buffer"
    where += "".join(f", {what}" for what in options(g))
    for phase, what in (("prefill", "first prompt, TFLOP/s (causal)"),
                        ("decode", "one token, GB/s of the K and V read")):
        header, rows = summary(suite, phase)
        if rows:
            print(text_table(header, rows, title=f"\nGroupQueryAttention {phase} on {where}: {what}"))
    print(results.format_reasons(suite["rows"]))
