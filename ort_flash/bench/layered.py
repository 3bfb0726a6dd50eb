"""Sessions that run a model of several copies of a peer's node, as a model's layers run (the
decode, gqa and op suites under CUDA graphs): ``layered_session`` binds copy j of run i to input
set (i + j) mod sets and reports a node's share of a run (``per_run``); ``session`` captures
ONNX Runtime's CUDA graph when the context asks for one, and runs without, saying so, where the
capture fails."""
from __future__ import annotations

import math

from ort_flash.bench import onnx_graphs
from ort_flash.bench.measure import Context
from ort_flash.bench.ort_session import BoundSession, Unsupported

LAYERS = 32  # nodes per session run for the layered peers (the torch graphs' >= 32 calls)
RUN_S = 1e-3  # fewer copies where a run of LAYERS would last longer than this
RATE_FLOPS, RATE_BYTES = 4e14, 4e12  # rough H200 rates, only to estimate a call's time


def copies(ctx: Context, call_s: float) -> int:
    """Copies of the node per run for calls of about ``call_s`` seconds: LAYERS, fewer where a run
    of about RUN_S already spreads ONNX Runtime's per-run cost (~2 us) thin; one without CUDA graphs."""
    if not (ctx.cuda_graph and ctx.device == "cuda"):
        return 1
    return max(1, min(LAYERS, math.ceil(RUN_S / call_s)))


def layered(n: int, model: bytes, feeds: list[dict], outs: list[dict]):
    """(model, per-run feeds, per-run outputs) with ``n`` copies of the node: run i's copy j
    binds set (i + j) mod len(feeds); a set's outputs are shared by the copies reading it (they
    write the same values, one after another)."""
    if n == 1:
        return model, feeds, outs
    sets = len(feeds)
    def bind(per_set: list[dict], i: int) -> dict:
        return {f"{k}__{j}": v for j in range(n) for k, v in per_set[(i + j) % sets].items()}
    return (onnx_graphs.replicate(model, n), [bind(feeds, i) for i in range(sets)],
            [bind(outs, i) for i in range(sets)])


def layered_session(ctx: Context, n: int, model: bytes, feeds: list[dict], outs: list[dict], **kw):
    """``session`` over ``n`` copies of the model's node (``layered``), timed per node:
    ``measure`` divides a run's time by the runner's ``per_run``."""
    run = session(ctx, *layered(n, model, feeds, outs), **kw)
    run.per_run = n
    if n > 1:
        run.info = dict(getattr(run, "info", None) or {}, layers=n)
    return run


def session(ctx: Context, model, inputs, outputs, **kw):
    """A bound session with CUDA graphs when the context asks for them; without, if capture fails."""
    if ctx.cuda_graph:
        ctx.synchronize()  # the inputs were filled on torch's default stream
        try:
            run = BoundSession(model, ctx.device, inputs, outputs, stream=ctx.stream, cuda_graph=True, **kw)
            run.check_runs(ctx.synchronize)
            return run
        except Unsupported as e:
            note = f"ORT CUDA graph failed ({e}); timed without"
            ctx.synchronize()
        run = BoundSession(model, ctx.device, inputs, outputs, stream=ctx.stream, **kw)
        run.info = {"note": note}
        return run
    return BoundSession(model, ctx.device, inputs, outputs, stream=ctx.stream, **kw)
