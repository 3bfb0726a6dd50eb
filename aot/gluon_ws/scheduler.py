"""The warp-specialized kernel's tile scheduler: which query tiles of which (batch, head) a CTA
runs, in what order, and each tile's key range; the producer and every consumer derive them here,
so they agree on the ring and the turns.

Grids (the launcher's, cpp/launch_plan.cc fwd_grid): per tile, (cdiv(Sq, BLOCK_M * TILES_PER_CTA),
B * Hq), query tiles in reverse so that the longest causal ones start first, a CTA running
TILES_PER_CTA consecutive tiles of one (batch, head), the last first. With PERSISTENT_GRID one row
of at most a CTA per SM, each CTA taking the call's tiles g, g + CTAs, ... of all (batch, head)
pairs in turn: without causal a head's tiles together (their K/V shared in L2), under causal every
head's longest tile first; B * Hq is Q's first two dims (its descriptor's shape). With DYNAMIC_TILES
as well the CTAs claim tiles through an int64 counter pair as they free up (_claim; the launcher
passes the stream's pair in TileCounter, else 0: every CTAs-th tile), in _tile_of's order (heads
in groups whose K/V share L2, each group's longest tiles first); each tile's id reaches the
consumers through shared memory with its Q (_publish_tile, _read_tile; -1 ends), and the last CTA
to make its one claim past the end zeroes the pair for the next launch on the stream.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from ..flash_fwd_gluon import _key_len


@gluon.jit
def _tile_span(tile, Sq, Skv, offset, causal, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Query tile `tile`'s first row and the keys it sees, [0, hi) in n_blocks >= 1 blocks: the
    producer and every consumer derive a tile's block count here, so they agree on the ring."""
    m0 = tile * BLOCK_M
    row_hi = gl.minimum(m0 + BLOCK_M, Sq) - 1
    hi = Skv
    if causal != 0:
        hi = gl.minimum(Skv, row_hi + offset + 1)
    n_blocks = gl.maximum(gl.cdiv(hi, BLOCK_N), 1)
    return m0, hi, n_blocks


@gluon.jit
def _tile_keys(work, b):
    """The keys of batch row b a tile of a several-tile CTA sees: work.Skv, bounded by the row's
    key bound where the call has one (flash_fwd_gluon._key_len)."""
    return _key_len(work.Skv, work.seqlens, work.has_seqlens, b)


@gluon.jit
def _cta_coords(Hq, group):
    """(pid_m, pid_bh, b, h, hk): the CTA's query tile, counted from the grid's end so that the
    longest causal tiles start first, and its (batch x head) row of a per-tile grid (a persistent
    grid's one row walks B * Hq pairs instead: _cta_tiles)."""
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // Hq
    h = pid_bh % Hq
    hk = h // group
    return pid_m, pid_bh, b, h, hk


@gluon.jit
def _cta_tiles(pid_m, Sq, bh_all, BLOCK_M: gl.constexpr, TILES: gl.constexpr, PERSISTENT: gl.constexpr):
    """(g0, n_valid): the CTA's first tile and how many it runs (_cta_tile walks them). A CTA of a
    per-tile grid (x = cdiv(Sq, BLOCK_M * TILES), y = B * Hq) takes tiles g0 .. g0 + n_valid - 1 of
    its (batch, head), those starting below Sq; a CTA of a persistent grid (one row of CTAs) every
    num_programs(0)-th tile of the call's cdiv(Sq, BLOCK_M) * bh_all from its program id."""
    g0 = pid_m * TILES
    n_valid = gl.minimum(gl.cdiv(Sq, BLOCK_M) - g0, TILES)
    if PERSISTENT:
        g0 = gl.program_id(0)
        n_valid = gl.cdiv(gl.cdiv(Sq, BLOCK_M) * bh_all - g0, gl.num_programs(0))
    return g0, n_valid


@gluon.jit
def _heads_of(bh, Hq, group):
    """(b, h, hk) of the (batch x head) index bh."""
    hq_t = bh % Hq
    return bh // Hq, hq_t, hq_t // group


@gluon.jit
def _cta_tile(t, work, BLOCK_M: gl.constexpr, PERSISTENT: gl.constexpr):
    """The CTA's t-th tile: (query tile, b, h, hk, pid_bh), work a params.Work. Without PERSISTENT
    tiles g0 + n_valid - 1 down to g0 of the CTA's (b, h). With PERSISTENT the grid's CTAs take the
    bh_all * cdiv(Sq, BLOCK_M) tiles of the call in turn, tile g0 + t * (CTAs): without causal each
    head's tiles together (a head's K/V in L2 for its tiles at once), under causal every head's
    longest tile first, then the next longest (longest-processing-time order over the CTAs)."""
    if PERSISTENT:
        n_m = gl.cdiv(work.Sq, BLOCK_M)
        tid = work.g0 + t * gl.num_programs(0)
        bh = tid // n_m
        m_t = n_m - 1 - tid % n_m
        if work.causal != 0:  # every head's longest tile first, then the next longest, ...
            bh = tid % work.bh_all
            m_t = n_m - 1 - tid // work.bh_all
        b_t, h_t, hk_t = _heads_of(bh, work.Hq, work.group)
        return m_t, b_t, h_t, hk_t, bh
    else:
        return work.g0 + work.n_valid - 1 - t, work.b, work.h, work.hk, work.pid_bh


@gluon.jit
def _tile_of(tid, n_m, bh_all, grp, Hq, group):
    """Tile `tid` of a DYNAMIC_TILES call: (query tile, b, h, hk, bh). The (batch, head) pairs go
    in groups of `grp` (a group's K/V fit in L2 together), each group's tiles longest first across
    its heads (every head's longest tile, then every head's next, ...): the CTAs running at once
    share a few heads' K/V, and the last tiles handed out are short ones."""
    per = grp * n_m
    g = tid // per
    gsz = gl.minimum(grp, bh_all - g * grp)
    i = tid - g * per
    bh = g * grp + i % gsz
    b_t, h_t, hk_t = _heads_of(bh, Hq, group)
    return n_m - 1 - i // gsz, b_t, h_t, hk_t, bh


@gluon.jit
def _head_group(Skv, BLOCK_D: gl.constexpr):
    """DYNAMIC_TILES: (batch, head) pairs per group of _tile_of, as many as have their K/V in
    about 16 MB of L2 (1 to 8)."""
    return gl.maximum(gl.minimum((4194304 // BLOCK_D) // gl.maximum(Skv, 1), 8), 1)


@gluon.jit
def _claim(ctr, use_ctr, tid):
    """The producer's next tile after `tid`: the grid's CTAs claim tiles num_programs(0),
    num_programs(0) + 1, ... through the counter at ctr[0] (so that a CTA whose tiles were short
    takes more), or without a counter (use_ctr false) take every num_programs(0)-th tile."""
    nxt = tid + gl.num_programs(0)
    if use_ctr:
        nxt = gl.num_programs(0) + gl.atomic_add(ctr, 1, sem="relaxed").to(gl.int32)
    return nxt


@gluon.jit
def _publish_tile(ids, q_ready, q_empty, tid, tt, NC: gl.constexpr, SENTINEL: gl.constexpr):
    """Tile tt's id into its Q buffer's slot of `ids`, once every consumer has freed that buffer
    (its tile tt - 2 stored), before the Q loads that carry it to the consumers: each consumer
    reads it after its wait on q_ready. With SENTINEL (tid is then -1, no tile left) the producer
    arrives on q_ready itself, with no load."""
    qb = tt % 2
    for w in gl.static_range(NC):
        mbarrier.wait(q_empty.index(qb * NC + w), ((tt // 2) & 1) ^ 1)
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    ids.index(qb).store(gl.full([1], 0, gl.int32, layout) + tid)
    gl.thread_barrier()  # every thread's store before the (one-thread) arrives
    if SENTINEL:
        for w in gl.static_range(NC):
            mbarrier.arrive(q_ready.index(qb * NC + w))


@gluon.jit
def _read_tile(ids, q_ready, tt, WG: gl.constexpr, NC: gl.constexpr):
    """The id of the consumer's tile tt (-1: none left), once its Q buffer's barrier has passed."""
    qb = tt % 2
    mbarrier.wait(q_ready.index(qb * NC + WG), (tt // 2) & 1)
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    return gl.max(ids.index(qb).load(layout), axis=0)
