"""Measuring one peer on one configuration: build it, run it once (unsupported configurations
are recorded with their reason, never timed), time it, and check its output against the float64
reference on a sample (``spot_check``), so a fast-but-wrong result cannot pass unnoticed.

A peer ("runner") has ``calls`` (one callable per input set), ``check_runs(synchronize)``,
``output()`` (set 0's result as a (B, H, S, D) tensor view; optional) and an optional ``info``
dict. ``Context`` carries what every suite shares: the device, the tensor factory, the stream,
the time budget.
"""
from __future__ import annotations

import dataclasses
import gc
import math
import time
import traceback
from typing import Callable

from ort_flash.bench.ort_session import Unsupported
from ort_flash.bench.tensors import Tensors
from ort_flash.bench.timers import cuda_graph_calls, time_calls

OURS = ("ort_flash", "ort_flash_run", "ort_flash_kernel", "ort_flash_past", "ort_flash_fp8")  # every other peer is a competitor


@dataclasses.dataclass
class Context:
    device: str
    tensors: Tensors
    stream: object = None  # torch.cuda.Stream on CUDA with torch, else None
    target_s: float = 0.25  # timed seconds per measurement
    cuda_graph: bool = False  # capture torch peers in CUDA graphs (ORT peers choose themselves)
    broken: str | None = None  # set when the CUDA context is lost: nothing after can be trusted

    @classmethod
    def create(cls, device: str, seed: int = 0, target_s: float = 0.25, cuda_graph: bool = False):
        tensors = Tensors(device, seed)
        stream = None
        if device == "cuda" and tensors.torch is not None:
            stream = tensors.torch.cuda.Stream()
        return cls(device, tensors, stream, target_s, cuda_graph)

    def require(self, nbytes: float, what: str) -> None:
        """Unsupported when ``nbytes`` more would not fit in free device memory."""
        free = self.tensors.free_bytes()
        if free is not None and nbytes > 0.9 * free:
            raise Unsupported(f"{what} needs {nbytes / 2**30:.1f} GiB more; {free / 2**30:.1f} GiB free")

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()
        self.tensors.synchronize()


class Budget:
    """A wall-clock allowance for a suite; None = unlimited."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.start = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return math.inf if self.seconds is None else self.seconds - self.elapsed

    def allows(self, estimate_s: float = 0.0) -> bool:
        return self.left() > estimate_s


def measure(ctx: Context, name: str, build: Callable[[], object], *, graph_torch: bool = False,
            check=None) -> dict:
    """A result row: status ok | unsupported | error | mismatch, the timing and, with a
    ``check`` (a SpotCheck), ``ref_err``: the relative error of set 0's output on its sample."""
    row: dict = {"peer": name}
    if ctx.broken:
        return row | {"status": "error", "reason": "not run: " + ctx.broken}
    runner = None
    try:
        runner = build()
        ctx.synchronize()  # inputs and poisoned outputs were written on torch's default stream
        runner.check_runs(ctx.synchronize)
        calls, per_call = runner.calls, getattr(runner, "per_run", 1)  # nodes per run (decode layers)
        mode = ""
        if graph_torch and ctx.stream is not None and getattr(runner, "graphable", True):
            try:
                calls, per_call = cuda_graph_calls(runner.calls, ctx.stream)
                mode = f"+cuda_graph(x{per_call})"
            except Exception as e:  # noqa: BLE001 - fall back to plain launches, say why
                row["note"] = f"CUDA graph capture failed ({str(e).splitlines()[0][:120]}); timed without"
                ctx.synchronize()
        if getattr(runner, "cuda_graph", False):
            mode = "+cuda_graph" + (f"({per_call} nodes per run)" if per_call > 1 else "")
        timing = time_calls(calls, ctx.device, stream=ctx.stream, target_s=ctx.target_s,
                            synchronize=ctx.synchronize)
        row.update(status="ok", ms=timing.ms / per_call, spread=timing.spread,
                   calls=timing.calls * per_call, timing=timing.method + mode, sets=len(runner.calls))
        row.update(getattr(runner, "info", None) or {})
        if check is not None and callable(getattr(runner, "output", None)):
            err = check.error(runner.output())
            limit = getattr(runner, "error_limit", None) or check.limit  # a peer of coarser arithmetic (FP8)
            row["ref_err"] = err
            if not err <= limit:  # NaN fails too
                row["status"] = "mismatch"
                row["reason"] = (f"output differs from the float64 reference: relative error "
                                 f"{err:.3g} > {limit:g} on sampled rows")
        return row
    except Unsupported as e:
        row.update(status="unsupported", reason=str(e))
    except Exception as e:  # noqa: BLE001 - one peer's failure must not end the run
        row.update(status="error", reason=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                   traceback=traceback.format_exc(limit=4)[-1500:])
        _check_context(ctx, name)
    finally:
        runner = None
        release(ctx)  # this peer's buffers back to the device before the next one asks
    return row


def _check_context(ctx: Context, name: str) -> None:
    """After a failure on CUDA: is the context still usable? (An illegal address is sticky.)"""
    if ctx.device != "cuda":
        return
    try:
        ctx.synchronize()
    except Exception as e:  # noqa: BLE001
        ctx.broken = f"CUDA context lost after peer {name}: {str(e).splitlines()[0][:200]}"


def stop_if_broken(ctx: Context, suite: dict, remaining: list) -> bool:
    """Ends a suite whose CUDA context is gone, listing what was not run."""
    if not ctx.broken:
        return False
    suite["notes"].append(ctx.broken + "; the suite stopped (run it again after fixing that peer)")
    suite["not_run"].extend(remaining)
    return True


def release(ctx: Context) -> None:
    """Between configurations: drop garbage and hand torch's cache back."""
    gc.collect()
    try:
        ctx.tensors.release_cache()
    except Exception as e:  # noqa: BLE001 - a lost context is reported by stop_if_broken
        ctx.broken = ctx.broken or f"CUDA context lost: {str(e).splitlines()[0][:200]}"


def add_ratios(rows: list[dict], value_key: str, higher_is_better: bool = True) -> None:
    """For one configuration's rows: ``best_peer`` / ``vs_best_peer`` on each of ours, the ratio
    of its ``value_key`` to the best competitor's (> 1 = ours is better)."""
    peers = [r for r in rows if r.get("status") == "ok" and r["peer"] not in OURS and value_key in r]
    if not peers:
        return
    best = (max if higher_is_better else min)(peers, key=lambda r: r[value_key])
    for r in rows:
        if r["peer"] in OURS and r.get("status") == "ok" and value_key in r:
            ratio = r[value_key] / best[value_key] if higher_is_better else best[value_key] / r[value_key]
            r.update(best_peer=best["peer"], vs_best_peer=ratio)


def run_grid(ctx: Context, suite: dict, todo: list[dict], builders: dict, run_config, ceilings: dict,
             budget: Budget, args, save, progress, name: str) -> None:
    """Runs `run_config` over a suite's configurations within the time budget, saving after each;
    `--peers` narrows the peers. Configurations past the budget are listed as not run."""
    if getattr(args, "peers", None):
        builders = {k: v for k, v in builders.items() if k in args.peers}
    bar = progress(todo, desc=f"{name} ({ctx.device})", unit="cfg")
    for i, cfg in enumerate(bar):
        if not budget.allows():
            suite["not_run"].extend(todo[i:])
            suite["notes"].append(f"time budget of {budget.seconds:.0f} s reached: "
                                  f"{len(todo) - i} configurations not run")
            break
        suite["rows"].extend(run_config(ctx, cfg, builders, ceilings, bar))
        suite["elapsed_s"] = budget.elapsed
        save()
        if stop_if_broken(ctx, suite, todo[i + 1:]):
            break
