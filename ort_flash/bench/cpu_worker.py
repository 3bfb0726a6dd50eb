"""CPU measurements in processes of their own (run by the cpu suite):

    python -m ort_flash.bench.cpu_worker '{"mode": "timing", "peers": [...], "config": {...}}'
    python -m ort_flash.bench.cpu_worker '{"mode": "memory", "peers": ["unfused"], "config": {...}}'

Each prints one JSON line {peer: result}.

* timing: every peer of the configuration built in one process, then timed round-robin (one
  call of each per round, the order rotated each round, rounds until the time target), so that
  whatever else loads the machine weighs on every peer alike; the median per peer; each checked
  against the float64 reference; ort_flash rows name the CPU kernel's ISA build.
* memory: one peer, one input set, in a fresh process: the peak RSS while it runs (VmHWM after
  resetting it just before, ``memory.py``) minus the RSS once inputs, output and session exist.
"""
from __future__ import annotations

import json
import statistics
import sys
import time


def _build(peers, cfg, sets_n, target_s=0.5):
    from ort_flash.bench import op_peers
    from ort_flash.bench.measure import Context
    from ort_flash.bench.ort_session import Unsupported

    ctx = Context.create("cpu", seed=cfg.get("seed", 0), target_s=target_s)
    shape = (cfg["batch"], cfg["heads"], cfg["seqlen"], cfg["d"])
    sets = [{n: ctx.tensors.randn(shape, cfg["dtype"]) for n in ("q", "k", "v")} for _ in range(sets_n)]
    runners, out = {}, {}
    for peer in peers:
        try:
            runners[peer] = op_peers.peers_for("cpu")[peer](ctx, cfg, sets)
        except Unsupported as e:
            out[peer] = {"status": "unsupported", "reason": str(e)}
    return ctx, sets, runners, out


def timing(peers, cfg, target_s: float, sets_n: int, min_rounds: int = 5, max_rounds: int = 50) -> dict:
    from ort_flash.bench.ort_session import Unsupported
    from ort_flash.bench.spot_check import SpotCheck

    ctx, sets, runners, out = _build(peers, cfg, sets_n, target_s)
    est = {}
    for peer, r in list(runners.items()):
        t0 = time.perf_counter()
        try:
            r.check_runs(ctx.synchronize)  # one call per set: the warm-up
        except Unsupported as e:
            out[peer] = {"status": "unsupported", "reason": str(e)}
            del runners[peer]
            continue
        est[peer] = (time.perf_counter() - t0) / sets_n
    rounds = int(min(max_rounds, max(min_rounds, target_s * len(est) / max(sum(est.values()), 1e-6))))
    samples = {p: [] for p in runners}
    order = list(runners)
    for i in range(rounds):
        # The order rotates per round: a peer whose threads spin after returning (torch's
        # OpenMP) would otherwise always slow the same next peer (perf-notes, CPU kernel).
        for peer in order[i % len(order):] + order[:i % len(order)]:
            call = runners[peer].calls[i % sets_n]
            t0 = time.perf_counter()
            call()
            samples[peer].append((time.perf_counter() - t0) * 1e3)
    check = SpotCheck(sets[0]["q"], sets[0]["k"], sets[0]["v"], causal=cfg["causal"], dtype=cfg["dtype"])
    for peer, xs in samples.items():
        med = statistics.median(xs)
        q = statistics.quantiles(xs, n=4) if len(xs) >= 4 else (min(xs), 0, max(xs))
        res = {"status": "ok", "ms": med, "spread": (q[2] - q[0]) / med if med else 0.0, "calls": len(xs),
               "timing": "host_clock, round-robin", "sets": sets_n, "threads": _threads(peer)}
        if peer.startswith("ort_flash"):
            from ort_flash.bench.cpu_suite import kernel_isa
            res["isa"] = kernel_isa()
        res["ref_err"] = check.error(runners[peer].output())
        if not res["ref_err"] <= check.limit:
            res.update(status="mismatch", reason=f"relative error {res['ref_err']:.3g} > {check.limit:g}")
        out[peer] = res
    return out


def memory(peer, cfg) -> dict:
    from ort_flash.bench import memory as mem
    from ort_flash.bench.ort_session import Unsupported

    ctx, sets, runners, out = _build([peer], cfg, 1)
    if peer not in runners:
        return out
    reset = mem.reset_peak_rss()
    ready = mem.rss_mb()
    floor = ready if reset else max(ready, mem.peak_rss_mb(False))
    try:
        runners[peer].check_runs(ctx.synchronize)
        runners[peer].calls[0]()
    except Unsupported as e:
        return {peer: {"status": "unsupported", "reason": str(e)}}
    peak = mem.peak_rss_mb(reset)
    return {peer: {"rss_ready_mb": ready, "peak_rss_mb": peak, "work_mb": max(0.0, peak - floor),
                   "peak_method": "VmHWM reset" if reset else "ru_maxrss"}}


def _threads(peer: str):
    if peer.startswith("sdpa"):
        import torch
        return torch.get_num_threads()
    import os
    return os.cpu_count()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job = json.loads(argv[0])
    try:
        if job["mode"] == "timing":
            result = timing(job["peers"], job["config"], job.get("target_s", 2.0), job.get("sets", 2))
        else:
            result = memory(job["peers"][0], job["config"])
    except Exception as e:  # noqa: BLE001 - report, do not crash the suite
        result = {p: {"status": "error", "reason": f"{type(e).__name__}: {str(e)[:300]}"} for p in job["peers"]}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
