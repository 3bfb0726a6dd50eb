"""Timing ONNX Runtime sessions the way METHOD.md asks: warm-up, several fresh input sets in
rotation, device-resident inputs and outputs on CUDA (IOBinding), the median of many runs."""
from __future__ import annotations

import json
import os
import statistics
import time


class SessionTimer:
    """Times `session.run` over rotating feed sets; on CUDA binds inputs and outputs on device.

    ``bindings``: IOBindings the caller prepared instead (inputs and outputs bound to buffers it
    owns, on any device, e.g. a KV cache filled on the GPU), run in rotation; ``feed_sets`` is
    then unused."""

    def __init__(self, session, feed_sets: list[dict], device: str = "cpu", bindings: list | None = None):
        self.session = session
        self.device = device
        self.bindings = list(bindings or [])
        if device == "cuda" and not self.bindings:
            import onnxruntime as ort
            for feeds in feed_sets:
                io = session.io_binding()
                for name, value in feeds.items():
                    io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
                for out in session.get_outputs():
                    io.bind_output(out.name, "cuda")
                self.bindings.append(io)
        self.feed_sets = feed_sets

    def run_once(self, i: int = 0) -> None:
        if self.bindings:
            io = self.bindings[i % len(self.bindings)]
            io.synchronize_inputs()
            self.session.run_with_iobinding(io)
            io.synchronize_outputs()
        else:
            self.session.run(None, self.feed_sets[i % len(self.feed_sets)])

    def median_ms(self, repeat: int, warmup: int = 3) -> float:
        return interleaved_medians([self], repeat, warmup)[0]


def interleaved_medians(timers: list[SessionTimer], repeat: int, warmup: int = 3) -> list[float]:
    """The median ms of each timer, timed in rounds of one run each (the order rotating per round),
    so that a drift of the machine's speed (other load, clocks) hits every session alike instead
    of whichever ran last."""
    for i in range(warmup):
        for t in timers:
            t.run_once(i)
    times: list[list[float]] = [[] for _ in timers]
    for r in range(repeat):
        for k in range(len(timers)):
            j = (r + k) % len(timers)
            t0 = time.perf_counter()
            timers[j].run_once(r)
            times[j].append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(ts) for ts in times]


def node_placements(model, feeds: dict, providers, sess_options) -> dict[tuple[str, str], int]:
    """{(op type, execution provider): count} of the nodes ONNX Runtime actually ran, read from
    its profiler (the proof of where the fused op executes)."""
    import onnxruntime as ort

    sess_options.enable_profiling = True
    sess = ort.InferenceSession(model, sess_options, providers=providers)
    sess.run(None, feeds)
    path = sess.end_profiling()
    try:
        with open(path) as f:
            events = json.load(f)
    finally:
        os.unlink(path)
    counts: dict[tuple[str, str], int] = {}
    seen = set()
    for e in events:
        args = e.get("args", {})
        if e.get("cat") == "Node" and "op_name" in args and e.get("name", "").endswith("_kernel_time"):
            key = (e["name"], args.get("provider", "?"))
            if key in seen:
                continue
            seen.add(key)
            k = (args["op_name"], args.get("provider", "?"))
            counts[k] = counts.get(k, 0) + 1
    return counts
