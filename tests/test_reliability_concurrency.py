"""Concurrency on CPUExecutionProvider: one session run from 16 threads at once, several sessions
in one process, sessions created and destroyed while others run. Every result must be bitwise
identical to the same input run alone on one thread: the CPU kernel's work split depends on the
shapes only, never on thread count or timing."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from _onnx_models import flash_attention_model
from _session_runs import run_bound, session
from cases import DTYPES, make_inputs

THREADS = 16
# Shapes that give the CPU kernel many tiles (so pool threads interleave) and every feature
# that has per-call state: GQA, causal, an additive mask, softmax_lse, a KV cache.
CASES = {
    "fp32_gqa_mask": dict(dtype="float32", b=2, hq=8, hkv=2, sq=67, skv=131, d=64, causal=True,
                          mask=("additive", "b1qk")),
    "fp16_past": dict(dtype="float16", b=2, hq=4, hkv=4, sq=9, skv=9, past=120, d=32, causal=True),
    "bf16_3d_nonpad": dict(dtype="bfloat16", b=3, hq=6, hkv=3, sq=40, skv=77, d=48,
                           layout="bsd", nonpad=True, window=(24, -1)),
}


class Case:
    """A case's model and output specs, with fresh inputs per seed."""

    def __init__(self, spec: dict):
        self.spec = spec
        feeds, attrs, _ = make_inputs(spec, np.random.default_rng(0))
        dtype = DTYPES[spec["dtype"]]
        self.model = flash_attention_model(feeds, {"Y": dtype, "softmax_lse": np.float32}, **attrs)
        b, hq, sq, d = spec["b"], spec["hq"], spec["sq"], spec["d"]
        y_shape = (b, sq, hq * d) if spec.get("layout") == "bsd" else (b, hq, sq, d)
        self.specs = {"Y": (y_shape, dtype), "softmax_lse": ((b, hq, sq), np.float32)}

    def feeds(self, seed: int) -> dict:
        return make_inputs(self.spec, np.random.default_rng(seed))[0]


@pytest.fixture(scope="module")
def cases():
    return {name: Case(spec) for name, spec in CASES.items()}


def _alone(case: Case, seeds) -> dict:
    """Each seed's outputs from its own single-threaded session (intra-op threads = 1)."""
    sess = session(case.model, threads=1)
    return {s: run_bound(sess, case.feeds(s), case.specs) for s in seeds}


def _same(got: dict, want: dict, what: str):
    for name in want:
        assert np.array_equal(got[name].view(np.uint8), want[name].view(np.uint8)), (
            f"{what}: {name} differs from the single-threaded run")


def _run_threads(target, n: int):
    """Runs target(i) on n threads started together; re-raises the first failure."""
    barrier = threading.Barrier(n)
    errors = []

    def body(i):
        try:
            barrier.wait()
            target(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("name", CASES)
def test_one_session_many_threads(cases, name):
    case = cases[name]
    seeds = list(range(THREADS))
    want = _alone(case, seeds)
    sess = session(case.model)  # the default intra-op pool, shared by all callers
    feeds = {s: case.feeds(s) for s in seeds}

    def worker(i):
        for rep in range(3):
            s = seeds[(i + rep) % THREADS]  # every thread its own input, then its neighbours'
            _same(run_bound(sess, feeds[s], case.specs), want[s], f"thread {i} run {rep}")

    _run_threads(worker, THREADS)


def test_results_do_not_depend_on_intra_op_threads(cases):
    case = cases["fp32_gqa_mask"]
    feeds = case.feeds(7)
    want = run_bound(session(case.model, threads=1), feeds, case.specs)
    for threads in (2, 3, 8):
        _same(run_bound(session(case.model, threads=threads), feeds, case.specs), want,
              f"intra_op_num_threads={threads}")


def test_several_sessions_and_churn(cases):
    """Every case's session runs on its own threads while one more thread creates, runs and
    destroys sessions of every case in a loop."""
    seeds = list(range(4))
    want = {name: _alone(case, seeds) for name, case in cases.items()}
    sessions = {name: session(case.model) for name, case in cases.items()}
    names = list(cases)
    stop = threading.Event()
    churned = []

    def runner(i):
        if i == len(names):  # the churn thread
            try:
                for rep in range(8):
                    for name in names:
                        case = cases[name]
                        s = seeds[rep % len(seeds)]
                        fresh = session(case.model)
                        _same(run_bound(fresh, case.feeds(s), case.specs), want[name][s],
                              f"fresh session of {name}")
                        del fresh
                        churned.append(name)
            finally:
                stop.set()
            return
        name = names[i % len(names)]
        case, feeds = cases[name], {s: cases[name].feeds(s) for s in seeds}
        rep = 0
        while not stop.is_set() or rep < 4:
            s = seeds[rep % len(seeds)]
            _same(run_bound(sessions[name], feeds[s], case.specs), want[name][s],
                  f"long-lived session of {name}")
            rep += 1

    _run_threads(runner, len(names) + 1)
    assert len(churned) == 8 * len(names)
