"""The warp-specialized Hopper (sm_90) FlashAttention forward kernel in Gluon: FlashAttention-3's
CTA layout (a TMA producer warp, two consumer warpgroups sharing one K/V ring) in our own code.

Same parameters and op contract as flash_fwd and flash_fwd_gluon (cpp/flash_params.h): query row i
sits at absolute position i + offset and, under causal, sees keys j <= i + offset (bottom-right);
a row that sees no key gives 0 and lse -inf. It takes fp16/bf16, D == Dv in {64, 128}, no extras
(those arguments are ignored), and no mask or, with MASK_KIND 1 (bool) or 2 (additive), a key-vector
mask (one row of mask_len values per (batch, head) through stride_mb and stride_mh, its query
stride 0: the (B, 1, 1, S) padding mask of BERT-style models; keys from mask_len on are hidden).
The mask enters as one log2-unit bias per key (_softmax_bias), its values loaded a key block ahead.
With MASK_PREFIX (every masked cubin the build makes) each consumer first reads the mask over the
keys its tile sees (_visible_range): where they show one visible run [lo, end) and hide the rest
(right padding, a batch with no padding, or, without causal, left padding), the tile runs the
unmasked loop over those end - lo keys from lo (no mask loads, no padded blocks); any other mask
runs the masked loop. The first consumer passes the run to the producer through shared memory
and an mbarrier; the producer loads Q and key block 0 before it waits for it (a run from lo > 0
starts at ring block 1 and the consumers drop block 0). An additive value counts as hidden at or
below HIDDEN_AT (-1e4, the rewriter's masked value): the result then differs from the masked
loop's only where a hidden key outscores every visible one by more than ~9900 in scaled scores.

One CTA owns BLOCK_M query rows of one (batch, head): NUM_CONSUMERS (2 or 3) consumer warpgroups
of BLOCK_M / NUM_CONSUMERS rows each (the default partition and the first workers), and a one-warp
producer (the last worker, few registers) that loads Q once and streams K_j, V_j through
NUM_STAGES-deep rings. Each slot has a `ready` barrier (TMA bytes landed) and an `empty` barrier
that every consumer arrives on once its wgmma has read it; no CTA-wide barrier in the loop. A consumer issues S_j = Q K_j^T and P_{j-1} V_{j-1} back to
back as async wgmma groups, retires S_j, runs the softmax of block j while P V is in flight, then
retires P V. With PINGPONG the consumers take turns issuing their GEMMs (one mbarrier each,
round robin), so one's softmax runs under another's tensor-core work (FA3's inter-warpgroup
schedule).

Q and Y are TMA descriptors with a (1, 1, BLOCK_M / NUM_CONSUMERS, D) box, K and V (1, 1, BLOCK_N, D); grid
(cdiv(Sq, BLOCK_M * TILES_PER_CTA), B * Hq), query blocks in reverse so the longest causal blocks
start first.

With TILES_PER_CTA > 1 a CTA takes that many consecutive BLOCK_M tiles of one (batch, head), the
last first (tiles starting at or past Sq are skipped by every partition alike), so that a short
sequence's prologue and epilogue overlap the neighbouring tile's work: Q is double-buffered
(ready/empty barriers per consumer and buffer; a consumer frees its slot once the TMA store of
its output from that slot has read it), the producer streams the next tile's Q and K/V while the
consumers finish the current one, and the ring phases and turns follow running counts over the
CTA's tiles. TILES_PER_CTA = 1 compiles to the same code as before it existed.

With PERSISTENT_GRID (non-causal unmasked cubins, get_ws_config) the grid is one row of at most a
CTA per SM, and each CTA takes the call's tiles g, g + CTAs, ... of all (batch, head) pairs in turn
(_cta_tile: a head's tiles next to each other, so that the CTAs running at once share its K/V in
L2), with the two-tile machinery above (two Q buffers, running ring and turn counts); B * Hq
arrives in window_right. A tile's loads then run under the last tile's work across heads too, and
no CTA launches, sets up its barriers or waits for its first loads per tile.

With DYNAMIC_TILES as well (causal calls, variants.GLUON_WS_DYNAMIC) the producer hands out the
tiles: the CTAs claim them through an int64 counter as they free up (_claim; the launcher passes
the stream's counter pair in SeqlensK and has_seqlens 1, else the tiles go round robin in the same
order), in _tile_of's order (heads in groups whose K/V share L2, each group's longest tiles first),
and each tile's id reaches the consumers through shared memory with its Q (_publish_tile,
_read_tile; -1 ends). The last CTA to make its one claim past the end zeroes the counter for the
next launch on the stream. With SKIP_PAST_ROWS a consumer whose rows of a tile all lie past Sq
passes the tile's barriers without its GEMMs (_consumer_pass).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from .flash_fwd_gluon import LN2, LOG2E, _softmax, desc_layout, desc_signature  # noqa: F401

from .tiles import WS_CONSUMER_WARPS, WS_PRODUCER_REGS

CONSUMER_WARPS = gl.constexpr(WS_CONSUMER_WARPS)  # the default partition: one consumer warpgroup
PRODUCER_REGS = gl.constexpr(WS_PRODUCER_REGS)


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
def _softmax_lim(s, m_i, l_i, start_n, mask_from, lim, qk_scale,
                 s_layout: gl.constexpr, BLOCK_N: gl.constexpr):
    """_softmax with the two masks folded into one bound per row (key j kept iff j <= lim =
    min(pos, hi - 1)): one compare an element, fewer registers where the loop over tiles adds its own."""
    if start_n + BLOCK_N > mask_from:
        cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where(cols[None, :] <= lim[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp2 gives 0
    p = gl.exp2(s * qk_scale - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _key_mask(m_base, start_n, hi, s_layout: gl.constexpr, BLOCK_N: gl.constexpr):
    """The raw mask values of keys [start_n, start_n + BLOCK_N), laid out as S's columns (0 past
    hi: those keys are hidden by the softmax's bound). Loaded a block ahead of their use, so that
    the load's latency hides under a whole iteration rather than under one wgmma."""
    cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    return gl.load(m_base + cols, mask=cols < hi, other=0)


# An additive mask value at or below this hides a key in the visible-range check (the rewriter's
# MIN_MASKED: exp of it underflows to 0 in fp32 unless a hidden key outscores every visible one by
# more than 9900 in the scaled scores).
HIDDEN_AT = gl.constexpr(-1.0e4)


@gluon.jit
def _visible_range(m_base, n, causal, MASK_KIND: gl.constexpr, NW: gl.constexpr):
    """(lo, end) if the mask's keys [0, n) show exactly one run [lo, end), end > lo, and hide the
    rest (bool: nonzero shown, zero hidden; additive: exactly 0 shown, at or below HIDDEN_AT
    hidden), lo 0 under causal; else (-1, -1). The keys a tile sees then run as an unmasked call
    over that run: the padding mask of right- (and, without causal, left-) padded batches costs no
    mask load and its padded blocks no work. Every row of the tile sees a shown key (non-causal:
    all of the run; causal: key 0), so dropping the hidden ones changes no result beyond their
    underflowed weights. Read in chunks of 16 values a thread."""
    CHUNK: gl.constexpr = 16 * 32 * NW
    layout: gl.constexpr = gl.BlockedLayout([16], [32], [NW], [0])
    first_shown = n
    last_shown = n * 0 - 1
    n_shown = n * 0
    first_not_hidden = n
    last_not_hidden = n * 0 - 1
    for start in range(0, n, CHUNK):
        cols = start + gl.arange(0, CHUNK, layout=layout)
        inb = cols < n
        v = gl.load(m_base + cols, mask=inb, other=0)
        if MASK_KIND == 2:
            vf = v.to(gl.float32)
            shown = inb & (vf == 0.0)
            not_hidden = inb & (vf > HIDDEN_AT)
        else:
            shown = inb & (v != 0)
            not_hidden = shown
        first_shown = gl.minimum(first_shown, gl.min(gl.where(shown, cols, n), axis=0))
        last_shown = gl.maximum(last_shown, gl.max(gl.where(shown, cols, -1), axis=0))
        n_shown += gl.sum(shown.to(gl.int32), axis=0)
        first_not_hidden = gl.minimum(first_not_hidden, gl.min(gl.where(not_hidden, cols, n), axis=0))
        last_not_hidden = gl.maximum(last_not_hidden, gl.max(gl.where(not_hidden, cols, -1), axis=0))
    ok = ((n_shown > 0) & (n_shown == last_shown + 1 - first_shown)
          & (first_not_hidden == first_shown) & (last_not_hidden == last_shown)
          & ((causal == 0) | (first_shown == 0)))
    return gl.where(ok, first_shown, -1), gl.where(ok, last_shown + 1, -1)


@gluon.jit
def _publish_range(lim_smem, lim_bar, lo, end, NW: gl.constexpr):
    """The first consumer's visible-range result, for the producer (which does not scan)."""
    layout: gl.constexpr = gl.BlockedLayout([2], [32], [NW], [0])
    idx = gl.arange(0, 2, layout=layout)
    lim_smem.store(gl.where(idx == 0, lo, end))
    gl.thread_barrier()  # every thread's store before the (one-thread) arrive: racecheck-clean
    mbarrier.arrive(lim_bar.index(0))


@gluon.jit
def _softmax_bias(s, mv, m_i, l_i, start_n, mask_from, lim, qk_scale,
                  s_layout: gl.constexpr, BLOCK_N: gl.constexpr, MASK_KIND: gl.constexpr):
    """_softmax_lim under a key-vector mask: the mask as one log2-unit bias per key (bool 0 /
    -inf; additive mask * log2(e), clamped at -1e38 so that a dtype's lowest does not overflow to
    -inf), added to the scaled scores, which are rounded before the running max is subtracted:
    a row whose every key sits at the same huge bias then gets exactly equal weights, as in the
    reference (an fma of the unrounded product would leave rounding noise of the bias's size)."""
    if MASK_KIND == 2:
        mf = mv.to(gl.float32)
        bias = gl.where(mf == float("-inf"), float("-inf"), gl.maximum(mf, -1.0e38) * LOG2E)
    else:
        bias = gl.where(mv != 0, 0.0, float("-inf"))
    s = s * qk_scale + bias[None, :]
    if start_n + BLOCK_N > mask_from:
        cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where(cols[None, :] <= lim[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _producer_q(Q, q_smem, q_ready, q_empty, b, h, m0, t,
                WG_M: gl.constexpr, NC: gl.constexpr, QB: gl.constexpr):
    """A tile's Q into Q buffer t % QB, one box per consumer."""
    qb = t % QB
    for w in gl.static_range(NC):
        if QB > 1:  # the buffer's last tile has been stored (a fresh barrier passes phase 1)
            mbarrier.wait(q_empty.index(qb * NC + w), ((t // QB) & 1) ^ 1)
        mbarrier.expect(q_ready.index(qb * NC + w), Q.block_type.nbytes)
        tma.async_copy_global_to_shared(Q, [b, h, m0 + w * WG_M, 0], q_ready.index(qb * NC + w),
                                        q_smem.index(qb * NC + w))


@gluon.jit
def _producer_kv(K, V, k_ring, v_ring, k_ready, v_ready, k_empty, v_empty, b, hk, j_lo, j_hi, c0, row0,
                 BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    """K/V blocks j_lo .. j_hi - 1 of a tile (keys from row0 + j * BLOCK_N) through the ring (ring
    blocks c0 + j)."""
    for j in range(j_lo, j_hi):
        c = c0 + j
        st = c % NUM_STAGES
        phase = (c // NUM_STAGES) & 1
        # A fresh barrier counts as having completed the phase before 0: the first round passes.
        mbarrier.wait(k_empty.index(st), phase ^ 1)
        mbarrier.expect(k_ready.index(st), K.block_type.nbytes)
        tma.async_copy_global_to_shared(K, [b, hk, row0 + j * BLOCK_N, 0], k_ready.index(st), k_ring.index(st))
        mbarrier.wait(v_empty.index(st), phase ^ 1)
        mbarrier.expect(v_ready.index(st), V.block_type.nbytes)
        tma.async_copy_global_to_shared(V, [b, hk, row0 + j * BLOCK_N, 0], v_ready.index(st), v_ring.index(st))


@gluon.jit
def _producer_tile(Q, K, V, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                   b, h, hk, m0, n_blocks, t, c0,
                   WG_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, NC: gl.constexpr,
                   QB: gl.constexpr):
    """Loads of one tile: its Q into Q buffer t % QB, then its K/V blocks, ring blocks c0 + j."""
    _producer_q(Q, q_smem, q_ready, q_empty, b, h, m0, t, WG_M, NC, QB)
    _producer_kv(K, V, k_ring, v_ring, k_ready, v_ready, k_empty, v_empty, b, hk, 0, n_blocks, c0, 0,
                 BLOCK_N, NUM_STAGES)


@gluon.jit
def _heads_of(bh, Hq, group):
    """(b, h, hk) of the (batch x head) index bh."""
    hq_t = bh % Hq
    return bh // Hq, hq_t, hq_t // group


@gluon.jit
def _cta_tile(t, g0, n_valid, Sq, causal, bh_all, Hq, group, b, h, hk, pid_bh, BLOCK_M: gl.constexpr,
              PERSISTENT: gl.constexpr):
    """The CTA's t-th tile: (query tile, b, h, hk, pid_bh). Without PERSISTENT tiles g0 + n_valid - 1
    down to g0 of the CTA's (b, h). With PERSISTENT the grid's CTAs take the bh_all * cdiv(Sq,
    BLOCK_M) tiles of the call in turn, tile g0 + t * (CTAs): without causal each head's tiles
    together (a head's K/V in L2 for its tiles at once), under causal every head's longest tile
    first, then the next longest (longest-processing-time order over the CTAs)."""
    if PERSISTENT:
        n_m = gl.cdiv(Sq, BLOCK_M)
        tid = g0 + t * gl.num_programs(0)
        bh = tid // n_m
        m_t = n_m - 1 - tid % n_m
        if causal != 0:  # every head's longest tile first, then the next longest, ...
            bh = tid % bh_all
            m_t = n_m - 1 - tid // bh_all
        b_t, h_t, hk_t = _heads_of(bh, Hq, group)
        return m_t, b_t, h_t, hk_t, bh
    else:
        return g0 + n_valid - 1 - t, b, h, hk, pid_bh


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
def _claim(ctr, use_ctr, tid):
    """The producer's next tile after `tid`: the grid's CTAs claim tiles num_programs(0),
    num_programs(0) + 1, ... through the counter at ctr[0] (so that a CTA whose tiles were short
    takes more), or without a counter (use_ctr 0) take every num_programs(0)-th tile."""
    nxt = tid + gl.num_programs(0)
    if use_ctr != 0:
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


@gluon.jit
def _producer(Q, K, V, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
              b, h, hk, m0, n_blocks, g0, n_valid, bh_all, Hq, group, Sq, Skv, offset, causal, lim_smem, lim_bar,
              ids, ctr, use_ctr, grp,
              WG_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, NC: gl.constexpr,
              TILES: gl.constexpr, PREFIX: gl.constexpr, PERSISTENT: gl.constexpr, DYNAMIC: gl.constexpr):
    if PREFIX:
        # Q and block 0 before the first consumer's range check is in (every tile runs block 0
        # but a left-padded one, whose consumers drop it), then the tile's blocks over its
        # visible run (after block 0, or from ring block 1 where the run starts later), or all
        # of them where it has none.
        _producer_q(Q, q_smem, q_ready, q_empty, b, h, m0, 0, WG_M, NC, 1)
        _producer_kv(K, V, k_ring, v_ring, k_ready, v_ready, k_empty, v_empty, b, hk, 0, 1, 0, 0,
                     BLOCK_N, NUM_STAGES)
        mbarrier.wait(lim_bar.index(0), 0)
        idx = gl.arange(0, 2, layout=gl.BlockedLayout([2], [32], [1], [0]))
        rng = lim_smem.load(gl.BlockedLayout([2], [32], [1], [0]))
        lo = gl.sum(gl.where(idx == 0, rng, 0), axis=0)
        end = gl.sum(gl.where(idx == 1, rng, 0), axis=0)
        n_run = n_blocks
        j_lo = 1
        c0 = lo * 0
        if lo >= 0:
            n_run = gl.maximum(gl.cdiv(end - lo, BLOCK_N), 1)
            if lo > 0:
                j_lo = 0
                c0 = c0 + 1
        _producer_kv(K, V, k_ring, v_ring, k_ready, v_ready, k_empty, v_empty, b, hk, j_lo, n_run, c0,
                     gl.maximum(lo, 0), BLOCK_N, NUM_STAGES)
    elif TILES == 1:
        _producer_tile(Q, K, V, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                       b, h, hk, m0, n_blocks, 0, 0, WG_M, BLOCK_N, NUM_STAGES, NC, 1)
    elif DYNAMIC:
        # Tiles as the counter hands them out (_claim, one claim ahead so that its latency hides
        # under a tile's loads), each tile's id to the consumers with its Q (_publish_tile), then
        # -1. Every CTA makes exactly one claim past the last tile; the last CTA to get there
        # zeroes the counter for the next launch on this stream.
        n_m = gl.cdiv(Sq, WG_M * NC)
        total = n_m * bh_all
        tid = gl.program_id(0)
        nxt = _claim(ctr, use_ctr, tid)
        c0 = tid * 0
        tt = tid * 0
        while tid < total:
            m_t, b_t, h_t, hk_t, bh_t = _tile_of(tid, n_m, bh_all, grp, Hq, group)
            m0_t, hi_t, nb_t = _tile_span(m_t, Sq, Skv, offset, causal, WG_M * NC, BLOCK_N)
            _publish_tile(ids, q_ready, q_empty, tid, tt, NC, False)
            _producer_tile(Q, K, V, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                           b_t, h_t, hk_t, m0_t, nb_t, tt, c0, WG_M, BLOCK_N, NUM_STAGES, NC, 2)
            c0 += nb_t
            tt += 1
            tid = nxt
            if tid < total:
                nxt = _claim(ctr, use_ctr, tid)
        _publish_tile(ids, q_ready, q_empty, -1, tt, NC, True)
        if use_ctr != 0:
            done = gl.atomic_add(ctr + 1, 1, sem="acq_rel")
            if done == gl.num_programs(0) - 1:
                gl.atomic_xchg(ctr, 0, sem="relaxed")
                gl.atomic_xchg(ctr + 1, 0, sem="relaxed")
    else:
        # Runs ahead into the next tile: its Q into the other buffer, its blocks through the ring.
        c0 = n_valid * 0
        for t in range(n_valid):
            m_t, b_t, h_t, hk_t, bh_t = _cta_tile(t, g0, n_valid, Sq, causal, bh_all, Hq, group, b, h, hk, 0, WG_M * NC,
                                                  PERSISTENT)
            m0_t, hi_t, nb_t = _tile_span(m_t, Sq, Skv, offset, causal, WG_M * NC, BLOCK_N)
            _producer_tile(Q, K, V, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                           b_t, h_t, hk_t, m0_t, nb_t, t, c0, WG_M, BLOCK_N, NUM_STAGES, NC, 2)
            c0 += nb_t


@gluon.jit
def _consumer_pass(q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns, n_blocks, t, c0, i0,
                   WG: gl.constexpr, NUM_STAGES: gl.constexpr, PINGPONG: gl.constexpr, NC: gl.constexpr,
                   QB: gl.constexpr):
    """A consumer whose rows of a tile all lie at or past Sq (the last tile of a length that is not
    a multiple of BLOCK_M): no GEMMs, no softmax, no store; only its part in the barriers, in
    _consumer_rows' order (each wait before the arrive it guards, so that it never runs ahead of the
    producer), so that the other consumers have the tensor cores to themselves."""
    q_idx = (t % QB) * NC + WG
    mbarrier.wait(q_ready.index(q_idx), (t // QB) & 1)
    st0 = c0 % NUM_STAGES
    mbarrier.wait(k_ready.index(st0), (c0 // NUM_STAGES) & 1)
    mbarrier.arrive(k_empty.index(st0))
    for j in range(1, n_blocks):
        c = c0 + j
        st = c % NUM_STAGES
        prev = (c - 1) % NUM_STAGES
        mbarrier.wait(k_ready.index(st), (c // NUM_STAGES) & 1)
        mbarrier.wait(v_ready.index(prev), ((c - 1) // NUM_STAGES) & 1)
        if PINGPONG:
            mbarrier.wait(turns.index(WG), ((i0 + j - 1) & 1) ^ (1 if WG == 0 else 0))
            mbarrier.arrive(turns.index((WG + 1) % NC))
        mbarrier.arrive(k_empty.index(st))
        mbarrier.arrive(v_empty.index(prev))
    c_last = c0 + n_blocks - 1
    mbarrier.wait(v_ready.index(c_last % NUM_STAGES), (c_last // NUM_STAGES) & 1)
    if QB > 1:
        mbarrier.arrive(v_empty.index(c_last % NUM_STAGES))
        mbarrier.arrive(q_empty.index(q_idx))


@gluon.jit
def _consumer_tile(Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                   turns, b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse,
                   t, c0, i0, m_base,
                   WG: gl.constexpr, WG_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
                   NUM_STAGES: gl.constexpr, PINGPONG: gl.constexpr, NC: gl.constexpr, QB: gl.constexpr,
                   MASK_KIND: gl.constexpr, OVERLAP: gl.constexpr, SKIP: gl.constexpr):
    """_consumer_rows, or with SKIP, for a consumer (not the first) whose rows all lie past Sq,
    _consumer_pass."""
    if SKIP & (WG > 0):
        if m0 + WG * WG_M >= Sq:
            _consumer_pass(q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns, n_blocks, t, c0, i0,
                           WG, NUM_STAGES, PINGPONG, NC, QB)
        else:
            _consumer_rows(Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                           turns, b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse,
                           t, c0, i0, m_base, WG, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC, QB,
                           MASK_KIND, OVERLAP)
    else:
        _consumer_rows(Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                       turns, b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse,
                       t, c0, i0, m_base, WG, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC, QB,
                       MASK_KIND, OVERLAP)


@gluon.jit
def _consumer_rows(Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                   turns, b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse,
                   t, c0, i0, m_base,
                   WG: gl.constexpr, WG_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
                   NUM_STAGES: gl.constexpr, PINGPONG: gl.constexpr, NC: gl.constexpr, QB: gl.constexpr,
                   MASK_KIND: gl.constexpr, OVERLAP: gl.constexpr):
    """One consumer's rows of one tile: Q from buffer t % QB, ring blocks c0 + j, turns i0 + j - 1;
    with MASK_KIND the key-vector mask at m_base (Skv is then min(Skv, mask_len))."""
    NW: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                       instr_shape=[16, BLOCK_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    r0 = m0 + WG * WG_M
    rows = r0 + gl.arange(0, WG_M, layout=row_layout)
    pos = rows + offset
    mask_from = Skv
    if causal != 0:
        mask_from = gl.minimum(Skv, r0 + offset + 1)
    else:
        pos = rows * 0 + Skv
    q_idx = (t % QB) * NC + WG
    q_slot = q_smem.index(q_idx)
    q = q_slot.reshape([WG_M, BLOCK_D])
    s_zero = gl.zeros([WG_M, BLOCK_N], gl.float32, s_layout)

    mbarrier.wait(q_ready.index(q_idx), (t // QB) & 1)
    st0 = c0 % NUM_STAGES
    mbarrier.wait(k_ready.index(st0), (c0 // NUM_STAGES) & 1)
    k0 = k_ring.index(st0).reshape([BLOCK_N, BLOCK_D]).permute((1, 0))
    s = warpgroup_mma(q, k0, s_zero, use_acc=False, is_async=True)
    if MASK_KIND != 0:
        mv = _key_mask(m_base, 0, hi, s_layout, BLOCK_N)
        mv_next = _key_mask(m_base, BLOCK_N, hi, s_layout, BLOCK_N)
    s = warpgroup_mma_wait(0, deps=[s])
    mbarrier.arrive(k_empty.index(st0))
    m_i = gl.full([WG_M], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([WG_M], gl.float32, row_layout)
    if MASK_KIND != 0:
        lim = gl.minimum(pos, hi - 1)
        p, alpha, m_i, l_i = _softmax_bias(s, mv, m_i, l_i, 0, mask_from, lim, qk_scale,
                                           s_layout, BLOCK_N, MASK_KIND)
    elif QB > 1:
        lim = gl.minimum(pos, hi - 1)
        p, alpha, m_i, l_i = _softmax_lim(s, m_i, l_i, 0, mask_from, lim, qk_scale, s_layout, BLOCK_N)
    else:
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, 0, mask_from, hi, pos, qk_scale, s_layout, BLOCK_N)
    p = gl.convert_layout(p.to(dtype), p_layout)

    acc = gl.zeros([WG_M, BLOCK_D], gl.float32, o_layout)
    for j in range(1, n_blocks):
        c = c0 + j
        st = c % NUM_STAGES
        prev = (c - 1) % NUM_STAGES
        mbarrier.wait(k_ready.index(st), (c // NUM_STAGES) & 1)
        mbarrier.wait(v_ready.index(prev), ((c - 1) // NUM_STAGES) & 1)
        if PINGPONG:
            # Round robin over the running turn count i: turn i of consumer 0 follows the last
            # consumer's turn i - 1, turn i of consumer c > 0 follows consumer c - 1's turn i (a
            # fresh barrier reads as having completed the phase before 0, so consumer 0 starts).
            mbarrier.wait(turns.index(WG), ((i0 + j - 1) & 1) ^ (1 if WG == 0 else 0))
        k_j = k_ring.index(st).reshape([BLOCK_N, BLOCK_D]).permute((1, 0))
        s_tok = warpgroup_mma(q, k_j, s_zero, use_acc=False, is_async=True)
        v_prev = v_ring.index(prev).reshape([BLOCK_N, BLOCK_D])
        acc_tok = warpgroup_mma(p, v_prev, acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turns.index((WG + 1) % NC))
        if MASK_KIND != 0:  # this block's values came an iteration ago; the next block's now
            mv = mv_next
            mv_next = _key_mask(m_base, (j + 1) * BLOCK_N, hi, s_layout, BLOCK_N)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        mbarrier.arrive(k_empty.index(st))
        if MASK_KIND != 0:
            p, alpha, m_i, l_i = _softmax_bias(s, mv, m_i, l_i, j * BLOCK_N, mask_from, lim, qk_scale,
                                               s_layout, BLOCK_N, MASK_KIND)
        elif QB > 1:
            p, alpha, m_i, l_i = _softmax_lim(s, m_i, l_i, j * BLOCK_N, mask_from, lim, qk_scale,
                                              s_layout, BLOCK_N)
        else:
            p, alpha, m_i, l_i = _softmax(s, m_i, l_i, j * BLOCK_N, mask_from, hi, pos, qk_scale,
                                          s_layout, BLOCK_N)
        if OVERLAP:
            if Sq > 0:
                # Always true, but opaque to ptxas, which otherwise hoists this wait above the
                # exponentials, so that the softmax runs after this consumer's P V, not under it
                # (perf-notes v6). The other branch differs so that LLVM cannot merge the two.
                acc, p = warpgroup_mma_wait(0, deps=[acc_tok, p])
                mbarrier.arrive(v_empty.index(prev))
                p16 = gl.convert_layout(p.to(dtype), p_layout)
                acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            else:
                acc = warpgroup_mma_wait(0, deps=[acc_tok])
                mbarrier.arrive(v_empty.index(prev))
                p16 = gl.zeros([WG_M, BLOCK_N], dtype, p_layout)
            p = p16
        else:
            acc, p = warpgroup_mma_wait(0, deps=[acc_tok, p])
            mbarrier.arrive(v_empty.index(prev))
            p = gl.convert_layout(p.to(dtype), p_layout)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]

    c_last = c0 + n_blocks - 1
    last = c_last % NUM_STAGES
    mbarrier.wait(v_ready.index(last), (c_last // NUM_STAGES) & 1)
    v_last = v_ring.index(last).reshape([BLOCK_N, BLOCK_D])
    acc = warpgroup_mma(p, v_last, acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[acc])
    if QB > 1:  # the next tile's blocks come through this slot
        mbarrier.arrive(v_empty.index(last))

    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    out = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
    q.store(out.to(dtype))  # this consumer's Q slot holds its output rows; TMA clips past Sq
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(Y, [b, h, r0, 0], q_slot)
    if store_lse != 0:
        lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
        gl.store(Lse + pid_bh.to(gl.int64) * Sq + rows, lse, mask=rows < Sq)
    tma.store_wait(0)
    if QB > 1:  # the store has read the slot: the producer may load a later tile's Q there
        mbarrier.arrive(q_empty.index(q_idx))


@gluon.jit
def _consumer(Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns,
              b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, g0, n_valid, bh_all, Hq,
              m_base, lim_smem, lim_bar, ids, grp,
              WG: gl.constexpr, WG_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
              NUM_STAGES: gl.constexpr, PINGPONG: gl.constexpr, NC: gl.constexpr, TILES: gl.constexpr,
              MASK_KIND: gl.constexpr, OVERLAP: gl.constexpr, PREFIX: gl.constexpr,
              PERSISTENT: gl.constexpr, DYNAMIC: gl.constexpr, SKIP: gl.constexpr):
    if PREFIX:
        # Every consumer checks the keys its tile sees ([0, hi)) itself; the first one tells the
        # producer. A visible run [lo, end) runs unmasked over end - lo keys from lo (where lo > 0
        # from ring block 1: block 0, loaded before the check, is dropped); any other mask (holes,
        # other values, a wholly padded row, left padding under causal) runs the masked loop.
        lo, end = _visible_range(m_base, hi, causal, MASK_KIND, gl.num_warps())
        if WG == 0:
            _publish_range(lim_smem, lim_bar, lo, end, gl.num_warps())
        if lo >= 0:
            c0 = lo * 0
            if lo > 0:
                mbarrier.wait(k_ready.index(0), 0)
                mbarrier.wait(v_ready.index(0), 0)
                mbarrier.arrive(k_empty.index(0))
                mbarrier.arrive(v_empty.index(0))
                c0 = c0 + 1
            n_run = end - lo
            _consumer_tile(Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                           turns, b, h, pid_bh, m0, Sq, n_run, offset, causal, gl.maximum(gl.cdiv(n_run, BLOCK_N), 1),
                           n_run, qk_scale, store_lse, 0, c0, 0, m_base, WG, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES,
                           PINGPONG, NC, 1, 0, OVERLAP, SKIP)
        else:
            _consumer_tile(Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                           turns, b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse,
                           0, 0, 0, m_base, WG, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC, 1,
                           MASK_KIND, OVERLAP, SKIP)
    elif TILES == 1:
        _consumer_tile(Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                       turns, b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse,
                       0, 0, 0, m_base, WG, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC, 1,
                       MASK_KIND, OVERLAP, SKIP)
    elif DYNAMIC:
        # The producer's tiles in its order, each id read once its Q buffer is in; -1 ends.
        n_m = gl.cdiv(Sq, WG_M * NC)
        c0 = Sq * 0
        tt = Sq * 0
        tid = _read_tile(ids, q_ready, tt, WG, NC)
        while tid >= 0:
            m_t, b_t, h_t, hk_t, bh_t = _tile_of(tid, n_m, bh_all, grp, Hq, 1)
            m0_t, hi_t, nb_t = _tile_span(m_t, Sq, Skv, offset, causal, WG_M * NC, BLOCK_N)
            _consumer_tile(Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                           turns, b_t, h_t, bh_t, m0_t, Sq, Skv, offset, causal, nb_t, hi_t, qk_scale, store_lse,
                           tt, c0, c0 - tt, m_base, WG, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG,
                           NC, 2, MASK_KIND, OVERLAP, SKIP)
            c0 += nb_t
            tt += 1
            tid = _read_tile(ids, q_ready, tt, WG, NC)
    else:
        # Running counts over the CTA's tiles: ring blocks consumed and turns taken.
        # (A tile of n blocks takes n - 1 turns, so t tiles in, c0 - t turns have been taken.)
        c0 = n_valid * 0
        for t in range(n_valid):
            m_t, b_t, h_t, hk_t, bh_t = _cta_tile(t, g0, n_valid, Sq, causal, bh_all, Hq, 0, b, h, 0, pid_bh, WG_M * NC,
                                                  PERSISTENT)
            m0_t, hi_t, nb_t = _tile_span(m_t, Sq, Skv, offset, causal, WG_M * NC, BLOCK_N)
            _consumer_tile(Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                           turns, b_t, h_t, bh_t, m0_t, Sq, Skv, offset, causal, nb_t, hi_t, qk_scale, store_lse,
                           t, c0, c0 - t, m_base, WG, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG,
                           NC, 2, MASK_KIND, OVERLAP, SKIP)
            c0 += nb_t


@gluon.jit
def _consumer1(Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns,
               b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, g0, n_valid, bh_all, Hq,
               m_base, lim_smem, lim_bar, ids, grp,
               WG_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
               NUM_STAGES: gl.constexpr, PINGPONG: gl.constexpr, NC: gl.constexpr, TILES: gl.constexpr,
               MASK_KIND: gl.constexpr, OVERLAP: gl.constexpr, PREFIX: gl.constexpr,
               PERSISTENT: gl.constexpr, DYNAMIC: gl.constexpr, SKIP: gl.constexpr):
    _consumer(Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns,
              b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, g0, n_valid, bh_all, Hq,
              m_base, lim_smem, lim_bar, ids, grp, 1, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC, TILES,
              MASK_KIND, OVERLAP, PREFIX, PERSISTENT, DYNAMIC, SKIP)


@gluon.jit
def _consumer2(Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns,
               b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, g0, n_valid, bh_all, Hq,
               m_base, lim_smem, lim_bar, ids, grp,
               WG_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
               NUM_STAGES: gl.constexpr, PINGPONG: gl.constexpr, NC: gl.constexpr, TILES: gl.constexpr,
               MASK_KIND: gl.constexpr, OVERLAP: gl.constexpr, PREFIX: gl.constexpr,
               PERSISTENT: gl.constexpr, DYNAMIC: gl.constexpr, SKIP: gl.constexpr):
    _consumer(Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns,
              b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, g0, n_valid, bh_all, Hq,
              m_base, lim_smem, lim_bar, ids, grp, 2, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC, TILES,
              MASK_KIND, OVERLAP, PREFIX, PERSISTENT, DYNAMIC, SKIP)


@gluon.jit
def flash_fwd_gluon_ws(
    Q, K, V, Y, Lse, Mask, SeqlensK,
    scale, softcap,
    Hq, group, Sq, Skv, D, Dv, offset, causal, window_left, window_right, mask_len, has_seqlens,
    store_lse,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_yb, stride_yh, stride_ym,
    stride_mb, stride_mh, stride_mm,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, NUM_STAGES: gl.constexpr,
    PINGPONG: gl.constexpr = True, NUM_CONSUMERS: gl.constexpr = 2, CONSUMER_REGS: gl.constexpr = 240,
    TILES_PER_CTA: gl.constexpr = 1, MASK_KIND: gl.constexpr = 0, OVERLAP_PV: gl.constexpr = False,
    MASK_PREFIX: gl.constexpr = False, PERSISTENT_GRID: gl.constexpr = False, DYNAMIC_TILES: gl.constexpr = False,
    SKIP_PAST_ROWS: gl.constexpr = False,
):
    gl.static_assert(gl.num_warps() == CONSUMER_WARPS, "the default partition is one consumer warpgroup")
    gl.static_assert((NUM_CONSUMERS == 2) | (NUM_CONSUMERS == 3), "two or three consumer warpgroups")
    # (An unnamed constexpr after a named one arrives as a wrapped None, which `is None` misses.)
    MASKED: gl.constexpr = 1 if MASK_KIND == 1 else (2 if MASK_KIND == 2 else 0)
    # PERSISTENT_GRID (no mask): a grid of (CTAs, 1) takes all of the call's tiles in turn, each CTA
    # with two Q buffers as TILES_PER_CTA 2 (_cta_tile); window_right carries B * Hq (this kernel
    # takes no windows: the launcher passes it so for such a cubin).
    PERSISTENT: gl.constexpr = True if (PERSISTENT_GRID == True) & (MASKED == 0) else False  # noqa: E712
    # DYNAMIC_TILES (with PERSISTENT_GRID): the producer hands out the tiles (_tile_of's order) as
    # CTAs free up, through the int64 counter pair at SeqlensK where has_seqlens is 1 (zero at
    # launch; the launch leaves it zero), else every CTAs-th tile; each tile's id reaches the
    # consumers through shared memory with its Q (this kernel takes no key lengths, so those
    # arguments are free).
    DYN: gl.constexpr = True if (DYNAMIC_TILES == True) & PERSISTENT else False  # noqa: E712
    # SKIP_PAST_ROWS: a consumer whose rows of a tile all lie past Sq takes no part in its GEMMs
    # (_consumer_pass): at d64 (192-row tiles) the last tile of N 512 or 1024 leaves one or two of
    # three consumers without rows.
    SKIP: gl.constexpr = True if SKIP_PAST_ROWS == True else False  # noqa: E712
    # An AOT source that does not name a constexpr passes None, not the default.
    TILES: gl.constexpr = 2 if PERSISTENT else (1 if TILES_PER_CTA is None else TILES_PER_CTA)
    gl.static_assert(TILES >= 1, "at least one query tile per CTA")
    NC: gl.constexpr = NUM_CONSUMERS
    WG_M: gl.constexpr = BLOCK_M // NUM_CONSUMERS
    QB: gl.constexpr = 1 if TILES == 1 else 2  # Q buffers: the next tile's loads run under this one
    OVERLAP: gl.constexpr = True if OVERLAP_PV == True else False  # noqa: E712 (a wrapped None is False)
    PREFIX: gl.constexpr = True if MASK_PREFIX == True else False  # noqa: E712
    bh_all = window_right
    gl.static_assert((not PREFIX) | ((MASKED != 0) & (TILES == 1)),
                     "the visible-range check needs a key-vector mask and one tile per CTA")
    dtype: gl.constexpr = Q.dtype

    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // Hq
    h = pid_bh % Hq
    hk = h // group
    # Under a key-vector mask the keys from mask_len on are hidden: every partition sees the keys
    # [0, min(Skv, mask_len)), which bounds the blocks it loads and runs.
    m_base = Mask + b.to(gl.int64) * stride_mb + h.to(gl.int64) * stride_mh
    if MASKED != 0:
        Skv = gl.minimum(Skv, mask_len)

    # Keys a tile sees: [0, hi). Every consumer runs every block of its tile (the upper one masks
    # the tail of the diagonal), so they stay in step on the ring and the turns.
    if TILES == 1:
        m0, hi, n_blocks = _tile_span(pid_m, Sq, Skv, offset, causal, BLOCK_M, BLOCK_N)
        g0 = 0
        n_valid = 1
    else:
        # Tiles g0 .. g0 + n_valid - 1 (those starting below Sq), longest first; the partitions
        # derive each tile's span themselves.
        m0 = 0
        hi = 0
        n_blocks = 0
        g0 = pid_m * TILES
        n_valid = gl.minimum(gl.cdiv(Sq, BLOCK_M) - g0, TILES)
        if PERSISTENT:
            g0 = gl.program_id(0)
            n_valid = gl.cdiv(gl.cdiv(Sq, BLOCK_M) * bh_all - g0, gl.num_programs(0))
    qk_scale = scale * LOG2E

    q_smem = gl.allocate_shared_memory(dtype, [QB * NC, 1, 1, WG_M, BLOCK_D], Q.layout)
    k_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_N, BLOCK_D], K.layout)
    v_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_N, BLOCK_D], V.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [QB * NC, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    if QB > 1:
        q_empty = gl.allocate_shared_memory(gl.int64, [QB * NC, 1], mbarrier.MBarrierLayout())
    else:
        q_empty = q_ready  # never used with one tile
    for i in gl.static_range(NC):
        for qb in gl.static_range(QB):
            mbarrier.init(q_ready.index(qb * NC + i), count=1)
            if QB > 1:
                mbarrier.init(q_empty.index(qb * NC + i), count=1)  # the consumer that reads the slot
        mbarrier.init(turns.index(i), count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=NC)  # one arrival per consumer warpgroup
        mbarrier.init(v_empty.index(i), count=NC)
    if PREFIX:  # the first consumer's visible-range check, for the producer
        lim_smem = gl.allocate_shared_memory(gl.int32, [2], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        lim_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        mbarrier.init(lim_bar.index(0), count=1)
    else:
        lim_smem = q_ready  # never used
        lim_bar = q_ready
    if DYN:  # a tile id per Q buffer; heads in groups whose K/V take about 16 MB of L2
        ids = gl.allocate_shared_memory(gl.int32, [2, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        grp = gl.maximum(gl.minimum((4194304 // BLOCK_D) // gl.maximum(Skv, 1), 8), 1)
    else:
        ids = q_ready  # never used
        grp = 1
    fence_async_shared()

    # The partitions (the first is the default one); list literals, as warp_specialize needs.
    if NC == 2:
        gl.warp_specialize([
            (_consumer, (Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns,
                         b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, g0, n_valid, bh_all, Hq,
                         m_base, lim_smem, lim_bar, ids, grp, 0, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC,
                         TILES, MASKED, OVERLAP, PREFIX, PERSISTENT, DYN, SKIP)),
            (_consumer1, (Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns,
                          b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, g0, n_valid, bh_all, Hq,
                          m_base, lim_smem, lim_bar, ids, grp, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC,
                          TILES, MASKED, OVERLAP, PREFIX, PERSISTENT, DYN, SKIP)),
            (_producer, (Q, K, V, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                         b, h, hk, m0, n_blocks, g0, n_valid, bh_all, Hq, group, Sq, Skv, offset, causal, lim_smem, lim_bar,
                         ids, SeqlensK, has_seqlens, grp, WG_M, BLOCK_N, NUM_STAGES, NC, TILES, PREFIX, PERSISTENT,
                         DYN)),
        ], [CONSUMER_WARPS, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns,
                         b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, g0, n_valid, bh_all, Hq,
                         m_base, lim_smem, lim_bar, ids, grp, 0, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC,
                         TILES, MASKED, OVERLAP, PREFIX, PERSISTENT, DYN, SKIP)),
            (_consumer1, (Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns,
                          b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, g0, n_valid, bh_all, Hq,
                          m_base, lim_smem, lim_bar, ids, grp, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC,
                          TILES, MASKED, OVERLAP, PREFIX, PERSISTENT, DYN, SKIP)),
            (_consumer2, (Y, Lse, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns,
                          b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, g0, n_valid, bh_all, Hq,
                          m_base, lim_smem, lim_bar, ids, grp, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC,
                          TILES, MASKED, OVERLAP, PREFIX, PERSISTENT, DYN, SKIP)),
            (_producer, (Q, K, V, q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                         b, h, hk, m0, n_blocks, g0, n_valid, bh_all, Hq, group, Sq, Skv, offset, causal, lim_smem, lim_bar,
                         ids, SeqlensK, has_seqlens, grp, WG_M, BLOCK_N, NUM_STAGES, NC, TILES, PREFIX, PERSISTENT,
                         DYN)),
        ], [CONSUMER_WARPS, CONSUMER_WARPS, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])

    for i in gl.static_range(NC):
        for qb in gl.static_range(QB):
            mbarrier.invalidate(q_ready.index(qb * NC + i))
            if QB > 1:
                mbarrier.invalidate(q_empty.index(qb * NC + i))
        mbarrier.invalidate(turns.index(i))
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(k_ready.index(i))
        mbarrier.invalidate(v_ready.index(i))
        mbarrier.invalidate(k_empty.index(i))
        mbarrier.invalidate(v_empty.index(i))
    if PREFIX:
        mbarrier.invalidate(lim_bar.index(0))
