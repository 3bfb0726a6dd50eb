"""The warp-specialized Hopper (sm_90) FlashAttention forward kernel in Gluon: FlashAttention-3's
CTA layout (a TMA producer warp, two consumer warpgroups sharing one K/V ring) in our own code.

Same parameters and op contract as flash_fwd and flash_fwd_gluon (cpp/flash_params.h): query row i
sits at absolute position i + offset and, under causal, sees keys j <= i + offset (bottom-right);
a row that sees no key gives 0 and lse -inf. It takes what flash_fwd_gluon takes: fp16/bf16,
D == Dv in {64, 128}, no mask, no extras (those arguments are ignored).

One CTA owns BLOCK_M query rows of one (batch, head): two consumer warpgroups of BLOCK_M / 2 rows
each (the default partition and worker 0), and a one-warp producer (worker 1, few registers) that
loads Q once and streams K_j, V_j through NUM_STAGES-deep rings. Each slot has a `ready` barrier
(TMA bytes landed) and an `empty` barrier that both consumers arrive on once their wgmma has read
it; no CTA-wide barrier in the loop. A consumer issues S_j = Q K_j^T and P_{j-1} V_{j-1} back to
back as async wgmma groups, retires S_j, runs the softmax of block j while P V is in flight, then
retires P V. With PINGPONG the two consumers take turns issuing their GEMMs (two mbarriers), so
one's softmax runs under the other's tensor-core work (FA3's inter-warpgroup schedule).

Q and Y are TMA descriptors with a (1, 1, BLOCK_M / 2, D) box, K and V (1, 1, BLOCK_N, D); grid
(cdiv(Sq, BLOCK_M), B * Hq), query blocks in reverse so the longest causal blocks start first.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from flash_fwd_gluon import LN2, LOG2E, _softmax, desc_layout, desc_signature  # noqa: F401

CONSUMER_WARPS = gl.constexpr(4)  # one warpgroup: wgmma's M is 64 rows per warpgroup


def get_ws_config(dtype: str, head_dim: int, causal: bool) -> dict:
    """Tile table (perf-notes "prefill v7"): d128 two consumers of 64 rows, BLOCK_N 128, two
    slots (164 KB); d64 three consumers (192 rows), three slots (123 KB). Registers: 168 a thread
    outside the partitions (12 or 16 warps, one CTA per SM), 240 or 160 per consumer, 24 for the
    producer."""
    del dtype, causal
    if head_dim == 128:
        return dict(BLOCK_M=128, BLOCK_N=128, NUM_STAGES=2, num_warps=int(CONSUMER_WARPS), maxnreg=168,
                    NUM_CONSUMERS=2, CONSUMER_REGS=240, PINGPONG=True)
    return dict(BLOCK_M=192, BLOCK_N=128, NUM_STAGES=3, num_warps=int(CONSUMER_WARPS), maxnreg=128,
                NUM_CONSUMERS=3, CONSUMER_REGS=160, PINGPONG=True)


def desc_rows(cfg: dict) -> tuple:
    """The box rows of the Q, K, V and Y descriptors for a tile."""
    half = cfg["BLOCK_M"] // cfg.get("NUM_CONSUMERS", 2)
    return half, cfg["BLOCK_N"], cfg["BLOCK_N"], half


@gluon.jit
def _producer(Q, K, V, q_smem, k_ring, v_ring, q_bars, k_ready, v_ready, k_empty, v_empty,
              b, h, hk, m0, n_blocks,
              WG_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, NC: gl.constexpr):
    for w in gl.static_range(NC):
        mbarrier.expect(q_bars.index(w), Q.block_type.nbytes)
        tma.async_copy_global_to_shared(Q, [b, h, m0 + w * WG_M, 0], q_bars.index(w), q_smem.index(w))
    for j in range(n_blocks):
        st = j % NUM_STAGES
        phase = (j // NUM_STAGES) & 1
        # A fresh barrier counts as having completed the phase before 0: the first round passes.
        mbarrier.wait(k_empty.index(st), phase ^ 1)
        mbarrier.expect(k_ready.index(st), K.block_type.nbytes)
        tma.async_copy_global_to_shared(K, [b, hk, j * BLOCK_N, 0], k_ready.index(st), k_ring.index(st))
        mbarrier.wait(v_empty.index(st), phase ^ 1)
        mbarrier.expect(v_ready.index(st), V.block_type.nbytes)
        tma.async_copy_global_to_shared(V, [b, hk, j * BLOCK_N, 0], v_ready.index(st), v_ring.index(st))


@gluon.jit
def _consumer(Y, Lse, q_smem, k_ring, v_ring, q_bars, k_ready, v_ready, k_empty, v_empty, turns,
              b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse,
              WG: gl.constexpr, WG_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
              NUM_STAGES: gl.constexpr, PINGPONG: gl.constexpr, NC: gl.constexpr):
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
    q_slot = q_smem.index(WG)
    q = q_slot.reshape([WG_M, BLOCK_D])
    s_zero = gl.zeros([WG_M, BLOCK_N], gl.float32, s_layout)

    mbarrier.wait(q_bars.index(WG), 0)
    mbarrier.wait(k_ready.index(0), 0)
    k0 = k_ring.index(0).reshape([BLOCK_N, BLOCK_D]).permute((1, 0))
    s = warpgroup_mma(q, k0, s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=[s])
    mbarrier.arrive(k_empty.index(0))
    m_i = gl.full([WG_M], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([WG_M], gl.float32, row_layout)
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, 0, mask_from, hi, pos, qk_scale, s_layout, BLOCK_N)
    p = gl.convert_layout(p.to(dtype), p_layout)

    acc = gl.zeros([WG_M, BLOCK_D], gl.float32, o_layout)
    for j in range(1, n_blocks):
        st = j % NUM_STAGES
        prev = (j - 1) % NUM_STAGES
        mbarrier.wait(k_ready.index(st), (j // NUM_STAGES) & 1)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // NUM_STAGES) & 1)
        if PINGPONG:
            # Round robin: turn i of consumer 0 follows the last consumer's turn i - 1, turn i of
            # consumer c > 0 follows consumer c - 1's turn i (a fresh barrier reads as having
            # completed the phase before 0, so consumer 0 starts).
            mbarrier.wait(turns.index(WG), ((j - 1) & 1) ^ (1 if WG == 0 else 0))
        k_j = k_ring.index(st).reshape([BLOCK_N, BLOCK_D]).permute((1, 0))
        s_tok = warpgroup_mma(q, k_j, s_zero, use_acc=False, is_async=True)
        v_prev = v_ring.index(prev).reshape([BLOCK_N, BLOCK_D])
        acc_tok = warpgroup_mma(p, v_prev, acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turns.index((WG + 1) % NC))
        s = warpgroup_mma_wait(1, deps=[s_tok])
        mbarrier.arrive(k_empty.index(st))
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, j * BLOCK_N, mask_from, hi, pos, qk_scale,
                                      s_layout, BLOCK_N)
        acc, p = warpgroup_mma_wait(0, deps=[acc_tok, p])
        mbarrier.arrive(v_empty.index(prev))
        p = gl.convert_layout(p.to(dtype), p_layout)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]

    last = (n_blocks - 1) % NUM_STAGES
    mbarrier.wait(v_ready.index(last), ((n_blocks - 1) // NUM_STAGES) & 1)
    v_last = v_ring.index(last).reshape([BLOCK_N, BLOCK_D])
    acc = warpgroup_mma(p, v_last, acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[acc])

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


@gluon.jit
def _consumer1(Y, Lse, q_smem, k_ring, v_ring, q_bars, k_ready, v_ready, k_empty, v_empty, turns,
               b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse,
               WG_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
               NUM_STAGES: gl.constexpr, PINGPONG: gl.constexpr, NC: gl.constexpr):
    _consumer(Y, Lse, q_smem, k_ring, v_ring, q_bars, k_ready, v_ready, k_empty, v_empty, turns,
              b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse,
              1, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC)


@gluon.jit
def _consumer2(Y, Lse, q_smem, k_ring, v_ring, q_bars, k_ready, v_ready, k_empty, v_empty, turns,
               b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse,
               WG_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
               NUM_STAGES: gl.constexpr, PINGPONG: gl.constexpr, NC: gl.constexpr):
    _consumer(Y, Lse, q_smem, k_ring, v_ring, q_bars, k_ready, v_ready, k_empty, v_empty, turns,
              b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse,
              2, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC)


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
):
    gl.static_assert(gl.num_warps() == CONSUMER_WARPS, "the default partition is one consumer warpgroup")
    gl.static_assert((NUM_CONSUMERS == 2) | (NUM_CONSUMERS == 3), "two or three consumer warpgroups")
    NC: gl.constexpr = NUM_CONSUMERS
    WG_M: gl.constexpr = BLOCK_M // NUM_CONSUMERS
    dtype: gl.constexpr = Q.dtype

    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // Hq
    h = pid_bh % Hq
    hk = h // group
    m0 = pid_m * BLOCK_M

    # Keys the CTA sees: [0, hi). Both consumers run every block (the upper one masks the tail of
    # the diagonal), so the two stay in step on the ring and the turns.
    row_hi = gl.minimum(m0 + BLOCK_M, Sq) - 1
    hi = Skv
    if causal != 0:
        hi = gl.minimum(Skv, row_hi + offset + 1)
    n_blocks = gl.maximum(gl.cdiv(hi, BLOCK_N), 1)
    qk_scale = scale * LOG2E

    q_smem = gl.allocate_shared_memory(dtype, [NC, 1, 1, WG_M, BLOCK_D], Q.layout)
    k_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_N, BLOCK_D], K.layout)
    v_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_N, BLOCK_D], V.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NC):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(turns.index(i), count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=NC)  # one arrival per consumer warpgroup
        mbarrier.init(v_empty.index(i), count=NC)
    fence_async_shared()

    # The partitions (the first is the default one); list literals, as warp_specialize needs.
    if NC == 2:
        gl.warp_specialize([
            (_consumer, (Y, Lse, q_smem, k_ring, v_ring, q_bars, k_ready, v_ready, k_empty, v_empty, turns,
                      b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, 0, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC)),
            (_consumer1, (Y, Lse, q_smem, k_ring, v_ring, q_bars, k_ready, v_ready, k_empty, v_empty, turns,
                      b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC)),
            (_producer, (Q, K, V, q_smem, k_ring, v_ring, q_bars, k_ready, v_ready, k_empty, v_empty,
                         b, h, hk, m0, n_blocks, WG_M, BLOCK_N, NUM_STAGES, NC)),
        ], [CONSUMER_WARPS, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([
            (_consumer, (Y, Lse, q_smem, k_ring, v_ring, q_bars, k_ready, v_ready, k_empty, v_empty, turns,
                      b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, 0, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC)),
            (_consumer1, (Y, Lse, q_smem, k_ring, v_ring, q_bars, k_ready, v_ready, k_empty, v_empty, turns,
                      b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC)),
            (_consumer2, (Y, Lse, q_smem, k_ring, v_ring, q_bars, k_ready, v_ready, k_empty, v_empty, turns,
                      b, h, pid_bh, m0, Sq, Skv, offset, causal, n_blocks, hi, qk_scale, store_lse, WG_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, NC)),
            (_producer, (Q, K, V, q_smem, k_ring, v_ring, q_bars, k_ready, v_ready, k_empty, v_empty,
                         b, h, hk, m0, n_blocks, WG_M, BLOCK_N, NUM_STAGES, NC)),
        ], [CONSUMER_WARPS, CONSUMER_WARPS, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])

    for i in gl.static_range(NC):
        mbarrier.invalidate(q_bars.index(i))
        mbarrier.invalidate(turns.index(i))
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(k_ready.index(i))
        mbarrier.invalidate(v_ready.index(i))
        mbarrier.invalidate(k_empty.index(i))
        mbarrier.invalidate(v_empty.index(i))
