"""The warp-specialized kernel's producer warp: a tile's Q into one of the Q buffers (one box per
consumer) and its K/V blocks through the NUM_STAGES-deep ring by TMA, each slot refilled once every
consumer has freed it (its `empty` barrier); under a key-vector mask only the blocks of the
tile's visible run (mask_prefix.py); with several tiles per CTA it runs ahead into the next tile.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .mask_prefix import _read_range
from .scheduler import _claim, _cta_tile, _publish_tile, _tile_keys, _tile_of, _tile_span


@gluon.jit
def _producer_q(Q, bufs, b, h, m0, t,
                WG_M: gl.constexpr, NC: gl.constexpr, QB: gl.constexpr):
    """A tile's Q into Q buffer t % QB, one box per consumer."""
    qb = t % QB
    for w in gl.static_range(NC):
        if QB > 1:  # the buffer's last tile has been stored (a fresh barrier passes phase 1)
            mbarrier.wait(bufs.q_empty.index(qb * NC + w), ((t // QB) & 1) ^ 1)
        mbarrier.expect(bufs.q_ready.index(qb * NC + w), Q.block_type.nbytes)
        tma.async_copy_global_to_shared(Q, [b, h, m0 + w * WG_M, 0], bufs.q_ready.index(qb * NC + w),
                                        bufs.q_smem.index(qb * NC + w))


@gluon.jit
def _producer_kv(K, V, bufs, b, hk, j_lo, j_hi, c0, row0,
                 BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    """K/V blocks j_lo .. j_hi - 1 of a tile (keys from row0 + j * BLOCK_N) through the ring (ring
    blocks c0 + j)."""
    for j in range(j_lo, j_hi):
        c = c0 + j
        st = c % NUM_STAGES
        phase = (c // NUM_STAGES) & 1
        # A fresh barrier counts as having completed the phase before 0: the first round passes.
        mbarrier.wait(bufs.k_empty.index(st), phase ^ 1)
        mbarrier.expect(bufs.k_ready.index(st), K.block_type.nbytes)
        tma.async_copy_global_to_shared(K, [b, hk, row0 + j * BLOCK_N, 0], bufs.k_ready.index(st), bufs.k_ring.index(st))
        mbarrier.wait(bufs.v_empty.index(st), phase ^ 1)
        mbarrier.expect(bufs.v_ready.index(st), V.block_type.nbytes)
        tma.async_copy_global_to_shared(V, [b, hk, row0 + j * BLOCK_N, 0], bufs.v_ready.index(st), bufs.v_ring.index(st))


@gluon.jit
def _producer_tile(Q, K, V, bufs, b, h, hk, m0, n_blocks, t, c0, cfg):
    """Loads of one tile: its Q into Q buffer t % QB, then its K/V blocks, ring blocks c0 + j (cfg
    a params.ConsumerConfig; QB the Q buffers its TILES give)."""
    QB: gl.constexpr = 1 if cfg.TILES == 1 else 2
    _producer_q(Q, bufs, b, h, m0, t, cfg.WG_M, cfg.NC, QB)
    _producer_kv(K, V, bufs, b, hk, 0, n_blocks, c0, 0,
                 cfg.BLOCK_N, cfg.NUM_STAGES)


@gluon.jit
def _producer(Q, K, V, bufs, work, cfg):
    """The producer warp: the tiles' Q and K/V blocks, in the scheduler's order, through the ring
    (bufs, work and cfg the structs of gluon_ws/params.py)."""
    BLOCK_M: gl.constexpr = cfg.WG_M * cfg.NC  # a tile's rows: every consumer's
    if cfg.PREFIX:
        # Q and block 0 before the first consumer's range check is in (every tile runs block 0
        # but a left-padded one, whose consumers drop it), then the tile's blocks over its
        # visible run (after block 0, or from ring block 1 where the run starts later), or all
        # of them where it has none.
        _producer_q(Q, bufs, work.b, work.h, work.m0, 0, cfg.WG_M, cfg.NC, 1)
        _producer_kv(K, V, bufs, work.b, work.hk, 0, 1, 0, 0,
                     cfg.BLOCK_N, cfg.NUM_STAGES)
        lo, end = _read_range(work.lim_smem, work.lim_bar)
        n_run = work.n_blocks
        j_lo = 1
        c0 = lo * 0
        if lo >= 0:
            n_run = gl.maximum(gl.cdiv(end - lo, cfg.BLOCK_N), 1)
            if lo > 0:
                j_lo = 0
                c0 = c0 + 1
        _producer_kv(K, V, bufs, work.b, work.hk, j_lo, n_run, c0,
                     gl.maximum(lo, 0), cfg.BLOCK_N, cfg.NUM_STAGES)
    elif cfg.TILES == 1:
        _producer_tile(Q, K, V, bufs,
                       work.b, work.h, work.hk, work.m0, work.n_blocks, 0, 0, cfg)
    elif cfg.DYNAMIC:
        # Tiles as the counter hands them out (_claim, one claim ahead so that its latency hides
        # under a tile's loads), each tile's id to the consumers with its Q (_publish_tile), then
        # -1. Every CTA makes exactly one claim past the last tile; the last CTA to get there
        # zeroes the counter for the next launch on this stream.
        n_m = gl.cdiv(work.Sq, BLOCK_M)
        total = n_m * work.bh_all
        tid = gl.program_id(0)
        nxt = _claim(work.ctr, work.use_ctr, tid)
        c0 = tid * 0
        tt = tid * 0
        while tid < total:
            m_t, b_t, h_t, hk_t, bh_t = _tile_of(tid, n_m, work.bh_all, work.grp, work.Hq, work.group)
            skv_t = _tile_keys(work, b_t)
            m0_t, hi_t, nb_t = _tile_span(m_t, work.Sq, skv_t, work.offset, work.causal, BLOCK_M, cfg.BLOCK_N)
            _publish_tile(work.ids, bufs.q_ready, bufs.q_empty, tid, tt, cfg.NC, False)
            _producer_tile(Q, K, V, bufs,
                           b_t, h_t, hk_t, m0_t, nb_t, tt, c0, cfg)
            c0 += nb_t
            tt += 1
            tid = nxt
            if tid < total:
                nxt = _claim(work.ctr, work.use_ctr, tid)
        _publish_tile(work.ids, bufs.q_ready, bufs.q_empty, -1, tt, cfg.NC, True)
        if work.use_ctr:
            done = gl.atomic_add(work.ctr + 1, 1, sem="acq_rel")
            if done == gl.num_programs(0) - 1:
                gl.atomic_xchg(work.ctr, 0, sem="relaxed")
                gl.atomic_xchg(work.ctr + 1, 0, sem="relaxed")
    else:
        # Runs ahead into the next tile: its Q into the other buffer, its blocks through the ring.
        c0 = work.n_valid * 0
        for t in range(work.n_valid):
            m_t, b_t, h_t, hk_t, bh_t = _cta_tile(t, work, BLOCK_M, cfg.PERSISTENT)
            skv_t = _tile_keys(work, b_t)
            m0_t, hi_t, nb_t = _tile_span(m_t, work.Sq, skv_t, work.offset, work.causal, BLOCK_M, cfg.BLOCK_N)
            _producer_tile(Q, K, V, bufs,
                           b_t, h_t, hk_t, m0_t, nb_t, t, c0, cfg)
            c0 += nb_t
