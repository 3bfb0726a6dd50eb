"""The Hopper (sm_90) FlashAttention forward kernel in Gluon, for the calls where it measured faster
than the triton.language family in aot/flash_fwd.py (perf-notes "prefill v6: Gluon").

flash_fwd's parameters, TileCounter and Q's rotary (aot/contract.py's FwdGluon ABI, the
warp-specialized kernel's; this one ignores the counter), same op contract
(cpp/flash_params.h): query row i sits at absolute position i + offset and, under causal, sees
keys j <= i + offset (bottom-right); a row that sees no key gives 0 and lse -inf. It takes
fp16/bf16, D == Dv in {64, 128}, no mask and no extras (softcap and windows are ignored); the
dispatcher keeps every other call on flash_fwd. has_seqlens != 0 bounds batch row b's keys at
SeqlensK[b] with every position kept (FlashParams::key_bound: a GroupQueryAttention first prompt,
whose shorter rows keep their queries' positions), not flash_fwd's bottom-right key lengths.
rotary_half != 0 turns Q's tile in shared memory by the rotary of each row's position as it
arrives (_rope_rows, _rotate_rows: a first prompt's Q read straight from the op's input, not from a
rotated copy). `attend` is the body; with APPEND_KV (an experiment, lab/experiments/gqa_append.py,
not built) it also writes a first prompt's new K (turned on load) and V to present.

Q, K, V and Y are TMA descriptors over the (B, H, S, D) view, box (1, 1, rows, D), 128-byte
swizzle, zero fill past S, stores clipped per (b, h). Grid (cdiv(Sq, BLOCK_M), B * Hq), query
blocks in reverse so the longest causal blocks start first; fully masked causal blocks are never
loaded.

Schedule of one CTA (all warps are consumers; each warpgroup owns 64 rows): S_j = Q K_j^T and
P_{j-1} V_{j-1} go to the tensor cores back to back as two async wgmma groups; wait(1) retires
S_j, the softmax of block j follows, wait(0) retires P V. K/V sit in NUM_STAGES-deep rings on
mbarriers, refilled by TMA once every warpgroup is past the wgmma that read the slot (with two
slots, K and V each as soon as theirs is). With
OVERLAP_PV the softmax also runs under P V in the SASS (see the comment at the wait).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from .gluon_ws.params import Acc, Call, Tile

LOG2E = gl.constexpr(1.4426950408889634)
LN2 = gl.constexpr(0.6931471805599453)


def desc_layout() -> gl.NVMMASharedLayout:
    """The shared layout of every descriptor's (1, 1, rows, D) box: 128-byte swizzle (a 64-
    element fp16 row; Triton splits a 128-element row into two boxes)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=4)


def desc_signature(dtype: str, rows: int, head_dim: int) -> str:
    """The ASTSource signature of one descriptor argument, e.g. for aot/build.py."""
    return f"tensordesc<{dtype}[1,1,{rows},{head_dim}],{desc_layout()!r}>"


# The wgmma layouts of both Gluon kernels (this one and the warp-specialized one): S = Q K^T of
# a (rows, BLOCK_N) block, the (rows, BLOCK_D) output, P as the A operand of P V, and a row vector.
@constexpr_function
def s_layout_of(num_warps, block_n):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, block_n, 16])


@constexpr_function
def o_layout_of(num_warps, block_d):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, block_d, 16])


@constexpr_function
def p_layout_of(o_layout):
    return gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)


@constexpr_function
def row_layout_of(s_layout):
    return gl.SliceLayout(1, s_layout)


@gluon.jit
def _epilogue(Y, Lse, q_empty, call, tile, q_slot, q_idx, state, r0, rows, o_layout: gl.constexpr,
              QB: gl.constexpr):
    """Rows of a tile out (both kernels): O / l into their Q slot, from there to Y by TMA (clipped
    past Sq), the log-sum-exp (natural log; -inf and O = 0 for a row that saw no key) where asked;
    with two Q buffers the slot (q_empty's barrier q_idx) is freed for a later tile's Q once the
    store has read it. call, tile and state (the accumulator, running max and sum) are
    gluon_ws/params.py's Call, Tile and Acc."""
    dtype: gl.constexpr = q_slot.dtype
    acc = state.acc
    m_i = state.m_i
    l_i = state.l_i
    q = q_slot.reshape([q_slot.shape[2], q_slot.shape[3]])
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    out = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
    q.store(out.to(dtype))  # the Q slot holds the output rows; TMA clips past Sq
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(Y, [tile.b, tile.h, r0, 0], q_slot)
    if call.store_lse != 0:
        lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
        gl.store(Lse + tile.pid_bh.to(gl.int64) * call.Sq + rows, lse, mask=rows < call.Sq)
    tma.store_wait(0)
    if QB > 1:  # the store has read the slot: the producer may load a later tile's Q there
        mbarrier.arrive(q_empty.index(q_idx))


@constexpr_function
def half_layout_of(num_warps, half):
    """A [rows, half] tile of Q's halves: 8 contiguous elements (16 bytes) per thread."""
    cols = min(32, half // 8)
    return gl.BlockedLayout([1, 8], [32 // cols, cols], [num_warps, 1], [1, 0])


@gluon.jit
def _rope_rows(Cos, Sin, r0, Sq, rotary_half, max_position, ROWS: gl.constexpr, BLOCK_D: gl.constexpr):
    """The cos and sin rows of query rows r0 .. r0 + ROWS - 1 (their positions; D = BLOCK_D = 2 *
    rotary_half), in the layout _rotate_rows turns Q's halves in, and which rows turn: those below Sq
    and max_position. Loaded before Q's tile has arrived, so that their latency hides under its
    TMA. The launcher passes 16-byte aligned tables (cpp/gqa_launch.cc), so that each thread's 8
    consecutive entries load as one vector."""
    HALF: gl.constexpr = BLOCK_D // 2
    layout: gl.constexpr = half_layout_of(gl.num_warps(), HALF)
    rows = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, HALF, layout=gl.SliceLayout(0, layout))
    turn = (rows < Sq) & (rows < max_position)
    # Each row's table rows start 16-byte aligned (the launcher's promise, made to the compiler
    # here: the tables' arguments carry no alignment of their own).
    at = rows.to(gl.int64) * rotary_half
    cos_row = gl.multiple_of(Cos + at, [16])
    sin_row = gl.multiple_of(Sin + at, [16])
    t = turn[:, None] & (cols < HALF)[None, :]
    cos = gl.load(cos_row[:, None] + cols[None, :], mask=t, other=1.0)
    sin = gl.load(sin_row[:, None] + cols[None, :], mask=t, other=0.0)
    return cos, sin, t


@gluon.jit
def _rotate_rows(q, cos, sin, t, BLOCK_D: gl.constexpr):
    """Q's (or new K's) rows in shared memory (q: their [rows, BLOCK_D] tile) turned in place by
    the rotary of their positions (_rope_rows' cos, sin and `t`, the rows that turn; contract.py's
    FwdGluon ABI): (x_lo, x_hi) -> (x_lo cos - x_hi sin, x_hi cos + x_lo sin) in fp32, the same
    operations in the same order as aot/gqa_prepare.py's, so that a row rounds as its copy there
    would. Every warp of the caller takes part; the rows are in place for the tensor cores and TMA
    when it returns."""
    HALF: gl.constexpr = BLOCK_D // 2
    layout: gl.constexpr = half_layout_of(gl.num_warps(), HALF)
    lo_s = q.slice(0, HALF, dim=1)
    hi_s = q.slice(HALF, HALF, dim=1)
    x_lo = lo_s.load(layout).to(gl.float32)
    x_hi = hi_s.load(layout).to(gl.float32)
    c = cos.to(gl.float32)
    s = sin.to(gl.float32)
    # -1.0 * x flips x's sign (-x would be 0 - x, which turns -0 into +0), as the prepare kernel.
    y_lo = gl.where(t, x_lo * c + (-1.0 * x_hi) * s, x_lo)
    y_hi = gl.where(t, x_hi * c + x_lo * s, x_hi)
    lo_s.store(y_lo.to(q.dtype))
    hi_s.store(y_hi.to(q.dtype))
    # The generic proxy's stores before the async proxy's reads (wgmma), by every warp.
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _load_kv(desc, ring, bars, b, hk, block, stage, pred, BLOCK_N: gl.constexpr):
    bar = bars.index(stage)
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [b, hk, block * BLOCK_N, 0], bar, ring.index(stage), pred=pred)


@gluon.jit
def _key_len(Skv, SeqlensK, has_seqlens, b):
    """The keys batch row b sees, [0, n): Skv, bounded by SeqlensK[b] (int64) where has_seqlens is
    set. Positions do not move: under causal the diagonal stays where the call's offset puts it."""
    n = Skv
    if has_seqlens != 0:
        n = gl.minimum(Skv, gl.load(SeqlensK + b).to(gl.int32))
    return n


@gluon.jit
def _softmax(s, m_i, l_i, start_n, mask_from, limit, pos, qk_scale,
             s_layout: gl.constexpr, BLOCK_N: gl.constexpr):
    """One key block's online-softmax step on S (fp32, s_layout): the probabilities P, the
    rescale factor of the running output, and the new running max (log2 units) and sum."""
    if start_n + BLOCK_N > mask_from:  # causal diagonal or the ragged end: mask per element
        cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        keep = (cols[None, :] <= pos[:, None]) & (cols[None, :] < limit)
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    # A row that has seen no key yet keeps m = -inf; subtract 0 there so exp2 gives 0, not NaN.
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * qk_scale - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _key_block(k_ring, k_bars, slot, phase, Kout, b, hk, block, own, cos, sin, turn, rotary_half,
               BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, APPEND_KV: gl.constexpr):
    """Wait for key block `block` in ring slot `slot`. With APPEND_KV its rows are new tokens read
    from the op's input: turned by the rotary of their positions where rotary_half is set (_rope_rows'
    cos, sin and turn for the block's rows, loaded before the wait), then, where `own`, stored to
    Kout (present) from the slot."""
    mbarrier.wait(k_bars.index(slot), phase)
    if APPEND_KV:
        if rotary_half != 0:
            _rotate_rows(k_ring.index(slot).reshape([BLOCK_N, BLOCK_D]), cos, sin, turn, BLOCK_D)
        if own:
            tma.async_copy_shared_to_global(Kout, [b, hk, block * BLOCK_N, 0], k_ring.index(slot))


@gluon.jit
def _append_rest(K, V, Kout, Vout, k_ring, v_ring, k_bars, v_bars, b, hk, first, last, ring0, Cos, Sin, Sq,
                 rotary_half, max_position, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
                 NUM_STAGES: gl.constexpr):
    """APPEND_KV: key blocks first .. last - 1 that this CTA writes to present but its attention
    did not load (rows past its key bound: a padded row's new tokens), each loaded into the ring
    (slot and phase as if the ring's count went on from ring0), its K turned, both stored. Every
    wgmma has retired."""
    for j in range(first, last):
        tma.store_wait(0)  # a slot used again here is no longer read by a store
        gl.thread_barrier()
        n = ring0 + j - first
        slot = n % NUM_STAGES
        phase = (n // NUM_STAGES) & 1
        cos, sin, turn = _rope_rows(Cos, Sin, j * BLOCK_N, Sq, rotary_half, max_position, BLOCK_N, BLOCK_D)
        _load_kv(K, k_ring, k_bars, b, hk, j, slot, True, BLOCK_N)
        _load_kv(V, v_ring, v_bars, b, hk, j, slot, True, BLOCK_N)
        _key_block(k_ring, k_bars, slot, phase, Kout, b, hk, j, True, cos, sin, turn, rotary_half,
                   BLOCK_N, BLOCK_D, True)
        mbarrier.wait(v_bars.index(slot), phase)
        tma.async_copy_shared_to_global(Vout, [b, hk, j * BLOCK_N, 0], v_ring.index(slot))
    tma.store_wait(0)
    gl.thread_barrier()


@gluon.jit
def flash_fwd_gluon(
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
    OVERLAP_PV: gl.constexpr = False,
):
    attend(Q, K, V, Y, Lse, Mask, SeqlensK, scale, Hq, group, Sq, Skv, offset, causal, has_seqlens, store_lse,
           Cos, Sin, rotary_half, max_position, None, None, BLOCK_M, BLOCK_N, BLOCK_D, NUM_STAGES, OVERLAP_PV,
           False)


@gluon.jit
def attend(Q, K, V, Y, Lse, Mask, SeqlensK, scale, Hq, group, Sq, Skv, offset, causal, has_seqlens, store_lse,
           Cos, Sin, rotary_half, max_position, Kout, Vout,
           BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, NUM_STAGES: gl.constexpr,
           OVERLAP_PV: gl.constexpr, APPEND_KV: gl.constexpr):
    """flash_fwd_gluon's body. APPEND_KV (a GroupQueryAttention first prompt with no past: Sq ==
    Skv, offset 0, key j the new token j): K and V are the op's new tokens, not present; each CTA
    turns K's blocks by the rotary as they arrive (Q's tables and rotary_half), and the CTA of each
    (batch row, KV head)'s first query head stores the new rows of its own query rows, [m0, m0 +
    BLOCK_M) below Sq, rotated K and V, into present through Kout and Vout ((B, Hkv, Sq, D)
    descriptors over present's rows), those its attention loads as they pass through the ring and
    the rest (past the row's key bound) after it; a row with no keys (SeqlensK 0) writes none."""
    # With three slots or more a slot is refilled two iterations after its block was loaded, before
    # the next K wait (with two, that refill of block j would wait behind the wait for block j:
    # deadlock). With two (a smaller ring, for more CTAs an SM at short lengths, whose one or two
    # key blocks need no refill) K and V are refilled apart, each as soon as its slot is read: K_{j+2}
    # into K_j's slot once S_j has retired, V_{j+1} into V_{j-1}'s once P_{j-1} V_{j-1} has.
    gl.static_assert(NUM_STAGES >= 2, "the K/V ring needs at least 2 slots")
    NW: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = Q.dtype
    s_layout: gl.constexpr = s_layout_of(NW, BLOCK_N)
    o_layout: gl.constexpr = o_layout_of(NW, BLOCK_D)
    p_layout: gl.constexpr = p_layout_of(o_layout)
    row_layout: gl.constexpr = row_layout_of(s_layout)

    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // Hq
    h = pid_bh % Hq
    hk = h // group
    m0 = pid_m * BLOCK_M
    Skv = _key_len(Skv, SeqlensK, has_seqlens, b)

    # Keys this block sees: [0, hi); blocks ending at or below mask_from need no element mask.
    row_hi = gl.minimum(m0 + BLOCK_M, Sq) - 1
    hi = Skv
    mask_from = Skv
    if causal != 0:
        hi = gl.minimum(Skv, row_hi + offset + 1)
        mask_from = gl.minimum(Skv, m0 + offset + 1)
    # At least one block, so the pipeline below needs no empty case: a block seen by no row is
    # masked whole and leaves l = 0.
    n_blocks = gl.maximum(gl.cdiv(hi, BLOCK_N), 1)
    rows = m0 + gl.arange(0, BLOCK_M, layout=row_layout)
    pos = rows + offset
    if causal == 0:
        pos = rows * 0 + Skv
    qk_scale = scale * LOG2E
    # APPEND_KV: the key blocks this CTA writes to present, [own_from, own_to): those of its query
    # rows [m0, m0 + BLOCK_M) below Sq, for the group's first head of a row with keys, else none.
    if APPEND_KV:
        owner = ((h % group) == 0) & (Skv > 0)
        own_from = m0 // BLOCK_N
        own_to = gl.cdiv(gl.where(owner, gl.minimum(m0 + BLOCK_M, Sq), m0), BLOCK_N)

    q_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, BLOCK_D], Q.layout)
    k_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_N, BLOCK_D], K.layout)
    v_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_N, BLOCK_D], V.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    fence_async_shared()

    mbarrier.expect(q_bar, Q.block_type.nbytes)
    tma.async_copy_global_to_shared(Q, [b, h, m0, 0], q_bar, q_smem)
    for i in gl.static_range(NUM_STAGES):
        _load_kv(K, k_ring, k_bars, b, hk, i, i, i < n_blocks, BLOCK_N)
        _load_kv(V, v_ring, v_bars, b, hk, i, i, i < n_blocks, BLOCK_N)
    q = q_smem.reshape([BLOCK_M, BLOCK_D])

    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    if APPEND_KV:
        kc, ks, kt = _rope_rows(Cos, Sin, 0, Sq, rotary_half, max_position, BLOCK_N, BLOCK_D)
    if rotary_half != 0:
        cos, sin, turn = _rope_rows(Cos, Sin, m0, Sq, rotary_half, max_position, BLOCK_M, BLOCK_D)
        mbarrier.wait(q_bar, 0)
        _rotate_rows(q, cos, sin, turn, BLOCK_D)
    else:
        mbarrier.wait(q_bar, 0)
    if APPEND_KV:
        _key_block(k_ring, k_bars, 0, 0, Kout, b, hk, 0, (own_from == 0) & (own_to > 0), kc, ks, kt,
                   rotary_half, BLOCK_N, BLOCK_D, True)
    else:
        mbarrier.wait(k_bars.index(0), 0)
    k0 = k_ring.index(0).reshape([BLOCK_N, BLOCK_D]).permute((1, 0))
    s = warpgroup_mma(q, k0, s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=[s])
    if NUM_STAGES == 2:  # K_0's slot: read by S_0, retired (and stored to present)
        if APPEND_KV:
            tma.store_wait(0)
        gl.thread_barrier()
        _load_kv(K, k_ring, k_bars, b, hk, 2, 0, 2 < n_blocks, BLOCK_N)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_layout)
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, 0, mask_from, hi, pos, qk_scale, s_layout, BLOCK_N)
    p = gl.convert_layout(p.to(dtype), p_layout)

    acc = gl.zeros([BLOCK_M, BLOCK_D], gl.float32, o_layout)
    for j in range(1, n_blocks):
        # S_j and P_{j-1} V_{j-1} go to the tensor cores back to back; the softmax of block j
        # runs while P_{j-1} V_{j-1} is still in flight. Every wgmma retires in its iteration.
        st = j % NUM_STAGES
        prev = (j - 1) % NUM_STAGES
        if APPEND_KV:
            kc, ks, kt = _rope_rows(Cos, Sin, j * BLOCK_N, Sq, rotary_half, max_position, BLOCK_N, BLOCK_D)
            _key_block(k_ring, k_bars, st, (j // NUM_STAGES) & 1, Kout, b, hk, j,
                       (j >= own_from) & (j < own_to), kc, ks, kt, rotary_half, BLOCK_N, BLOCK_D, True)
        else:
            mbarrier.wait(k_bars.index(st), (j // NUM_STAGES) & 1)
        k_j = k_ring.index(st).reshape([BLOCK_N, BLOCK_D]).permute((1, 0))
        s_tok = warpgroup_mma(q, k_j, s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_bars.index(prev), ((j - 1) // NUM_STAGES) & 1)
        if APPEND_KV:
            if (j - 1 >= own_from) & (j - 1 < own_to):
                tma.async_copy_shared_to_global(Vout, [b, hk, (j - 1) * BLOCK_N, 0], v_ring.index(prev))
        v_prev = v_ring.index(prev).reshape([BLOCK_N, BLOCK_D])
        acc_tok = warpgroup_mma(p, v_prev, acc, is_async=True)
        if APPEND_KV:  # the slot refilled below is no longer read by a store to present
            tma.store_wait(0)
        if NUM_STAGES >= 3:
            # Slot j-2 was last read by P_{j-2} V_{j-2}, retired in the previous iteration: refill
            # it once every warpgroup is past that point (here, as early as that is known).
            gl.thread_barrier()
            old_blk = j - 2 + NUM_STAGES
            refill = (j >= 2) & (old_blk < n_blocks)
            _load_kv(K, k_ring, k_bars, b, hk, old_blk, old_blk % NUM_STAGES, refill, BLOCK_N)
            _load_kv(V, v_ring, v_bars, b, hk, old_blk, old_blk % NUM_STAGES, refill, BLOCK_N)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        if NUM_STAGES == 2:  # K_j's slot: read by S_j, retired
            gl.thread_barrier()
            _load_kv(K, k_ring, k_bars, b, hk, j + 2, j % 2, j + 2 < n_blocks, BLOCK_N)
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, j * BLOCK_N, mask_from, hi, pos, qk_scale,
                                      s_layout, BLOCK_N)
        # Only now may P_j overwrite the registers P_{j-1} V_{j-1} reads from (P passes through
        # the wait so its conversion stays below it).
        if OVERLAP_PV:
            if Sq > 0:
                # Always true, but opaque to ptxas, which otherwise hoists this wait above the
                # exponentials and so runs the softmax after P V, not under it (perf-notes v6).
                # The other branch differs so that LLVM cannot merge the two.
                acc, p = warpgroup_mma_wait(0, deps=[acc_tok, p])
                p16 = gl.convert_layout(p.to(dtype), p_layout)
                acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            else:
                acc = warpgroup_mma_wait(0, deps=[acc_tok])
                p16 = gl.zeros([BLOCK_M, BLOCK_N], dtype, p_layout)
        else:
            acc, p = warpgroup_mma_wait(0, deps=[acc_tok, p])
            p16 = gl.convert_layout(p.to(dtype), p_layout)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p = p16
        if NUM_STAGES == 2:  # V_{j-1}'s slot: read by P_{j-1} V_{j-1}, retired
            gl.thread_barrier()
            _load_kv(V, v_ring, v_bars, b, hk, j + 1, (j + 1) % 2, j + 1 < n_blocks, BLOCK_N)

    last = (n_blocks - 1) % NUM_STAGES
    mbarrier.wait(v_bars.index(last), ((n_blocks - 1) // NUM_STAGES) & 1)
    if APPEND_KV:
        if (n_blocks - 1 >= own_from) & (n_blocks - 1 < own_to):
            tma.async_copy_shared_to_global(Vout, [b, hk, (n_blocks - 1) * BLOCK_N, 0], v_ring.index(last))
    v_last = v_ring.index(last).reshape([BLOCK_N, BLOCK_D])
    acc = warpgroup_mma(p, v_last, acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[acc])
    if APPEND_KV:  # (each of its blocks first waits for the stores from the ring)
        _append_rest(K, V, Kout, Vout, k_ring, v_ring, k_bars, v_bars, b, hk, gl.maximum(own_from, n_blocks),
                     own_to, n_blocks, Cos, Sin, Sq, rotary_half, max_position, BLOCK_N, BLOCK_D, NUM_STAGES)

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    _epilogue(Y, Lse, q_bar, Call(Sq, Skv, offset, causal, qk_scale, store_lse, Mask),
              Tile(b, h, pid_bh, m0, n_blocks, hi, 0, 0, 0), q_smem, 0, Acc(acc, m_i, l_i), m0, rows, o_layout, 1)
