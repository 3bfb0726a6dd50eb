"""The warp-specialized kernel's barrier protocol, played out on the CPU by the kernel's own code
(Gluon has no interpreter in Triton 3.6, and a wrong phase on the GPU is a hang or a silent
overwrite).

Every partition of every CTA of a launch (aot/flash_fwd_gluon_ws.py's entry and warp_specialize;
aot/gluon_ws/'s producer, consumers, softmax and epilogue, the scheduler, the tile counter, the
visible-range hand-off) runs on the host (tests/_gluon_host.py), each on a thread of its own, one at
a time in a random order and at random relative speeds, over host stand-ins for the hardware
(`Hopper`): mbarriers waited on by phase parity as try_wait.parity does, TMA loads that land at
random later steps and count their bytes on their barrier, shared-memory slots that remember which
(tensor, batch, head, row) they hold, async wgmma reads and TMA stores. The tensors' values
(scores, softmax, accumulators, the mask) are not followed, and branching on one fails the run.

Checked for every schedule: no deadlock (every thread waiting, nothing in flight); no wait passing
on a phase other than the one its parity names (an aliased phase); no load over a slot a consumer
has read and not freed, and no slot changing under an async read or freed before its reader's MMA
or store has retired; every read of a slot holds the reading consumer's own tile's block (Q: its
rows; K and V: the tile's key blocks in order, all of those its rows see); every (batch x head,
tile, consumer) row block written exactly once (with SKIP_PAST_ROWS none of a consumer whose rows
all lie past Sq), from what that consumer stored; every barrier quiescent when the entry
invalidates it; the dynamic tile counter back at [0, 0]; and the hand-off words (the dynamic tiles'
id per Q buffer, `ids`; MASK_PREFIX's visible run, `lim_smem`: a value one partition stores from
registers and another loads) accessed in an order the barriers give: by vector clocks that each
arrival releases to its barrier's phase and each wait takes in, every load of a word must come
after its last store (the store behind a thread barrier before the arrival that publishes it), and
every store after the other threads' last reads and stores of it; a race fails the run
(Unordered) whether or not the schedule at hand makes a read see the wrong value. Over the
per-tile grid (one and two tiles per CTA), the persistent grid with static and dynamic tiles,
MASK_PREFIX, with and without SKIP_PAST_ROWS, two and three consumers, two to four ring slots.
The grids are the scheduler's formulas (tests/test_ws_scheduler.py holds them to the launcher's).

The checks are themselves tested by mutations injected through the host run's hooks (the kernel's
source untouched): a producer waiting one phase early on the K/V rings
(test_the_checks_catch_a_wrong_phase); the tile-id hand-off with the producer storing the next id
before its wait on q_empty, a consumer loading the id before its wait on q_ready, or the producer's
thread barrier dropped (test_the_checks_catch_a_tile_id_race, on shapes where only the Q buffers'
barriers order the id: tiles of one or two key blocks, the producer two tiles ahead); the visible
run's store not behind its thread barrier (test_the_checks_catch_a_visible_range_race).

Stubbed, because the host run cannot execute them as written: mask_prefix._visible_range (it
reduces the mask's values; its stand-in picks a visible run at random: none, from key 0, or, without
causal, from a later key); and an integer divided by zero, undefined on the GPU, is an Inert here.
The kernel's structs (aot/gluon_ws/params.py) run as plain host objects (_gluon_host.host).
"""
from __future__ import annotations

import collections
import inspect
import random

import pytest

pytest.importorskip("triton.experimental.gluon", reason="the kernel's source is Gluon")

from _gluon_host import (Around, Deadlock, Desc, HInt, Hopper, HostGl, Inert, Interleaving,  # noqa: E402
                         ProtocolError, Ptr, Unordered, host)

from aot import contract  # noqa: E402
from aot import flash_fwd_gluon_ws as entry  # noqa: E402
from aot.gluon_ws import mainloop  # noqa: E402

D = 64  # head dim: the box sizes; the protocol does not depend on it
GUARDS = {"k_empty": "k_ring", "v_empty": "v_ring", "q_empty": "q_smem"}  # a slot is freed on its empty barrier
WORDS = ("ids", "lim_smem")  # the hand-off words: the dynamic tiles' ids, MASK_PREFIX's visible run
SKEW = 4  # threads' speeds from 1/16 to 16: one partition may lag far behind the others
_TILE_ARGS = list(inspect.signature(mainloop._consumer_tile.fn).parameters)


def _cdiv(a, b):
    return -(-a // b)


class Launch:
    """One launch of the kernel on the host: its grid's CTAs, their partitions on threads."""

    def __init__(self, *, mode, b, hq, group, sq, skv, offset, causal, nc, stages, wg_m, block_n, skip,
                 ctas=0, seed=0, shift=None, counter=True, pingpong=True, overlap=False, mask_len=None,
                 stubs=None, drop_barrier=None, bounds=None):
        self.b, self.hq, self.group, self.sq, self.skv, self.offset, self.causal = b, hq, group, sq, skv, offset, causal
        self.nc, self.stages, self.wg_m, self.block_n, self.skip = nc, stages, wg_m, block_n, skip
        self.block_m = wg_m * nc
        self.mode, self.pingpong, self.overlap = mode, pingpong, overlap
        self.n_m = _cdiv(sq, self.block_m)
        self.persistent = mode in ("static", "dynamic")
        self.dynamic = mode == "dynamic"
        self.use_ctr = self.dynamic and counter
        self.tiles = 2 if mode == "tile2" else 1
        self.prefix = mode == "prefix"  # a key-vector mask: MASK_PREFIX's visible-range hand-off
        self.kv = min(skv, skv if mask_len is None else mask_len) if self.prefix else skv
        self.mask_len = skv if mask_len is None else mask_len
        self.ranges: dict = {}  # CTA -> the visible run its mask shows, (lo, end) or (-1, -1)
        self.rng = random.Random(seed)
        total = self.n_m * b * hq
        self.grid = (min(ctas, total), 1) if self.persistent else (_cdiv(sq, self.block_m * self.tiles), b * hq)
        self.counter = [0, 0]
        self.written = collections.Counter()
        self.ctx: dict = {}  # thread -> the consumer tile it runs: args, key blocks read
        self.run_ = Interleaving(random.Random(seed), skew=SKEW)
        self.hopper = Hopper(self.run_, GUARDS, self.on_read, self.on_store, shift, WORDS, drop_barrier)
        self.stubs = stubs or {}  # more stubs for host(): a test's mutation of the protocol
        self.bounds = bounds  # each batch row's key bound (has_seqlens), or None

    # What each consumer must read and write: its own tile's rows and key blocks.
    def key_blocks(self, m0, b):
        kv = self.kv if self.bounds is None else min(self.kv, self.bounds[b])
        hi = min(kv, min(m0 + self.block_m, self.sq) - 1 + self.offset + 1) if self.causal else kv
        return max(_cdiv(hi, self.block_n), 1)

    def visible_range(self, cta):
        """The stand-in for _visible_range (the mask's values are not modelled): for a CTA's keys
        [0, n), at random no single visible run, a run from key 0 (right padding) or, without
        causal, one from a later key (left padding); the same for every consumer of the CTA."""
        def stub(_m_base, n, *_a):
            if cta not in self.ranges:
                n = int(n)
                end = self.rng.randint(1, n)
                lo = self.rng.randrange(end) if not self.causal and self.rng.random() < 0.5 else 0
                self.ranges[cta] = (lo, end) if self.rng.random() < 0.7 else (-1, -1)
            return tuple(HInt(x) for x in self.ranges[cta])
        return stub

    def consumer_tile(self, real, cta):
        def tile(*args):
            a = dict(zip(_TILE_ARGS, args))
            t = a["tile"]  # the tile's struct (params.Tile)
            me = self.run_.me()
            lo, end = self.ranges.get(cta, (-1, -1))
            self.ctx[me] = c = dict(b=int(t.b), h=int(t.h), r0=int(t.m0) + int(a["WG"]) * self.wg_m,
                                   m0=int(t.m0), row0=max(lo, 0), K=0, V=0, out=None)
            real(*args)
            blocks = max(_cdiv(end - lo, self.block_n), 1) if lo >= 0 else self.key_blocks(c["m0"], c["b"])
            want = blocks if c["out"] else 0
            if (c["K"], c["V"]) != (want, want):
                raise ProtocolError(f"{self.run_.name()} read {c['K']} K and {c['V']} V blocks of a tile with "
                                    f"{want} to read (stored: {c['out']})")
            del self.ctx[me]
        return tile

    def on_read(self, me, slot, content):
        c = self.ctx[me]
        hk = c["h"] // self.group
        if slot.smem.name == "q_smem":
            want = ("Q", c["b"], c["h"], c["r0"])
        elif slot.smem.name in ("k_ring", "v_ring"):
            kind = slot.smem.name[0].upper()
            want = (kind, c["b"], hk, c["row0"] + c[kind] * self.block_n)
            c[kind] += 1
        else:
            raise ProtocolError(f"{self.run_.name()} reads {slot!r}")
        if content != want:
            raise ProtocolError(f"{self.run_.name()} reads {slot!r} holding {content}, expected {want}")

    def on_store(self, me, desc, coord, content):
        c = self.ctx[me]
        want = ("Y", (c["b"], c["h"], c["r0"]))
        if (desc, coord) != want or content[:2] != ("regs", me) or c["out"]:
            raise ProtocolError(f"{self.run_.name()} stores {content} to {desc}{coord}, expected its rows {want}")
        c["out"] = coord
        self.written[coord] += 1

    def cta(self, gx, gy):
        gl = HostGl((*self.grid, 1), (gx, gy, 0), point=self.run_.point, threads=self.run_, hopper=self.hopper)
        kernel = host(entry.flash_fwd_gluon_ws, gl, _consumer_tile=Around(lambda real: self.consumer_tile(real, (gx, gy))),
                      _visible_range=self.visible_range((gx, gy)), **self.hopper.stubs(), **self.stubs)
        i = HInt
        wg, bn = self.wg_m * D * 2, self.block_n * D * 2
        args = dict(Q=Desc("Q", wg, (self.b, self.hq, self.sq, D)), K=Desc("K", bn), V=Desc("V", bn), Y=Desc("Y", wg),
                    Lse=Inert(), Mask=Inert(), SeqlensK=Ptr(self.bounds), scale=Inert(), softcap=Inert(), Hq=i(self.hq),
                    group=i(self.group), Sq=i(self.sq), Skv=i(self.skv), D=i(D), Dv=i(D), offset=i(self.offset),
                    causal=i(int(self.causal)), window_left=i(-1), window_right=i(-1), mask_len=i(self.mask_len),
                    has_seqlens=i(0 if self.bounds is None else 2), store_lse=i(1),
                    TileCounter=Ptr(self.counter if self.use_ctr else None), Cos=Inert(), Sin=Inert(),
                    rotary_half=i(0), max_position=i(0),
                    **{n: i(0) for n in contract.runtime_args("fwd_gluon") if n.startswith("stride_")})
        kernel(*contract.ordered_args("fwd_gluon", args),
               BLOCK_M=self.block_m, BLOCK_N=self.block_n, BLOCK_D=D, NUM_STAGES=self.stages, PINGPONG=self.pingpong,
               NUM_CONSUMERS=self.nc, CONSUMER_REGS=240, TILES_PER_CTA=self.tiles, MASK_KIND=int(self.prefix),
               OVERLAP_PV=self.overlap, MASK_PREFIX=self.prefix, PERSISTENT_GRID=self.persistent, DYNAMIC_TILES=self.dynamic,
               SKIP_PAST_ROWS=self.skip)

    def play(self):
        ctas = [(gx, gy) for gx in range(self.grid[0]) for gy in range(self.grid[1])]
        self.run_.run([lambda g=g: self.cta(*g) for g in ctas], [f"CTA {gx}.{gy}" for gx, gy in ctas])

    def check(self):
        want = {(bh // self.hq, bh % self.hq, m * self.block_m + w * self.wg_m)
                for bh in range(self.b * self.hq) for m in range(self.n_m) for w in range(self.nc)
                if not (self.skip and w > 0 and m * self.block_m + w * self.wg_m >= self.sq)}
        assert set(self.written) == want, (sorted(set(self.written) ^ want))[:5]
        assert max(self.written.values()) == 1, [k for k, n in self.written.items() if n > 1][:5]
        assert self.counter == [0, 0]


# (NC, NUM_STAGES, Sq, Skv, offset, B, Hq, group, causal, CTAs of a persistent grid, BLOCK_N); WG_M 64
SHAPES = [
    (2, 2, 300, 300, 0, 1, 5, 1, True, 3, 64),     # a last tile whose upper consumer has no rows
    (2, 2, 129, 129, 0, 3, 1, 1, False, 4, 64),    # more CTAs than some need
    (3, 3, 320, 320, 0, 2, 2, 2, True, 2, 64),     # one of three consumers without rows; two heads a KV head
    (3, 3, 200, 200, 0, 1, 3, 1, False, 5, 64),    # two of three without rows in the last tile
    (2, 2, 512, 512, 0, 2, 1, 1, True, 7, 64),
    (2, 3, 300, 700, 400, 1, 2, 2, True, 3, 64),   # Skv > Sq, bottom-right causal
    (3, 2, 400, 400, 0, 1, 2, 1, True, 3, 64),     # three consumers on two slots
    (3, 4, 450, 450, 0, 1, 2, 1, False, 3, 64),    # four slots (d64's masked tile)
    (2, 2, 300, 300, 0, 1, 3, 1, True, 3, 128),    # d128's tile: the first tile one key block
    (2, 2, 200, 60, 0, 2, 2, 1, False, 3, 64),     # every tile one key block: the producer tiles ahead
]
SEEDS = 4


def _play(shape, seeds=SEEDS, **kw):
    nc, stages, sq, skv, offset, b, hq, group, causal, ctas, block_n = shape
    for seed in range(seeds):
        launch = Launch(nc=nc, stages=stages, sq=sq, skv=skv, offset=offset, b=b, hq=hq, group=group,
                        causal=causal, ctas=ctas, wg_m=64, block_n=block_n, seed=seed, **kw)
        try:
            launch.play()
            launch.check()
        except (ProtocolError, AssertionError) as e:
            raise AssertionError(f"seed {seed}: {e}") from e


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "nc{}-st{}-sq{}-skv{}-n{}".format(*s[:4], s[10]))
@pytest.mark.parametrize("skip", [False, True], ids=["", "skip"])
@pytest.mark.parametrize("mode", ["tile", "tile2", "static", "dynamic", "prefix"])
def test_protocol_under_random_schedules(mode, skip, shape):
    """tile: a CTA per query tile (shipped); tile2: TILES_PER_CTA 2; static: PERSISTENT_GRID;
    dynamic: with DYNAMIC_TILES, the CTAs claiming tiles through the counter pair; prefix: a CTA
    per tile under a key-vector mask, MASK_PREFIX (shipped for masks: the visible run the first
    consumer finds handed to the producer, block 0 loaded before it and dropped where the run
    starts later)."""
    _play(shape, mode=mode, skip=skip)


@pytest.mark.parametrize("mode", ["tile", "tile2", "static", "dynamic"])
@pytest.mark.parametrize("pingpong,overlap", [(False, False), (True, True)], ids=["no-pingpong", "overlap-pv"])
def test_protocol_of_the_other_schedules(mode, pingpong, overlap):
    """The constexprs no shipped cubin sets: PINGPONG off, OVERLAP_PV on."""
    for shape in (SHAPES[0], SHAPES[3]):
        _play(shape, seeds=3, mode=mode, skip=True, pingpong=pingpong, overlap=overlap)


def test_dynamic_tiles_without_the_counter():
    """DYNAMIC_TILES with TileCounter 0 (a stream without counters): every CTAs-th tile, handed to
    the consumers as ids."""
    for shape in SHAPES[:4]:
        _play(shape, seeds=3, mode="dynamic", skip=True, counter=False)


def test_masked_keys_end_at_mask_len():
    """Under a key-vector mask the keys from mask_len on are hidden: every partition sees
    min(Skv, mask_len) keys, the range check too."""
    for shape in (SHAPES[1], SHAPES[5], SHAPES[7]):
        _play(shape, seeds=3, mode="prefix", skip=False, mask_len=shape[3] - 70)


@pytest.mark.parametrize("mode", ["tile", "tile2", "static", "dynamic"])
def test_key_bound_per_batch_row(mode):
    """has_seqlens: each batch row's keys end at its own bound (a GroupQueryAttention first prompt
    of rows of several lengths, positions kept): in every schedule the producer and the consumers
    of each tile agree on that row's blocks, and each consumer reads exactly them."""
    for shape in (SHAPES[1], SHAPES[2], SHAPES[4]):
        b, skv = shape[5], shape[3]
        bounds = [skv, 1, skv // 2 + 7][:b]
        _play(shape, seeds=3, mode=mode, skip=True, bounds=bounds)


def _early(who, slot):
    """The producer waiting one phase early on its ring's empty barriers."""
    return 1 if "_producer" in who and slot.smem.name in ("k_empty", "v_empty") else 0


@pytest.mark.parametrize("mode", ["tile", "tile2", "static", "dynamic", "prefix"])
def test_the_checks_catch_a_wrong_phase(mode):
    """The same run fails on a protocol with one parity wrong (the producer not waiting for the
    consumers to free a ring slot), in every schedule: a load over a slot in use, a read of a slot
    whose load is in flight or that holds another block, or a deadlock (the early wait's parity
    missing the phase it means); not only deadlocks."""
    caught = []
    for seed in range(6):
        launch = Launch(mode=mode, b=1, hq=3, group=1, sq=300, skv=300, offset=0, causal=True, nc=2, stages=2,
                        wg_m=64, block_n=64, skip=False, ctas=2, seed=seed, shift=_early)
        with pytest.raises(ProtocolError) as e:
            launch.play()
        caught.append(e.value)
    assert not all(isinstance(e, Deadlock) for e in caught), caught


def _publish_early(real):
    """_publish_tile storing the tile's id before its waits on q_empty (then running as written):
    the id of tile tt over that of tile tt - 2, which a consumer may not have read yet."""
    def publish(ids, q_ready, q_empty, tid, tt, NC, SENTINEL):
        ids.index(tt % 2).store(HInt(0) + tid)
        return real(ids, q_ready, q_empty, tid, tt, NC, SENTINEL)
    return publish


def _read_early(real):
    """_read_tile loading the id before its wait on q_ready (then waiting as written), from the
    consumer's third tile on (before it, a read that comes before the producer's first store finds
    the word empty, which any run catches): the id of tile tt - 2, or the one being stored."""
    def read(ids, q_ready, tt, WG, NC):
        if tt < 2:
            return real(ids, q_ready, tt, WG, NC)
        early = ids.index(tt % 2).load(Inert())
        real(ids, q_ready, tt, WG, NC)
        return early
    return read


# The mutations of the tile-id hand-off, on shapes where the producer runs two tiles ahead of a
# consumer (tiles of one or two key blocks on two to four ring slots: only the Q buffers' barriers
# order the id's store after the consumers' reads of the id it replaces).
HANDOFF_SHAPES = [SHAPES[9], (2, 4, 300, 300, 0, 1, 3, 1, True, 2, 128), (3, 4, 400, 100, 0, 1, 2, 1, False, 2, 64)]
HANDOFF_SEEDS = 5
MUTATIONS = {
    "publish-before-q_empty": dict(stubs=dict(_publish_tile=Around(_publish_early))),
    "read-before-q_ready": dict(stubs=dict(_read_tile=Around(_read_early))),
    "no-thread-barrier": dict(drop_barrier=lambda who: "_producer" in who),
}


@pytest.mark.parametrize("counter", [True, False], ids=["counter", "no-counter"])
def test_the_tile_id_shapes_pass_as_written(counter):
    """The control of the next test: its shapes and seeds, the kernel as written, every check on."""
    for shape in HANDOFF_SHAPES:
        _play(shape, seeds=HANDOFF_SEEDS, mode="dynamic", skip=True, counter=counter)


@pytest.mark.parametrize("counter", [True, False], ids=["counter", "no-counter"])
@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_the_checks_catch_a_tile_id_race(mutation, counter):
    """The dynamic tiles' hand-off of the tile id (_publish_tile, _read_tile), each mutation injected
    through the host run's hooks: the producer storing the next id before its wait on q_empty, a
    consumer loading the id before its wait on q_ready, the producer's store not put behind a
    thread barrier before its arrive. Every seed of every shape fails with Unordered, the order
    check on the word: a race is caught by the order the barriers give, whether or not the
    schedule makes a read see the wrong id (without the check, the Q and K/V blocks read
    downstream catch the first two in some schedules only, the third in none). Only DYNAMIC_TILES
    hands tile ids through shared memory (the static persistent grid and the per-tile grids derive
    each tile in every partition)."""
    for shape in HANDOFF_SHAPES:
        nc, stages, sq, skv, offset, b, hq, group, causal, ctas, block_n = shape
        for seed in range(HANDOFF_SEEDS):
            launch = Launch(mode="dynamic", b=b, hq=hq, group=group, sq=sq, skv=skv, offset=offset, causal=causal,
                            nc=nc, stages=stages, wg_m=64, block_n=block_n, skip=True, ctas=ctas, seed=seed,
                            counter=counter, **MUTATIONS[mutation])
            with pytest.raises(Unordered, match=r"ids\["):
                launch.play()


def test_the_checks_catch_a_visible_range_race():
    """MASK_PREFIX's hand-off word, lim_smem, under the same check: the first consumer's store of
    its visible run not put behind a thread barrier before its arrive on lim_bar is caught at the
    producer's read, in every seed."""
    for seed in range(3):
        launch = Launch(mode="prefix", b=1, hq=3, group=1, sq=300, skv=300, offset=0, causal=True, nc=2, stages=2,
                        wg_m=64, block_n=64, skip=False, seed=seed, drop_barrier=lambda who: "_consumer" in who)
        with pytest.raises(Unordered, match="lim_smem"):
            launch.play()
