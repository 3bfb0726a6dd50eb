"""The warp-specialized Hopper (sm_90) FlashAttention forward kernel in Gluon: FlashAttention-3's
CTA layout (a TMA producer warp, two or three consumer warpgroups sharing one K/V ring) in our own
code. This is its entry point: the shared memory, the barriers and the partitions; the roles are
the modules of aot/gluon_ws/ (its __init__ says which does what), the tiles aot/tiles.py's.

Same parameters as flash_fwd_gluon (aot/contract.py's FwdGluon ABI: flash_fwd's, then TileCounter
and Q's rotary, which each consumer applies to its Q rows as they arrive)
and the same op contract as both (cpp/flash_params.h): query row i
sits at absolute position i + offset and, under causal, sees keys j <= i + offset (bottom-right);
a row that sees no key gives 0 and lse -inf. It takes fp16/bf16, D == Dv in {64, 128}, no extras
(softcap and windows are ignored; has_seqlens bounds each batch row's keys at SeqlensK[b] with
positions kept, as flash_fwd_gluon's), and no mask or, with MASK_KIND 1 (bool) or 2 (additive), a key-vector
mask (one row of mask_len values per (batch, head) through stride_mb and stride_mh, its query
stride 0: the (B, 1, 1, S) padding mask of BERT-style models; keys from mask_len on are hidden).
The mask enters as one log2-unit bias per key (softmax.py _softmax_bias), its values loaded a key
block ahead; with MASK_PREFIX a tile whose keys show one visible run runs unmasked over it
(mask_prefix.py).

Q and Y are TMA descriptors with a (1, 1, BLOCK_M / NUM_CONSUMERS, D) box, K and V (1, 1, BLOCK_N, D),
over the (B, H, S, D) views: a persistent grid reads B * Hq from Q's shape (the dims the launch
passes with its descriptor). Dynamic tiles claim them through the int64 pair at TileCounter (0: no
counter). No argument carries anything but its own meaning. TILES_PER_CTA = 1 (no persistent grid)
compiles none of the multi-tile code, whose branches are constexpr: one Q buffer, no Q-empty
barriers, the tile's key range from its grid coordinates.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from .flash_fwd_gluon import LOG2E, _key_len, desc_layout, desc_signature  # noqa: F401 (aot/build.py's descriptor types)
from .gluon_ws.mainloop import _consumer
from .gluon_ws.params import CONSUMER_WARPS, PRODUCER_REGS, Buffers, ConsumerConfig, Rope, Work
from .gluon_ws.producer import _producer
from .gluon_ws.scheduler import _cta_coords, _cta_tiles, _head_group, _tile_span


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
    TileCounter, Cos, Sin, rotary_half, max_position,
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
    # with two Q buffers as TILES_PER_CTA 2 (_cta_tile), over B * Hq (batch, head) pairs: Q's first
    # two dims.
    PERSISTENT: gl.constexpr = True if (PERSISTENT_GRID == True) & (MASKED == 0) else False  # noqa: E712
    # DYNAMIC_TILES (with PERSISTENT_GRID): the producer hands out the tiles (_tile_of's order) as
    # CTAs free up, through the int64 counter pair at TileCounter (zero at launch; the launch
    # leaves it zero), or where that is 0 every CTAs-th tile; each tile's id reaches the consumers
    # through shared memory with its Q.
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
    bh_all = Q.shape[0] * Q.shape[1]  # B * Hq (a persistent grid's (batch, head) pairs)
    gl.static_assert((not PREFIX) | ((MASKED != 0) & (TILES == 1)),
                     "the visible-range check needs a key-vector mask and one tile per CTA")
    dtype: gl.constexpr = Q.dtype

    pid_m, pid_bh, b, h, hk = _cta_coords(Hq, group)
    # Under a key-vector mask the keys from mask_len on are hidden: every partition sees the keys
    # [0, min(Skv, mask_len)), which bounds the blocks it loads and runs.
    m_base = Mask + b.to(gl.int64) * stride_mb + h.to(gl.int64) * stride_mh
    if MASKED != 0:
        Skv = gl.minimum(Skv, mask_len)
    # A per-row key bound (has_seqlens): here for the CTA's one (batch, head), per tile where a CTA
    # runs several (the scheduler's _tile_keys).
    if TILES == 1:
        Skv = _key_len(Skv, SeqlensK, has_seqlens, b)

    # Keys a tile sees: [0, hi). Every consumer runs every block of its tile (the upper one masks
    # the tail of the diagonal), so they stay in step on the ring and the turns.
    if TILES == 1:
        m0, hi, n_blocks = _tile_span(pid_m, Sq, Skv, offset, causal, BLOCK_M, BLOCK_N)
        g0 = 0
        n_valid = 1
    else:
        # The CTA's tiles (the scheduler's); the partitions derive each tile's span themselves.
        m0 = 0
        hi = 0
        n_blocks = 0
        g0, n_valid = _cta_tiles(pid_m, Sq, bh_all, BLOCK_M, TILES, PERSISTENT)
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
        grp = _head_group(Skv, BLOCK_D)
        use_ctr = TileCounter.to(gl.int64) != 0  # else every CTAs-th tile (a stream without counters)
    else:
        ids = q_ready  # never used
        grp = 1
        use_ctr = False
    fence_async_shared()
    bufs = Buffers(q_smem, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns)
    cfg = ConsumerConfig(WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC, TILES, MASKED, OVERLAP, PREFIX, PERSISTENT,
                         DYN, SKIP)
    work = Work(b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, g0, n_valid, bh_all,
                Hq, m_base, lim_smem, lim_bar, ids, grp, hk, group, TileCounter, use_ctr, SeqlensK, has_seqlens)
    rope = Rope(Cos, Sin, rotary_half, max_position)  # each consumer turns its own Q rows

    # The partitions (the first is the default one); list literals, as warp_specialize needs.
    if NC == 2:
        gl.warp_specialize([
            (_consumer, (Y, Lse, bufs, work, rope, 0, cfg)),
            (_consumer, (Y, Lse, bufs, work, rope, 1, cfg)),
            (_producer, (Q, K, V, bufs, work, cfg)),
        ], [CONSUMER_WARPS, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (Y, Lse, bufs, work, rope, 0, cfg)),
            (_consumer, (Y, Lse, bufs, work, rope, 1, cfg)),
            (_consumer, (Y, Lse, bufs, work, rope, 2, cfg)),
            (_producer, (Q, K, V, bufs, work, cfg)),
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
