"""The one-partition Gluon kernel's protocol (aot/flash_fwd_gluon.py `attend`), played out on the
CPU by the kernel's own code (tests/_gluon_host.py: Gluon has no interpreter): its K/V ring at the
shipped tiles and with two slots (K and V refilled apart, each once its reader has retired), and
the append of a first prompt's K and V to present (APPEND_KV, the kernel
lab/experiments/gqa_append.py times).

Every CTA of a launch runs on a thread of its own, in a random order, over Hopper's stand-ins
(mbarriers by phase parity, TMA loads that land later, TMA stores that read their slot until a
store_wait retires them, async wgmma). A thread barrier of this kernel (every warp of the CTA past
it) releases the slots whose reads have retired: the ring is refilled by program order, not by
an arrival. The rotary's arithmetic is not followed: its stand-in marks a slot's block as turned.

Checked for right-padded batches (rows with every key, some, one, and none), GQA groups, causal
and not: no deadlock and no aliased phase; no slot reloaded while an MMA or a store still reads
it; each CTA's S and P V products read its key blocks in order, all it sees (K turned where it
is the new tokens, Q turned with the rotary, V never); with the append, present written exactly
once per (batch row, KV head, key block) of a row with keys, rows [0, Sq), from a slot holding
that block, and nothing for a row with none. The checks are themselves tested: with the
store_wait before the ring's refill dropped, a non-causal launch fails.
"""
from __future__ import annotations

import collections
import itertools
import random

import pytest

pytest.importorskip("triton.experimental.gluon", reason="the kernel's source is Gluon")

from _gluon_host import Desc, Hopper, HostGl, Inert, Interleaving, ProtocolError, Ptr, Smem, _slot, host  # noqa: E402

from aot import flash_fwd_gluon as fg  # noqa: E402

D = 64  # the boxes' width: the protocol does not depend on it


class OnePartitionGl(HostGl):
    """HostGl for a kernel without warp_specialize: an allocation of one buffer or barrier (rank 1
    or 4) is that slot itself; a thread barrier releases every slot whose MMA or store has retired."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.allocations: list[Smem] = []

    def allocate_shared_memory(self, _dtype, shape, _layout=None):
        ring = len(shape) in (2, 5)
        smem = Smem(int(shape[0]) if ring else 1, self)
        smem.name = f"smem{len(self.allocations)}"
        self.allocations.append(smem)
        return smem if ring else smem.slots[0]

    def thread_barrier(self):
        hop = self.hopper
        me = hop.run.me()
        busy = {id(s) for g in hop._mma.get(me, ()) for s, _ in g} | {id(s) for s, _ in hop._stores.get(me, ())}
        for smem in self.allocations:
            for slot in smem.slots:
                if me in slot.holders and id(slot) not in busy:
                    del slot.holders[me]


class Launch:
    def __init__(self, *, b, hq, group, sq, totals, causal, tile, rotary=True, seed=0, drop_store_wait=False,
                 append=True):
        self.b, self.hq, self.group, self.sq, self.totals, self.causal = b, hq, group, sq, totals, causal
        self.block_m, self.block_n, self.stages = tile
        self.rotary, self.append = rotary, append
        self.reads = collections.defaultdict(lambda: {"K": [], "V": []})  # CTA -> the rows of each block read
        self.rng = random.Random(seed)
        self.drop_store_wait = drop_store_wait
        self.stores = collections.Counter()
        self.errors: list[str] = []

    def rotate(self, hop):
        def turn(view, *_a, **_kw):
            slot = _slot(view)
            hop._read(slot)  # a register read: the slot's load has landed
            others = [t for t in slot.holders if t != hop.run.me()]
            if others or slot.content[0] not in ("Q", "K"):
                raise ProtocolError(f"{slot!r} turned while it holds {slot.content} (held by {others})")
            slot.content = ("turned", *slot.content)
        return turn

    def on_read(self, thread, _slot_, content):
        if content is None or content[0] == "regs":
            return
        name = content[1] if content[0] == "turned" else content[0]
        turned = content[0] == "turned"
        if name in ("K", "V"):
            self.reads[self.run_.name(thread)][name].append(content[-1])
        # Q turns on load with the rotary; K too where it is the new tokens (without the append K
        # is present's, already turned).
        if (name == "Q" and turned != self.rotary) or (name == "K" and turned != (self.rotary and self.append)):
            self.errors.append(f"an S product read {content}")
        if name == "V" and turned:
            self.errors.append(f"a P V product read {content}")

    def on_store(self, _thread, desc, coords, content):
        if desc not in ("Kout", "Vout"):
            return
        b, hk, row = coords
        want = ("K" if desc == "Kout" else "V", b, hk, row)
        if desc == "Kout" and self.rotary:
            want = ("turned", *want)
        if content != want:
            self.errors.append(f"{desc} {coords} stored from a slot holding {content}, not {want}")
        if row % self.block_n or not 0 <= row < self.sq:
            self.errors.append(f"{desc} {coords}: a row outside [0, Sq) or off a block")
        self.stores[(desc, b, hk, row)] += 1

    def run(self):
        run = self.run_ = Interleaving(self.rng)
        hop = Hopper(run, on_read=self.on_read, on_store=self.on_store)
        stubs = hop.stubs()
        if self.drop_store_wait:  # the mutation: no store ever retires
            stubs["tma"].store_wait = lambda pendings: None
        stubs["_rotate_rows"] = self.rotate(hop)
        stubs["_rope_rows"] = lambda *a, **kw: (Inert(), Inert(), Inert())
        grid = (-(-self.sq // self.block_m), self.b * self.hq)
        nbytes_q, nbytes_kv = self.block_m * D * 2, self.block_n * D * 2
        bounds = Ptr(list(self.totals))
        fns, names = [], []
        for pid_bh in range(grid[1]):
            for pm in range(grid[0]):
                def cta(pid=(pm, pid_bh, 0)):
                    gl = OnePartitionGl(grid=grid + (1,), pid=pid, num_warps=4, threads=run, hopper=hop)
                    fn = host(fg.attend, gl, **stubs)
                    fn(Desc("Q", nbytes_q), Desc("K", nbytes_kv), Desc("V", nbytes_kv), Desc("Y", nbytes_q),
                       Inert(), Inert(), bounds, Inert(), self.hq, self.group, self.sq, self.sq, 0, int(self.causal),
                       1, 0, Inert(), Inert(), D // 2 if self.rotary else 0, 4 * self.sq,
                       Desc("Kout", nbytes_kv) if self.append else None,
                       Desc("Vout", nbytes_kv) if self.append else None,
                       self.block_m, self.block_n, D, self.stages, False, self.append)
                fns.append(cta)
                names.append(f"CTA {pm}.{pid_bh}")
        run.run(fns, names)
        assert not self.errors, self.errors[:5]
        for pid_bh in range(grid[1]):  # each CTA read its key blocks in order, K and V alike
            t = self.totals[pid_bh // self.hq]
            for pm in range(grid[0]):
                last_row = min((grid[0] - 1 - pm + 1) * self.block_m, self.sq)
                hi = min(t, last_row) if self.causal else t
                want = list(range(0, max(-(-hi // self.block_n), 1) * self.block_n, self.block_n))
                got = self.reads[f"CTA {pm}.{pid_bh}"]
                assert got == {"K": want, "V": want}, (pm, pid_bh, got, want)
        hkv = self.hq // self.group
        want = collections.Counter({(d, b, hk, r): 1 for d in ("Kout", "Vout") for b in range(self.b)
                                    if self.totals[b] > 0 and self.append for hk in range(hkv)
                                    for r in range(0, self.sq, self.block_n)})
        assert self.stores == want, (sorted((want - self.stores).elements())[:6],
                                     sorted((self.stores - want).elements())[:6])


# The shipped tiles, and smaller rings (two slots) with more key blocks a query block.
TILES = {"d128": (64, 64, 3), "d64": (128, 64, 4), "two-slots": (64, 32, 2), "two-slots-128": (128, 32, 2)}
CASES = [
    # (batch rows' key counts, Sq, Hq, group, causal)
    ((200, 77, 1, 0), 200, 2, 2, True),
    ((130, 130), 130, 4, 4, True),
    ((64, 5), 64, 2, 1, True),
    ((256, 100, 0), 256, 2, 2, False),
    ((77,), 77, 4, 2, False),
]


@pytest.mark.parametrize("tile", sorted(TILES))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_append_protocol(tile, case):
    totals, sq, hq, group, causal = CASES[case]
    for seed in range(3):
        Launch(b=len(totals), hq=hq, group=group, sq=sq, totals=totals, causal=causal, tile=TILES[tile],
               seed=seed).run()


@pytest.mark.parametrize("tile", sorted(TILES))
def test_kernel_without_append(tile):
    """The shipped kernel's own protocol (APPEND_KV off), on the smaller rings too."""
    for case, seed in itertools.product(range(len(CASES)), range(2)):
        totals, sq, hq, group, causal = CASES[case]
        Launch(b=len(totals), hq=hq, group=group, sq=sq, totals=totals, causal=causal, tile=TILES[tile],
               seed=seed, append=False).run()


def test_append_without_rotary():
    Launch(b=2, hq=2, group=2, sq=150, totals=(150, 60), causal=True, tile=TILES["d64"], rotary=False).run()


def test_the_checks_catch_a_refill_under_a_store():
    with pytest.raises(ProtocolError):
        for seed in range(4):
            Launch(b=1, hq=1, group=1, sq=512, totals=(512,), causal=False, tile=TILES["d128"], seed=seed,
                   drop_store_wait=True).run()
