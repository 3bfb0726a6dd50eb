"""How aot/build.py spreads its compiles over the CPUs and reports progress: longest first on
every available core, a line per kernel (done / total, elapsed, estimate) on stderr, which
`pip install -v` shows as it goes, and a notice on the terminal where pip hides the build's output."""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from .variants import TileConfig, Variant


def estimated_cost(v: Variant, arch: int, cfg: TileConfig) -> float:
    """CPU-seconds a job takes, roughly, for the longest-first order and the progress estimate:
    fitted to the cold build's per-kernel times (docs/build-time.md: full mask tiles, fp32 dots
    on CUDA cores and the 256 head dim cost the most; TMA, Gluon and combine the least)."""
    cost = {"fwd": 1.2, "fwd_tma": 0.9, "fwd_gluon": 0.3, "decode": 1.5, "combine": 0.2}.get(v.kind, 1.0)
    if v.kind in ("fwd_tma", "fwd_gluon", "combine"):
        return cost
    if v.dtype == "fp32":
        cost *= 1.2 if v.kind == "decode" else (0.8 if v.precision == "tf32" else 1.6)
    if v.mask != "none" and not v.mask_keys:
        cost *= 1.6 if v.kind == "decode" else (3.0 if v.head_dim <= 32 else 2.0)
    return cost * (1.1 if v.extras else 1.0) * (1.3 if v.head_dim >= 256 else 1.0) * (
        1.0 if v.even_d else 1.1)


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which a container or taskset limits;
    os.cpu_count() counts the host's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _fmt_s(t: float) -> str:
    t = int(round(t))
    return f"{t // 60}m{t % 60:02d}s" if t >= 60 else f"{t}s"


def _tty(line: str):
    """A line on the terminal where pip hides the build's output (plain `pip install .` captures
    stderr and shows a spinner; -v shows stderr as it comes): none without a terminal (CI)."""
    if sys.stderr.isatty():
        return
    try:
        with open("/dev/tty", "w") as tty:
            tty.write("\n" + line + "\n")
    except OSError:
        pass


def _notice(line: str):
    print(line, file=sys.stderr, flush=True)
    _tty(line)


def compile_all(jobs: list[tuple], fresh: list[bool], compile_one, workers: int) -> list[dict]:
    """Runs compile_one over `jobs` ((variant, arch, tile, cache dir); `fresh`: not in the cache)
    on `workers` processes, the costliest first (so that the last ones to finish are short and no
    core idles at the end), printing progress to stderr; returns the metas in job order."""
    todo = [i for i, f in enumerate(fresh) if f]
    cost = {i: estimated_cost(jobs[i][0], jobs[i][1], jobs[i][2]) for i in todo}
    order = sorted(todo, key=lambda i: -cost[i]) + [i for i in range(len(jobs)) if i not in cost]
    metas: list[dict | None] = [None] * len(jobs)
    total_cost = sum(cost.values()) or 1.0
    if todo:
        _notice(f"aot/build.py: compiling {len(todo)} CUDA kernels ({len(jobs) - len(todo)} cached) "
                f"on {workers} processes, about {_fmt_s(total_cost / max(1, workers))} on idle "
                f"cores (`pip install -v` shows each kernel)")
    start = time.perf_counter()
    done_cost = 0.0
    quarter = 1
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(compile_one, jobs[i]): i for i in order}
        n = 0
        for fut in as_completed(futures):
            i = futures[fut]
            metas[i] = fut.result()
            if metas[i]["cached"]:
                continue
            n += 1
            done_cost += cost.get(i, 0.0)
            elapsed = time.perf_counter() - start
            left = elapsed * (total_cost - done_cost) / max(done_cost, 1e-9)
            m = metas[i]
            print(f"aot: [{n:{len(str(len(todo)))}}/{len(todo)}] {_fmt_s(elapsed)} elapsed, "
                  f"~{_fmt_s(left)} left  {m['variant']} sm_{m['arch']} "
                  f"{sum(m['stage_s'].values()):.1f} CPU-s", file=sys.stderr, flush=True)
            if quarter < 4 and n >= quarter * len(todo) / 4:
                _tty(f"aot/build.py: {n}/{len(todo)} kernels, {_fmt_s(elapsed)} elapsed, "
                     f"~{_fmt_s(left)} left")
                quarter += 1
    if todo:
        _notice(f"aot/build.py: compiled {len(todo)} kernels in {_fmt_s(time.perf_counter() - start)}")
    return metas
