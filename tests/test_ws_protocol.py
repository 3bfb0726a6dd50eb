"""The warp-specialized kernel's barrier protocol, played out on the CPU (Gluon has no interpreter in
Triton 3.6, and a wrong phase on the GPU is a hang or a silent overwrite).

The partitions of the warp-specialized kernel (aot/flash_fwd_gluon_ws.py, aot/gluon_ws/) on the
persistent grid (the producer, NC consumers per CTA, several CTAs sharing the dynamic tile counter)
are mirrored here line for line as Python generators
over simulated mbarriers: arrive, expect (arrive.expect_tx), TMA completions that land in any
order, waits by phase parity as the hardware does them. A random scheduler interleaves them and
checks that no schedule deadlocks, that no wait passes on a phase other than the one its parity
names (an aliased phase), that every load a consumer reads holds its own tile's block when it
waits for it and still holds it when it frees the slot (no load overwrites a slot in use), that
every (batch x head, tile, consumer) row block is written once, and that the dynamic counter is
back at zero. The barrier phases are checked against the kernel's source lines, so a change to them
fails here until the mirror follows (they wait on mbarriers, which no host run of the kernel's own
code can do); the tiles each CTA runs, their order and their key blocks are the kernel's own
scheduler (aot/gluon_ws/scheduler.py), run on the host (tests/_gluon_host.py).
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("triton.experimental.gluon", reason="the kernel's scheduler is Gluon source")

from _gluon_host import HostGl, host  # noqa: E402

from aot.gluon_ws import scheduler  # noqa: E402

AOT = Path(__file__).resolve().parents[1] / "aot"
SRC = "".join(p.read_text() for p in [AOT / "flash_fwd_gluon_ws.py", *sorted((AOT / "gluon_ws").glob("*.py"))])

# The lines the mirror below restates (a change to any of them must be mirrored).
MIRRORED = (
    "mbarrier.wait(q_empty.index(qb * NC + w), ((t // QB) & 1) ^ 1)",
    "mbarrier.wait(k_empty.index(st), phase ^ 1)",
    "mbarrier.wait(v_empty.index(st), phase ^ 1)",
    "mbarrier.wait(q_ready.index(q_idx), (t // QB) & 1)",
    "mbarrier.wait(k_ready.index(st0), (c0 // NUM_STAGES) & 1)",
    "mbarrier.wait(k_ready.index(st), (c // NUM_STAGES) & 1)",
    "mbarrier.wait(v_ready.index(prev), ((c - 1) // NUM_STAGES) & 1)",
    "mbarrier.wait(turns.index(WG), ((i0 + j - 1) & 1) ^ (1 if WG == 0 else 0))",
    "mbarrier.arrive(turns.index((WG + 1) % NC))",
    "mbarrier.wait(v_ready.index(last), (c_last // NUM_STAGES) & 1)",
    "mbarrier.wait(v_ready.index(c_last % NUM_STAGES), (c_last // NUM_STAGES) & 1)",
    "mbarrier.wait(q_empty.index(qb * NC + w), ((tt // 2) & 1) ^ 1)",
    "mbarrier.wait(q_ready.index(qb * NC + WG), (tt // 2) & 1)",
    "_publish_tile(ids, q_ready, q_empty, -1, tt, NC, True)",
    "if m0 + WG * WG_M >= Sq:",
    "t, c0, c0 - t, m_base, WG, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG,",
    "tt, c0, c0 - tt, m_base, WG, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG,",
    "mbarrier.init(k_empty.index(i), count=NC)",
    "if done == gl.num_programs(0) - 1:",
)


class ProtocolError(Exception):
    pass


class Bar:
    """An mbarrier: `count` arrivals and the expected transaction bytes complete a phase."""

    def __init__(self, count: int):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self):
        if self.pending == 0:  # a phase still waiting for its bytes
            raise ProtocolError("an arrival on a barrier whose phase has all its arrivals")
        self.pending -= 1
        self._complete()

    def expect(self, nbytes: int):  # arrive.expect_tx
        self.tx += nbytes
        self.arrive()

    def land(self, nbytes: int):  # a TMA's complete_tx
        self.tx -= nbytes
        if self.tx < 0:
            raise ProtocolError("bytes landed that no expect announced")
        self._complete()


class Wait:
    """A wait for phase k (-1: the phase before the first, which a fresh barrier has passed) by
    its parity, as try_wait.parity does it."""

    def __init__(self, bar: Bar, k: int):
        self.bar, self.k = bar, k

    def ready(self) -> bool:
        return (self.bar.phase & 1) != (self.k & 1)


class Sim:
    def __init__(self, *, ctas, bh_all, sq, causal, nc, stages, wg_m, block_n, dynamic, skip, seed):
        self.bh_all, self.sq, self.causal = bh_all, sq, causal
        self.nc, self.stages, self.wg_m, self.block_n = nc, stages, wg_m, block_n
        self.block_m = wg_m * nc
        self.dynamic, self.skip = dynamic, skip
        self.n_m = -(-sq // self.block_m)
        self.total = self.n_m * bh_all
        self.ctas = min(ctas, self.total)  # the launcher's grid: min(CTAs per SM x SMs, tiles)
        self.grp = 2  # any group size: the kernel's depends on Skv
        self.rng = random.Random(seed)
        self.counter = [0, 0]
        self.tma = []  # (slot list, index, content, barrier)
        self.written = []
        self.errors = []

    # The tile maps: the kernel's scheduler, run on the host for CTA g0 of the persistent grid.
    def _gl(self, g0=0):
        return HostGl((self.ctas, 1, 1), (g0, 0, 0))

    def tile_of(self, tid):  # (batch x head, query tile); Hq 1: b is the pair's index
        m, _, _, _, bh = host(scheduler._tile_of, self._gl())(tid, self.n_m, self.bh_all, self.grp, 1, 1)
        return bh, m

    def cta_tile(self, g0, t):
        m, _, _, _, bh = host(scheduler._cta_tile, self._gl(g0))(
            t, g0, self.n_valid(g0), self.sq, int(self.causal), self.bh_all, 1, 1, 0, 0, 0, 0, self.block_m, True)
        return bh, m

    def span(self, m):  # (first row, key blocks); offset 0, Skv == Sq
        m0, _, n_blocks = host(scheduler._tile_span, self._gl())(m, self.sq, self.sq, 0, int(self.causal),
                                                                 self.block_m, self.block_n)
        return m0, n_blocks

    def n_valid(self, g0):
        return host(scheduler._cta_tiles, self._gl(g0))(0, self.sq, self.bh_all, self.block_m, 2, True)[1]

    def check(self, slots, idx, want, what):
        if slots[idx] != want:
            self.errors.append(f"{what}: slot {idx} holds {slots[idx]}, expected {want}")

    def wait(self, bar, k):
        w = Wait(bar, k)
        yield w
        if bar.phase != k + 1:
            self.errors.append(f"a wait for phase {k} passed at phase {bar.phase} (aliased)")

    def load(self, slots, idx, content, bar):
        bar.expect(1)
        self.tma.append((slots, idx, content, bar))

    # One CTA's shared state and partitions.
    def cta(self, g0):
        nc, st = self.nc, self.stages
        s = dict(q=[None] * (2 * nc), k=[None] * st, v=[None] * st, ids=[None, None],
                 q_ready=[Bar(1) for _ in range(2 * nc)], q_empty=[Bar(1) for _ in range(2 * nc)],
                 k_ready=[Bar(1) for _ in range(st)], v_ready=[Bar(1) for _ in range(st)],
                 k_empty=[Bar(nc) for _ in range(st)], v_empty=[Bar(nc) for _ in range(st)],
                 turns=[Bar(1) for _ in range(nc)])
        return [self.producer(s, g0)] + [self.consumer(s, g0, wg) for wg in range(nc)]

    def claim(self, tid):  # _claim
        if not self.dynamic:
            return tid + self.ctas
        self.counter[0] += 1
        return self.ctas + self.counter[0] - 1

    def producer_tile(self, s, tid, bh, m, t, c0):  # _producer_q + _producer_kv, QB 2
        nc, qb = self.nc, t % 2
        for w in range(nc):
            yield from self.wait(s["q_empty"][qb * nc + w], t // 2 - 1)
            self.load(s["q"], qb * nc + w, (tid, w), s["q_ready"][qb * nc + w])
        _, nb = self.span(m)
        for j in range(nb):
            c = c0 + j
            stg = c % self.stages
            yield from self.wait(s["k_empty"][stg], c // self.stages - 1)
            self.load(s["k"], stg, (tid, j), s["k_ready"][stg])
            yield from self.wait(s["v_empty"][stg], c // self.stages - 1)
            self.load(s["v"], stg, (tid, j), s["v_ready"][stg])
        return nb

    def publish(self, s, tid, tt, sentinel):  # _publish_tile
        nc, qb = self.nc, tt % 2
        for w in range(nc):
            yield from self.wait(s["q_empty"][qb * nc + w], tt // 2 - 1)
        s["ids"][qb] = tid
        if sentinel:
            for w in range(nc):
                s["q_ready"][qb * nc + w].arrive()

    def producer(self, s, g0):
        c0 = 0
        if self.dynamic:
            tid, tt = g0, 0
            nxt = self.claim(tid)
            while tid < self.total:
                bh, m = self.tile_of(tid)
                yield from self.publish(s, tid, tt, False)
                c0 += yield from self.producer_tile(s, tid, bh, m, tt, c0)
                tt += 1
                tid = nxt
                if tid < self.total:
                    nxt = self.claim(tid)
            yield from self.publish(s, -1, tt, True)
            self.counter[1] += 1
            if self.counter[1] - 1 == self.ctas - 1:
                self.counter[:] = [0, 0]
        else:
            for t in range(self.n_valid(g0)):
                bh, m = self.cta_tile(g0, t)
                c0 += yield from self.producer_tile(s, g0 + t * self.ctas, bh, m, t, c0)

    def consumer(self, s, g0, wg):
        c0 = 0
        if self.dynamic:
            tt = 0
            qb = 0
            yield from self.wait(s["q_ready"][qb * self.nc + wg], 0)
            tid = s["ids"][qb]
            while tid >= 0:
                bh, m = self.tile_of(tid)
                c0 += yield from self.consumer_tile(s, tid, bh, m, wg, tt, c0, c0 - tt)
                tt += 1
                qb = tt % 2
                yield from self.wait(s["q_ready"][qb * self.nc + wg], tt // 2)
                tid = s["ids"][qb]
        else:
            for t in range(self.n_valid(g0)):
                bh, m = self.cta_tile(g0, t)
                c0 += yield from self.consumer_tile(s, g0 + t * self.ctas, bh, m, wg, t, c0, c0 - t)

    def consumer_tile(self, s, tid, bh, m, wg, t, c0, i0):
        nc, stages = self.nc, self.stages
        m0, nb = self.span(m)
        q_idx = (t % 2) * nc + wg
        passing = self.skip and wg > 0 and m0 + wg * self.wg_m >= self.sq
        yield from self.wait(s["q_ready"][q_idx], t // 2)
        if not passing:
            self.check(s["q"], q_idx, (tid, wg), "Q")
        st0 = c0 % stages
        yield from self.wait(s["k_ready"][st0], c0 // stages)
        if not passing:
            self.check(s["k"], st0, (tid, 0), "K")
        s["k_empty"][st0].arrive()
        for j in range(1, nb):
            c = c0 + j
            stg, prev = c % stages, (c - 1) % stages
            yield from self.wait(s["k_ready"][stg], c // stages)
            yield from self.wait(s["v_ready"][prev], (c - 1) // stages)
            n = i0 + j - 1  # this consumer's turn
            yield from self.wait(s["turns"][wg], n if wg else n - 1)
            if not passing:
                self.check(s["k"], stg, (tid, j), "K")
                self.check(s["v"], prev, (tid, j - 1), "V")
            s["turns"][(wg + 1) % nc].arrive()
            if not passing:
                self.check(s["k"], stg, (tid, j), "K at release")
            s["k_empty"][stg].arrive()
            if not passing:
                self.check(s["v"], prev, (tid, j - 1), "V at release")
            s["v_empty"][prev].arrive()
        c_last = c0 + nb - 1
        last = c_last % stages
        yield from self.wait(s["v_ready"][last], c_last // stages)
        if not passing:
            self.check(s["v"], last, (tid, nb - 1), "V")
        s["v_empty"][last].arrive()
        if not passing:
            self.check(s["q"], q_idx, (tid, wg), "Q at the output store")
            self.written.append((bh, m, wg))
        s["q_empty"][q_idx].arrive()
        return nb

    def run(self):
        try:
            self._run()
        except ProtocolError as e:
            self.errors.append(str(e))

    def _run(self):
        procs = [p for g in range(self.ctas) for p in self.cta(g)]
        # Each partition starts when the schedule picks it: CTAs start (and make their first
        # claims) in any order, some after others have run tiles.
        waits = {p: _STARTING for p in procs}
        while waits or self.tma:
            runnable = [p for p, w in waits.items() if w.ready()]
            choices = runnable + [None] * len(self.tma)
            if not choices:
                self.errors.append(f"deadlock: {len(waits)} partitions waiting, no load in flight")
                return
            pick = self.rng.choice(choices)
            if pick is None:  # a load lands
                slots, idx, content, bar = self.tma.pop(self.rng.randrange(len(self.tma)))
                slots[idx] = content
                bar.land(1)
                continue
            try:
                waits[pick] = pick.send(None)
            except StopIteration:
                del waits[pick]


class _Starting:
    """What a partition not yet started waits on: nothing."""

    def ready(self):
        return True


_STARTING = _Starting()


def test_mirror_matches_the_kernel_source():
    for line in MIRRORED:
        assert line in SRC, f"the kernel's barrier protocol changed ({line!r}): update this mirror"


@pytest.mark.parametrize("dynamic,skip", [(True, False), (True, True), (False, True)], ids=["dynamic", "dynamic-skip", "skip"])
@pytest.mark.parametrize("nc,stages,wg_m,sq,bh_all,causal,ctas", [
    (2, 2, 64, 300, 5, True, 3),    # d128's tile: a last tile whose upper consumer has no rows
    (2, 2, 64, 129, 3, False, 4),   # more CTAs than some need
    (3, 3, 64, 320, 4, True, 2),    # d64's tile: one of three consumers without rows
    (3, 3, 64, 200, 3, False, 5),   # two of three without rows in the last tile
    (2, 2, 64, 512, 2, True, 7),
])
def test_protocol_under_random_schedules(dynamic, skip, nc, stages, wg_m, sq, bh_all, causal, ctas):
    block_n = 64
    for seed in range(12):
        sim = Sim(ctas=ctas, bh_all=bh_all, sq=sq, causal=causal, nc=nc, stages=stages, wg_m=wg_m,
                  block_n=block_n, dynamic=dynamic, skip=skip, seed=seed)
        sim.run()
        assert not sim.errors, sim.errors[:5]
        want = [(bh, m, wg) for bh in range(bh_all) for m in range(sim.n_m) for wg in range(nc)
                if not (skip and wg > 0 and m * sim.block_m + wg * wg_m >= sq)]
        assert sorted(sim.written) == sorted(want), seed
        assert sim.counter == [0, 0]


def test_the_simulator_catches_a_wrong_phase():
    """The same checks fail on a protocol with one parity wrong (the producer not waiting for
    the consumers to free a K slot), so the test above can fail."""
    class Broken(Sim):
        def wait(self, bar, k):
            if bar.count == self.nc and k >= 0:  # an empty barrier: wait one phase early
                k -= 1
            yield from Sim.wait(self, bar, k)

    bad = 0
    for seed in range(12):
        sim = Broken(ctas=2, bh_all=3, sq=300, causal=True, nc=2, stages=2, wg_m=64, block_n=64,
                     dynamic=True, skip=False, seed=seed)
        sim.run()
        bad += bool(sim.errors)
    assert bad > 0
