"""Timing callables the way METHOD.md asks: warm-up, rotating input sets, many runs, the median.

``time_calls(calls, device)`` takes one callable per input set and cycles through them.

* CUDA (torch present): every call enqueues work on one stream (ONNX Runtime sessions get it as
  ``user_compute_stream`` and run with ``disable_synchronize_execution_providers``; torch runs
  under ``torch.cuda.stream``; the fused kernel is launched on it). CUDA events bracket chunks of
  back-to-back calls, each chunk at least ~1 ms so event overhead vanishes; the result is the
  median over chunks of the time per call. Host launch cost counts where it is the bottleneck,
  as it does for a user; ``cuda_graph_calls`` removes it for torch callables and ONNX Runtime's
  ``enable_cuda_graph`` for sessions (decode shapes).
* CPU, or CUDA without torch: a host clock around each (synchronous) call; the median.

``ort_flash.timing.SessionTimer`` (host clock, numpy feeds) stays the timer for whole models.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Callable, Sequence


@dataclasses.dataclass
class Timing:
    ms: float  # median time per call
    spread: float  # (p75 - p25) / median over the samples ((max - min) / median under 4)
    samples: int  # chunks (CUDA) or calls (host) timed
    calls: int  # calls timed in all
    method: str  # "cuda_events" | "host_clock"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _spread(xs: Sequence[float]) -> float:
    """(p75 - p25) / median; (max - min) / median for fewer than 4 samples."""
    med = statistics.median(xs)
    if med <= 0 or len(xs) < 2:
        return 0.0
    if len(xs) < 4:
        return (max(xs) - min(xs)) / med
    q = statistics.quantiles(xs, n=4)
    return (q[2] - q[0]) / med


def time_calls(calls: Sequence[Callable[[], object]], device: str, *, stream=None,
               target_s: float = 0.25, warmup: int = 3, min_samples: int = 5,
               max_samples: int = 50, synchronize: Callable[[], None] | None = None) -> Timing:
    """Median time per call of ``calls`` cycled in order (one per rotating input set)."""
    if not calls:
        raise ValueError("nothing to time")
    torch = _torch_cuda() if device == "cuda" else None
    if torch is not None:
        return _time_cuda_events(torch, calls, stream, target_s, warmup, min_samples, max_samples)
    return _time_host(calls, target_s, warmup, min_samples, max_samples * 4, synchronize)


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _time_host(calls, target_s, warmup, min_samples, max_samples, synchronize) -> Timing:
    sync = synchronize or (lambda: None)
    n = len(calls)
    t0 = time.perf_counter()
    calls[0]()
    sync()
    est = max(time.perf_counter() - t0, 1e-6)
    if est < 0.5:  # calls of seconds need no more warming than the first
        for i in range(max(warmup, n)):
            calls[i % n]()
        sync()
    reps = int(min(max_samples, max(min_samples, math.ceil(target_s / est))))
    times = []
    for i in range(reps):
        t0 = time.perf_counter()
        calls[i % n]()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return Timing(statistics.median(times), _spread(times), reps, reps, "host_clock")


def _time_cuda_events(torch, calls, stream, target_s, warmup, min_samples, max_samples) -> Timing:
    stream = stream or torch.cuda.current_stream()
    n = len(calls)
    with torch.cuda.stream(stream):
        for i in range(max(warmup, n)):
            calls[i % n]()
        stream.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for i in range(n):
            calls[i]()
        end.record(stream)
        end.synchronize()
        est_ms = max(start.elapsed_time(end) / n, 1e-4)
        chunk = max(n, math.ceil(1.0 / est_ms))  # >= ~1 ms of work per chunk
        chunk = n * math.ceil(chunk / n)  # whole rotations
        samples = int(min(max_samples, max(min_samples, math.ceil(target_s * 1e3 / (chunk * est_ms)))))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(samples)]
        k = 0
        for ev0, ev1 in events:
            ev0.record(stream)
            for _ in range(chunk):
                calls[k % n]()
                k += 1
            ev1.record(stream)
        stream.synchronize()
    per_call = [ev0.elapsed_time(ev1) / chunk for ev0, ev1 in events]
    return Timing(statistics.median(per_call), _spread(per_call), samples, samples * chunk,
                  "cuda_events")


def cuda_graph_calls(calls: Sequence[Callable[[], object]], stream, warmup: int = 2,
                     min_calls: int = 32) -> tuple[list, int]:
    """Captures the torch callables, cycled through at least ``min_calls`` times, in one CUDA
    graph on ``stream``: ``([replay], calls per replay)``. One replay then carries no launch
    gap between calls, so the time per call is the device's alone.

    The callables must be capturable (no host sync, fixed addresses); they are warmed up first
    so lazy module loads and workspace allocations happen outside capture.
    """
    import torch

    n = len(calls)
    per_replay = n * math.ceil(min_calls / n)
    with torch.cuda.stream(stream):
        for fn in calls:
            for _ in range(warmup):
                fn()
        stream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            for i in range(per_replay):
                calls[i % n]()
        stream.synchronize()
    return [g.replay], per_replay
