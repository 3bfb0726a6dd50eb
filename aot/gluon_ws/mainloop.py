"""The warp-specialized kernel's consumers: per tile, S_j = Q K_j^T and P_{j-1} V_{j-1} issued back
to back as async wgmma groups, S_j retired, the softmax of block j run while P V is in flight, P V
retired (with PINGPONG the consumers take turns issuing, round robin over one mbarrier each), then
the epilogue. Ring blocks, Q buffers and turns follow running counts over the CTA's tiles, so
that a CTA running several tiles keeps its barriers' phases. With SKIP_PAST_ROWS a consumer whose
rows of a tile all lie past Sq passes the tile's barriers without its GEMMs (_consumer_pass).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from ..flash_fwd_gluon import (_epilogue, _rope_rows, _rotate_rows, o_layout_of, p_layout_of, row_layout_of,
                               s_layout_of)
from .params import Acc, Call, Tile
from .mask_prefix import _publish_range, _visible_range
from .scheduler import _cta_tile, _read_tile, _tile_keys, _tile_of, _tile_span
from .softmax import _key_mask, _softmax, _softmax_bias, _softmax_lim


@gluon.jit
def _consumer_pass(bufs, n_blocks, t, c0, i0,
                   WG: gl.constexpr, NUM_STAGES: gl.constexpr, PINGPONG: gl.constexpr, NC: gl.constexpr,
                   QB: gl.constexpr):
    """A consumer whose rows of a tile all lie at or past Sq (the last tile of a length that is not
    a multiple of BLOCK_M): no GEMMs, no softmax, no store; only its part in the barriers, in
    _consumer_rows' order (each wait before the arrive it guards, so that it never runs ahead of the
    producer), so that the other consumers have the tensor cores to themselves."""
    q_idx = (t % QB) * NC + WG
    mbarrier.wait(bufs.q_ready.index(q_idx), (t // QB) & 1)
    st0 = c0 % NUM_STAGES
    mbarrier.wait(bufs.k_ready.index(st0), (c0 // NUM_STAGES) & 1)
    mbarrier.arrive(bufs.k_empty.index(st0))
    for j in range(1, n_blocks):
        c = c0 + j
        st = c % NUM_STAGES
        prev = (c - 1) % NUM_STAGES
        mbarrier.wait(bufs.k_ready.index(st), (c // NUM_STAGES) & 1)
        mbarrier.wait(bufs.v_ready.index(prev), ((c - 1) // NUM_STAGES) & 1)
        if PINGPONG:
            mbarrier.wait(bufs.turns.index(WG), ((i0 + j - 1) & 1) ^ (1 if WG == 0 else 0))
            mbarrier.arrive(bufs.turns.index((WG + 1) % NC))
        mbarrier.arrive(bufs.k_empty.index(st))
        mbarrier.arrive(bufs.v_empty.index(prev))
    c_last = c0 + n_blocks - 1
    mbarrier.wait(bufs.v_ready.index(c_last % NUM_STAGES), (c_last // NUM_STAGES) & 1)
    if QB > 1:
        mbarrier.arrive(bufs.v_empty.index(c_last % NUM_STAGES))
        mbarrier.arrive(bufs.q_empty.index(q_idx))


@gluon.jit
def _consumer_tile(Y, Lse, bufs, call, tile, rope, WG: gl.constexpr, cfg, QB: gl.constexpr,
                   MASK_KIND: gl.constexpr):
    """_consumer_rows, or with SKIP, for a consumer (not the first) whose rows all lie past Sq,
    _consumer_pass (call a Call, tile a Tile, cfg a ConsumerConfig)."""
    if cfg.SKIP & (WG > 0):
        if tile.m0 + WG * cfg.WG_M >= call.Sq:
            _consumer_pass(bufs, tile.n_blocks, tile.t, tile.c0, tile.i0,
                           WG, cfg.NUM_STAGES, cfg.PINGPONG, cfg.NC, QB)
        else:
            _consumer_rows(Y, Lse, bufs, call, tile, rope, WG, cfg, QB, MASK_KIND)
    else:
        _consumer_rows(Y, Lse, bufs, call, tile, rope, WG, cfg, QB, MASK_KIND)


@gluon.jit
def _consumer_rows(Y, Lse, bufs, call, tile, rope, WG: gl.constexpr, cfg, QB: gl.constexpr,
                   MASK_KIND: gl.constexpr):
    """One consumer's rows of one tile: Q from buffer t % QB, ring blocks c0 + j, turns i0 + j - 1;
    with MASK_KIND the key-vector mask at m_base (Skv is then min(Skv, mask_len)); with rope.half
    the Q rows turned by their rotary first. call a Call, tile a Tile, rope a Rope, cfg a
    ConsumerConfig."""
    NW: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = bufs.q_smem.dtype
    s_layout: gl.constexpr = s_layout_of(NW, cfg.BLOCK_N)
    o_layout: gl.constexpr = o_layout_of(NW, cfg.BLOCK_D)
    p_layout: gl.constexpr = p_layout_of(o_layout)
    row_layout: gl.constexpr = row_layout_of(s_layout)

    r0 = tile.m0 + WG * cfg.WG_M
    rows = r0 + gl.arange(0, cfg.WG_M, layout=row_layout)
    pos = rows + call.offset
    mask_from = call.Skv
    if call.causal != 0:
        mask_from = gl.minimum(call.Skv, r0 + call.offset + 1)
    else:
        pos = rows * 0 + call.Skv
    q_idx = (tile.t % QB) * cfg.NC + WG
    q_slot = bufs.q_smem.index(q_idx)
    q = q_slot.reshape([cfg.WG_M, cfg.BLOCK_D])
    s_zero = gl.zeros([cfg.WG_M, cfg.BLOCK_N], gl.float32, s_layout)

    if rope.half != 0:  # the slot is this consumer's alone until its epilogue frees it
        cos, sin, turn = _rope_rows(rope.Cos, rope.Sin, r0, call.Sq, rope.half, rope.max_position, cfg.WG_M,
                                    cfg.BLOCK_D)
        mbarrier.wait(bufs.q_ready.index(q_idx), (tile.t // QB) & 1)
        _rotate_rows(q, cos, sin, turn, cfg.BLOCK_D)
    else:
        mbarrier.wait(bufs.q_ready.index(q_idx), (tile.t // QB) & 1)
    st0 = tile.c0 % cfg.NUM_STAGES
    mbarrier.wait(bufs.k_ready.index(st0), (tile.c0 // cfg.NUM_STAGES) & 1)
    k0 = bufs.k_ring.index(st0).reshape([cfg.BLOCK_N, cfg.BLOCK_D]).permute((1, 0))
    s = warpgroup_mma(q, k0, s_zero, use_acc=False, is_async=True)
    if MASK_KIND != 0:
        mv = _key_mask(call.m_base, 0, tile.hi, s_layout, cfg.BLOCK_N)
        mv_next = _key_mask(call.m_base, cfg.BLOCK_N, tile.hi, s_layout, cfg.BLOCK_N)
    s = warpgroup_mma_wait(0, deps=[s])
    mbarrier.arrive(bufs.k_empty.index(st0))
    m_i = gl.full([cfg.WG_M], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([cfg.WG_M], gl.float32, row_layout)
    if MASK_KIND != 0:
        lim = gl.minimum(pos, tile.hi - 1)
        p, alpha, m_i, l_i = _softmax_bias(s, mv, m_i, l_i, 0, mask_from, lim, call.qk_scale,
                                           s_layout, cfg.BLOCK_N, MASK_KIND)
    elif QB > 1:
        lim = gl.minimum(pos, tile.hi - 1)
        p, alpha, m_i, l_i = _softmax_lim(s, m_i, l_i, 0, mask_from, lim, call.qk_scale, s_layout, cfg.BLOCK_N)
    else:
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, 0, mask_from, tile.hi, pos, call.qk_scale, s_layout, cfg.BLOCK_N)
    p = gl.convert_layout(p.to(dtype), p_layout)

    acc = gl.zeros([cfg.WG_M, cfg.BLOCK_D], gl.float32, o_layout)
    for j in range(1, tile.n_blocks):
        c = tile.c0 + j
        st = c % cfg.NUM_STAGES
        prev = (c - 1) % cfg.NUM_STAGES
        mbarrier.wait(bufs.k_ready.index(st), (c // cfg.NUM_STAGES) & 1)
        mbarrier.wait(bufs.v_ready.index(prev), ((c - 1) // cfg.NUM_STAGES) & 1)
        if cfg.PINGPONG:
            # Round robin over the running turn count i: turn i of consumer 0 follows the last
            # consumer's turn i - 1, turn i of consumer c > 0 follows consumer c - 1's turn i (a
            # fresh barrier reads as having completed the phase before 0, so consumer 0 starts).
            mbarrier.wait(bufs.turns.index(WG), ((tile.i0 + j - 1) & 1) ^ (1 if WG == 0 else 0))
        k_j = bufs.k_ring.index(st).reshape([cfg.BLOCK_N, cfg.BLOCK_D]).permute((1, 0))
        s_tok = warpgroup_mma(q, k_j, s_zero, use_acc=False, is_async=True)
        v_prev = bufs.v_ring.index(prev).reshape([cfg.BLOCK_N, cfg.BLOCK_D])
        acc_tok = warpgroup_mma(p, v_prev, acc, is_async=True)
        if cfg.PINGPONG:
            mbarrier.arrive(bufs.turns.index((WG + 1) % cfg.NC))
        if MASK_KIND != 0:  # this block's values came an iteration ago; the next block's now
            mv = mv_next
            mv_next = _key_mask(call.m_base, (j + 1) * cfg.BLOCK_N, tile.hi, s_layout, cfg.BLOCK_N)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        mbarrier.arrive(bufs.k_empty.index(st))
        if MASK_KIND != 0:
            p, alpha, m_i, l_i = _softmax_bias(s, mv, m_i, l_i, j * cfg.BLOCK_N, mask_from, lim, call.qk_scale,
                                               s_layout, cfg.BLOCK_N, MASK_KIND)
        elif QB > 1:
            p, alpha, m_i, l_i = _softmax_lim(s, m_i, l_i, j * cfg.BLOCK_N, mask_from, lim, call.qk_scale,
                                              s_layout, cfg.BLOCK_N)
        else:
            p, alpha, m_i, l_i = _softmax(s, m_i, l_i, j * cfg.BLOCK_N, mask_from, tile.hi, pos, call.qk_scale,
                                          s_layout, cfg.BLOCK_N)
        if cfg.OVERLAP:
            if call.Sq > 0:
                # Always true, but opaque to ptxas, which otherwise hoists this wait above the
                # exponentials, so that the softmax runs after this consumer's P V, not under it
                # (perf-notes v6). The other branch differs so that LLVM cannot merge the two.
                acc, p = warpgroup_mma_wait(0, deps=[acc_tok, p])
                mbarrier.arrive(bufs.v_empty.index(prev))
                p16 = gl.convert_layout(p.to(dtype), p_layout)
                acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            else:
                acc = warpgroup_mma_wait(0, deps=[acc_tok])
                mbarrier.arrive(bufs.v_empty.index(prev))
                p16 = gl.zeros([cfg.WG_M, cfg.BLOCK_N], dtype, p_layout)
            p = p16
        else:
            acc, p = warpgroup_mma_wait(0, deps=[acc_tok, p])
            mbarrier.arrive(bufs.v_empty.index(prev))
            p = gl.convert_layout(p.to(dtype), p_layout)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]

    c_last = tile.c0 + tile.n_blocks - 1
    last = c_last % cfg.NUM_STAGES
    mbarrier.wait(bufs.v_ready.index(last), (c_last // cfg.NUM_STAGES) & 1)
    v_last = bufs.v_ring.index(last).reshape([cfg.BLOCK_N, cfg.BLOCK_D])
    acc = warpgroup_mma(p, v_last, acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[acc])
    if QB > 1:  # the next tile's blocks come through this slot
        mbarrier.arrive(bufs.v_empty.index(last))

    _epilogue(Y, Lse, bufs.q_empty, call, tile, q_slot, q_idx, Acc(acc, m_i, l_i), r0, rows, o_layout, QB)


@gluon.jit
def _consumer(Y, Lse, bufs, work, rope, WG: gl.constexpr, cfg):
    """Consumer warpgroup WG: its rows of the tiles the scheduler gives the CTA, over each tile's
    keys (under a key-vector mask, over its visible run where it has one); bufs, work and cfg the
    structs of gluon_ws/params.py."""
    call = Call(work.Sq, work.Skv, work.offset, work.causal, work.qk_scale, work.store_lse, work.m_base)
    BLOCK_M: gl.constexpr = cfg.WG_M * cfg.NC  # a tile's rows: every consumer's
    if cfg.PREFIX:
        # Every consumer checks the keys its tile sees ([0, hi)) itself; the first one tells the
        # producer. A visible run [lo, end) runs unmasked over end - lo keys from lo (where lo > 0
        # from ring block 1: block 0, loaded before the check, is dropped); any other mask (holes,
        # other values, a wholly padded row, left padding under causal) runs the masked loop.
        lo, end = _visible_range(work.m_base, work.hi, work.causal, cfg.MASK_KIND, gl.num_warps())
        if WG == 0:
            _publish_range(work.lim_smem, work.lim_bar, lo, end, gl.num_warps())
        if lo >= 0:
            c0 = lo * 0
            if lo > 0:
                mbarrier.wait(bufs.k_ready.index(0), 0)
                mbarrier.wait(bufs.v_ready.index(0), 0)
                mbarrier.arrive(bufs.k_empty.index(0))
                mbarrier.arrive(bufs.v_empty.index(0))
                c0 = c0 + 1
            n_run = end - lo
            _consumer_tile(Y, Lse, bufs,
                           Call(work.Sq, n_run, work.offset, work.causal, work.qk_scale, work.store_lse, work.m_base),
                           Tile(work.b, work.h, work.pid_bh, work.m0, gl.maximum(gl.cdiv(n_run, cfg.BLOCK_N), 1),
                                n_run, 0, c0, 0),
                           rope, WG, cfg, 1, 0)
        else:
            _consumer_tile(Y, Lse, bufs, call,
                           Tile(work.b, work.h, work.pid_bh, work.m0, work.n_blocks, work.hi, 0, 0, 0),
                           rope, WG, cfg, 1, cfg.MASK_KIND)
    elif cfg.TILES == 1:
        _consumer_tile(Y, Lse, bufs, call,
                       Tile(work.b, work.h, work.pid_bh, work.m0, work.n_blocks, work.hi, 0, 0, 0),
                       rope, WG, cfg, 1, cfg.MASK_KIND)
    elif cfg.DYNAMIC:
        # The producer's tiles in its order, each id read once its Q buffer is in; -1 ends.
        n_m = gl.cdiv(work.Sq, BLOCK_M)
        c0 = work.Sq * 0
        tt = work.Sq * 0
        tid = _read_tile(work.ids, bufs.q_ready, tt, WG, cfg.NC)
        while tid >= 0:
            m_t, b_t, h_t, hk_t, bh_t = _tile_of(tid, n_m, work.bh_all, work.grp, work.Hq, 1)
            skv_t = _tile_keys(work, b_t)
            m0_t, hi_t, nb_t = _tile_span(m_t, work.Sq, skv_t, work.offset, work.causal, BLOCK_M, cfg.BLOCK_N)
            tile_call = Call(work.Sq, skv_t, work.offset, work.causal, work.qk_scale, work.store_lse, work.m_base)
            _consumer_tile(Y, Lse, bufs, tile_call, Tile(b_t, h_t, bh_t, m0_t, nb_t, hi_t, tt, c0, c0 - tt),
                           rope, WG, cfg, 2, cfg.MASK_KIND)
            c0 += nb_t
            tt += 1
            tid = _read_tile(work.ids, bufs.q_ready, tt, WG, cfg.NC)
    else:
        # Running counts over the CTA's tiles: ring blocks consumed and turns taken.
        # (A tile of n blocks takes n - 1 turns, so t tiles in, c0 - t turns have been taken.)
        c0 = work.n_valid * 0
        for t in range(work.n_valid):
            m_t, b_t, h_t, hk_t, bh_t = _cta_tile(t, work, BLOCK_M, cfg.PERSISTENT)
            skv_t = _tile_keys(work, b_t)
            m0_t, hi_t, nb_t = _tile_span(m_t, work.Sq, skv_t, work.offset, work.causal, BLOCK_M, cfg.BLOCK_N)
            tile_call = Call(work.Sq, skv_t, work.offset, work.causal, work.qk_scale, work.store_lse, work.m_base)
            _consumer_tile(Y, Lse, bufs, tile_call, Tile(b_t, h_t, bh_t, m0_t, nb_t, hi_t, t, c0, c0 - t),
                           rope, WG, cfg, 2, cfg.MASK_KIND)
            c0 += nb_t
