"""CPU EP, fp32: the fused CPU op against ORT's CPU ``com.microsoft.MultiHeadAttention`` and the
unfused MatMul-Softmax-MatMul graph (ORT optimizations off), torch SDPA for information; latency
and the extra memory a call needs. Batch 1, 12 heads of 64 (BERT-base's attention), N 512 … 4k,
causal and not. Per configuration, one process times every peer round-robin (so load from
elsewhere weighs on all alike), and one fresh process per peer reads its peak RSS
(``cpu_worker``).

Benchmark-issue targets (reported, not asserted): fused ≥ 1.1× ORT CPU MHA non-causal and ≥ 2×
causal, ≥ 1.5× the unfused graph at N ≥ 2k, and memory O(N) (``work_mb`` growing linearly, not
quadratically, with N).

The suite records the machine it measured (``suite["machine"]``: CPU model, family/model ids, the
vector features the CPU kernel dispatches on) and the ISA build of the CPU kernel that ran
(baseline / avx2 / avx512, ``ORT_FLASH_CPU_ISA`` forces one); every ort_flash row repeats it.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

from ort_flash.bench import results
from ort_flash.bench.measure import Budget, Context, add_ratios
from ort_flash.bench.op_suite import verdict
from ort_flash.bench.tables import text_table
from ort_flash.bench.tensors import rotation_sets
from ort_flash.bench.workload import attention_flops, io_bytes, tflops

PEERS = ("ort_flash", "ort_flash_kernel", "ort_mha", "unfused", "sdpa")
WORKER_TIMEOUT_S = 1800


def grid(device: str, quick: bool, overrides: dict | None = None) -> dict:
    o = overrides or {}
    g = dict(dtype="float32", batch=1, heads=12, d=64, causal=[False, True],
             seqlens=[512, 1024] if quick else [512, 1024, 2048, 4096])
    if o.get("seqlens"):
        g["seqlens"] = o["seqlens"]
    if o.get("head_dims"):
        g["d"] = o["head_dims"][0]
        g["heads"] = 768 // g["d"]
    return g


def configs(g: dict) -> list[dict]:
    return [dict(dtype=g["dtype"], batch=g["batch"], heads=g["heads"], d=g["d"], seqlen=n, causal=c)
            for c, n in itertools.product(g["causal"], g["seqlens"])]


# /proc/cpuinfo flags the CPU kernel's builds need (cpu_flash.cc's dispatch).
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16")


def machine() -> dict:
    """The CPU this suite measures and the CPU kernel build that runs on it."""
    from ort_flash.bench.environment import cpu_model

    info = {"cpu": cpu_model(), "cores": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            fields = dict(ln.split(":", 1) for ln in f.read().split("\n\n")[0].splitlines() if ":" in ln)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        info.update(vendor=fields.get("vendor_id"), family=fields.get("cpu family"),
                    model=fields.get("model"),
                    isa_flags=[f for f in ISA_FLAGS if f in fields.get("flags", "").split()])
    except OSError:
        pass
    info["kernel_isa"] = kernel_isa()
    info["isa_forced"] = os.environ.get("ORT_FLASH_CPU_ISA") or None
    return info


def kernel_isa() -> str:
    """The ISA build the CPU kernel picks here (the op library decides the same way)."""
    try:
        from ort_flash._library import load_extension
        return load_extension().cpu_isa()
    except Exception as e:  # noqa: BLE001 - a report with the reason beats no report
        return f"unknown ({type(e).__name__}: {str(e)[:120]})"


def run(ctx: Context, suite: dict, ceilings: dict, budget: Budget, args, save, progress) -> None:
    peers = [p for p in PEERS if not getattr(args, "peers", None) or p in args.peers]
    suite["machine"] = machine()
    todo = configs(suite["grid"])
    target_s = 3.0 if ctx.target_s >= 0.2 else 1.0  # timed seconds per peer, round-robin
    bar = progress(todo, desc="cpu", unit="cfg")
    for i, cfg in enumerate(bar):
        if not budget.allows():
            suite["not_run"].extend(todo[i:])
            break
        flops = attention_flops(cfg["batch"], cfg["heads"], cfg["seqlen"], cfg["seqlen"], cfg["d"], cfg["causal"])
        sets = min(4, rotation_sets(io_bytes(cfg["batch"], cfg["heads"], cfg["heads"], cfg["seqlen"],
                                             cfg["seqlen"], cfg["d"], cfg["dtype"]) * 3 / 4))
        tag = f"N{cfg['seqlen']}{' causal' if cfg['causal'] else ''}"
        if hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(f"{tag}: timing")
        timed = run_worker({"mode": "timing", "peers": peers, "config": cfg, "target_s": target_s, "sets": sets})
        rows = []
        for peer in peers:
            row = {"config": cfg, "peer": peer, **timed.get(peer, {"status": "error", "reason": "no result"})}
            if row["status"] in ("ok", "mismatch"):
                row["tflops"] = tflops(flops, row["ms"])
                if hasattr(bar, "set_postfix_str"):
                    bar.set_postfix_str(f"{tag}: memory of {peer}")
                row.update(run_worker({"mode": "memory", "peers": [peer], "config": cfg}).get(peer, {}))
            rows.append(row)
        add_ratios(rows, "ms", higher_is_better=False)
        _vs_unfused(rows)
        suite["rows"].extend(rows)
        suite["elapsed_s"] = budget.elapsed
        save()


def run_worker(job: dict) -> dict:
    """{peer: result} from a cpu_worker process; errors become rows with the reason."""
    def failed(reason):
        return {p: {"status": "error", "reason": reason} for p in job["peers"]}
    try:
        proc = subprocess.run([sys.executable, "-m", "ort_flash.bench.cpu_worker", json.dumps(job)],
                              capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, env=worker_env())
    except subprocess.TimeoutExpired:
        return failed(f"worker timed out after {WORKER_TIMEOUT_S} s")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        return failed(f"worker failed: {tail[0][:300]}")
    return json.loads(lines[-1])


def worker_env() -> dict:
    """The workers' environment: OpenMP threads (torch's SDPA peer) wait passively unless the
    caller chose, so that they do not spin on the two cores through the next peer's call."""
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def _vs_unfused(rows: list[dict]) -> None:
    by = {r["peer"]: r for r in rows if r.get("status") == "ok"}
    base = by.get("unfused")
    for r in by.values():
        if base is not None:
            r["vs_unfused"] = base["ms"] / r["ms"]


def summary(suite: dict) -> tuple[list[str], list[list]]:
    peers = [p for p in PEERS if any(r["peer"] == p for r in suite["rows"])]
    header = ["N", "causal"] + [f"{p} ms" for p in peers] + ["ours spread"] + [f"{p} MB" for p in peers] + \
             ["ours vs ORT MHA", "ours vs unfused"]
    rows = []
    for cfg, group in results.group_by_config(suite["rows"]):
        by = {r["peer"]: r for r in group}
        ms = [_val(by.get(p), "ms") for p in peers]
        mb = [_val(by.get(p), "work_mb") for p in peers]
        ours, mha = by.get("ort_flash", {}), by.get("ort_mha", {})
        vs_mha = mha["ms"] / ours["ms"] if ours.get("status") == "ok" and mha.get("status") == "ok" else None
        spread = f"{100 * ours['spread']:.0f}%" if ours.get("status") == "ok" else None
        rows.append([cfg["seqlen"], cfg["causal"], *ms, spread, *mb, verdict(vs_mha), verdict(ours.get("vs_unfused"))])
    return header, rows


def _val(row, key):
    if row is None:
        return None
    if row.get("status") == "ok":
        return row.get(key)
    return "n/a" if row.get("status") == "unsupported" else row.get("status")


def print_summary(suite: dict) -> None:
    header, rows = summary(suite)
    g = suite["grid"]
    m = suite.get("machine") or {}
    where = (f" on {m.get('cpu')} ({m.get('cores')} cores, family {m.get('family')} model {m.get('model')}),"
             f" CPU kernel ISA {m.get('kernel_isa')}" if m else "")
    print(text_table(header, rows, title=f"\nCPU EP, {g['dtype']}, batch {g['batch']}, {g['heads']} heads "
                     f"of {g['d']}{where}: median latency (ms) and extra peak RSS of a call (MB)"))
    print(results.format_reasons(suite["rows"]))
