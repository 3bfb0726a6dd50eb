"""Split-KV ("Flash-Decoding") kernels for few query rows against a long KV cache.

Decode is bound by reading K and V. The prefill kernel (flash_fwd.py) gives one CTA per
(query block, query head): at Sq = 1 that is B * Hq CTAs, too few to fill the GPU, each reading
its KV head alone (a GQA group reads the same K/V Hq / Hkv times). Here:

- **GQA packing**: one CTA owns a KV head and stacks the rows of every query head of its group
  (row r is query head hk * group + r % group, query r // group), so K/V are read once per group.
- **Split KV**: the key range a row block sees is cut into `num_splits` BLOCK_N-aligned chunks,
  one CTA each (grid: (num_splits, B * Hkv, cdiv(group * Sq, BLOCK_M))). Each writes its partial
  softmax-normalized output and natural-log LSE in fp32, merged with the online-softmax
  rescaling. With one split the partial is final and is written directly.
- **The merge**: with `fused` set, in the split kernel itself: each CTA counts its arrival on
  its row block's counter (`Counter`, one int32 per (b, KV head, row block)), and the CTA that
  arrives last merges every split's partial, in split order (so the result does not depend on
  which CTA is last), writes Y and Lse and resets the counter to zero for the next launch. The
  counters must be zero at launch and no two launches may use them at once: the launcher keeps
  one set per CUDA stream (cpp/cuda_launch.cc). Without `fused`, `flash_decode_combine` merges
  them in a second launch.

The scoring, masks, windows, softcap, per-batch key lengths and fully masked rows follow
flash_fwd.py exactly (it is the same `_attend` loop); only the row mapping and the key range
differ. Same op contract: cpp/flash_params.h.
"""
import triton
import triton.language as tl

from .contract import MERGE_TALL, MERGE_WIDE
from .flash_fwd import MASK_ADD, _attend, _visibility


@triton.jit
def flash_decode_split(
    Q, K, V, Y, Lse, Mask, SeqlensK, OPart, LsePart, Counter,
    scale, softcap,
    Hq, group, Sq, Skv, D, Dv, offset, causal, window_left, window_right, mask_len, has_seqlens,
    store_lse, num_splits, fused,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_yb, stride_yh, stride_ym,
    stride_mb, stride_mh, stride_mm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_D: tl.constexpr, MASK_KIND: tl.constexpr, EXTRAS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PDL: tl.constexpr = 0, EDGE_LOOP: tl.constexpr = False,
):
    # PDL, programmatic dependent launch (sm_90+): 1 waits for the grid before it on the stream
    # (griddepcontrol.wait) before touching memory, so the launcher may start this grid while
    # that one drains (the AOT build's level on sm_90+, aot/build.py decode_pdl; the wait returns
    # at once when not launched so); 2 also lets the next PDL grid launch at once (tried in
    # lab/experiments/decode_floor.py, not built: its waiting CTAs hold SM slots; perf-notes decode v7).
    if PDL >= 1:
        tl.extra.cuda.gdc_wait()
    if PDL >= 2:
        tl.extra.cuda.gdc_launch_dependents()
    split = tl.program_id(0)
    pid_bk = tl.program_id(1)
    pid_m = tl.program_id(2)
    Hkv = Hq // group
    b = pid_bk // Hkv
    hk = pid_bk % Hkv
    b64 = b.to(tl.int64)

    # Packed rows: r -> (query head hk * group + r % group, query row r // group).
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_rows = group * Sq
    row_ok = rows < n_rows
    g = rows % group
    s_row = rows // group
    h = hk * group + g
    h64 = h.to(tl.int64)
    s64 = s_row.to(tl.int64)

    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k_base = K + b64 * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + hk.to(tl.int64) * stride_vh

    # Rows are ordered by query position, so the block's query rows span [row_lo, row_hi].
    off, left, right, cap, cap_on, lo, hi, lo_full, hi_full = _visibility(
        SeqlensK, b, Sq, Skv, offset, causal, window_left, window_right, mask_len, has_seqlens,
        softcap, (pid_m * BLOCK_M) // group, (tl.minimum((pid_m + 1) * BLOCK_M, n_rows) - 1) // group,
        BLOCK_N, MASK_KIND, EXTRAS)

    # This split's share of [lo, hi): BLOCK_N-aligned chunks, so interior blocks stay aligned.
    chunk = tl.cdiv(tl.cdiv(hi - lo, num_splits), BLOCK_N) * BLOCK_N
    c_lo = tl.minimum(lo + split * chunk, hi)
    c_hi = tl.minimum(c_lo + chunk, hi)
    f_lo = tl.minimum(tl.maximum(lo_full, c_lo), c_hi)
    f_hi = tl.maximum(tl.minimum(hi_full, c_hi), f_lo)

    q_ptrs = Q + b64 * stride_qb + h64[:, None] * stride_qh + s64[:, None] * stride_qm + offs_d[None, :]
    if EVEN_D:
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    else:
        q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    pos = s_row + off
    m_base = Mask + b64 * stride_mb + h64[:, None] * stride_mh + s64[:, None] * stride_mm

    if EDGE_LOOP:
        # Shapes compiled as superset variants (aot/variants.py edge_loop): the interior, then both
        # boundary ranges through one compiled loop (each only where this chunk has it), for
        # about half the code to compile; the same scores, summed in another order.
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, m_base, f_lo, f_hi, c_hi, pos, row_ok,
                                offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
                                scale, cap, cap_on, left, right, 0, 0,
                                BLOCK_N, EVEN_D, MASK_KIND, EXTRAS, DOT_PRECISION, False, CAP_BRANCH=True)
        for edge in range(2):
            e_lo = tl.where(edge == 0, c_lo, f_hi)
            e_hi = tl.where(edge == 0, f_lo, c_hi)
            if e_hi > e_lo:
                acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, m_base, e_lo, e_hi, c_hi, pos,
                                        row_ok, offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
                                        scale, cap, cap_on, left, right, 0, 0, BLOCK_N, EVEN_D,
                                        MASK_KIND, EXTRAS, DOT_PRECISION, True, CAP_BRANCH=True)
    else:
        # The boundary blocks (a window's edges, the ragged end) only where this chunk has them: an
        # empty pipelined loop still runs its prologue and drain, ~0.7 us each at one CTA per SM
        # (lab/experiments/decode_floor.py: B1 4k 10.2 -> 8.6 us without them).
        if f_lo > c_lo:
            acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, m_base, c_lo, f_lo, c_hi, pos, row_ok,
                                    offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
                                    scale, cap, cap_on, left, right, 0, 0,
                                    BLOCK_N, EVEN_D, MASK_KIND, EXTRAS, DOT_PRECISION, True, CAP_BRANCH=True)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, m_base, f_lo, f_hi, c_hi, pos, row_ok,
                                offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
                                scale, cap, cap_on, left, right, 0, 0,
                                BLOCK_N, EVEN_D, MASK_KIND, EXTRAS, DOT_PRECISION, False, CAP_BRANCH=True)
        if c_hi > f_hi:
            acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, m_base, f_hi, c_hi, c_hi, pos, row_ok,
                                    offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
                                    scale, cap, cap_on, left, right, 0, 0,
                                    BLOCK_N, EVEN_D, MASK_KIND, EXTRAS, DOT_PRECISION, True, CAP_BRANCH=True)

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    if MASK_KIND == MASK_ADD:
        lse = m_i + tl.log(l_safe)
    else:
        lse = (m_i + tl.log2(l_safe)) * 0.6931471805599453
    lse = tl.where(l_i == 0.0, float("-inf"), lse)
    # Flat row id over (B, Hq, Sq), the layout of Lse and of the partials.
    flat = (b64 * Hq + h64) * Sq + s64
    dv_ok = offs_dv[None, :] < Dv
    if num_splits == 1:
        y_ptrs = Y + b64 * stride_yb + h64[:, None] * stride_yh + s64[:, None] * stride_ym + offs_dv[None, :]
        if EVEN_D:
            tl.store(y_ptrs, out.to(Y.dtype.element_ty), mask=row_ok[:, None])
        else:
            tl.store(y_ptrs, out.to(Y.dtype.element_ty), mask=row_ok[:, None] & dv_ok)
        if store_lse != 0:
            tl.store(Lse + flat, lse, mask=row_ok)
    else:
        part = flat * num_splits + split
        # Row stride Dv (== BLOCK_DV when EVEN_D: a constant, so the accesses vectorize).
        part_dv = BLOCK_DV if EVEN_D else Dv
        o_ok = row_ok[:, None] if EVEN_D else row_ok[:, None] & dv_ok
        tl.store(OPart + part[:, None] * part_dv + offs_dv[None, :], out, mask=o_ok)
        tl.store(LsePart + part, lse, mask=row_ok)
        if fused != 0:
            # Every thread's partial stores are issued before the arrival (the barrier), and the
            # arrival releases them at GPU scope; the last CTA's arrival acquires everyone's.
            tl.debug_barrier()
            counter = Counter + pid_bk * tl.num_programs(2) + pid_m
            arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == num_splits - 1:
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
                row_lo = pid_m * BLOCK_M
                row_hi = tl.minimum((pid_m + 1) * BLOCK_M, n_rows)
                # The tile with fewer dependent L2 round trips (merge_tile; the launcher fuses
                # only where that is at most kMaxFusedRoundTrips).
                n_blk = row_hi - row_lo
                if tl.cdiv(n_blk, MERGE_TALL_M) * tl.cdiv(num_splits, MERGE_TALL_S) < \
                        tl.cdiv(n_blk, MERGE_WIDE_M) * tl.cdiv(num_splits, MERGE_WIDE_S):
                    _merge_splits(OPart, LsePart, Y, Lse, b64, hk, group, Hq, Sq, row_lo, row_hi, offs_dv,
                                  part_dv, num_splits, store_lse, stride_yb, stride_yh, stride_ym, EVEN_D,
                                  MERGE_TALL_M, MERGE_TALL_S)
                else:
                    _merge_splits(OPart, LsePart, Y, Lse, b64, hk, group, Hq, Sq, row_lo, row_hi, offs_dv,
                                  part_dv, num_splits, store_lse, stride_yb, stride_yh, stride_ym, EVEN_D,
                                  MERGE_WIDE_M, MERGE_WIDE_S)


# The fused merge's tiles, packed rows x splits (aot/contract.py MERGE_WIDE, MERGE_TALL: the
# launcher's merge_round_trips counts with them too).
MERGE_WIDE_M = tl.constexpr(MERGE_WIDE[0])
MERGE_WIDE_S = tl.constexpr(MERGE_WIDE[1])
MERGE_TALL_M = tl.constexpr(MERGE_TALL[0])
MERGE_TALL_S = tl.constexpr(MERGE_TALL[1])


def _merge_trips(rows: int, splits: int, tile: tuple[int, int]) -> int:
    return -(-rows // tile[0]) * -(-splits // tile[1])


def merge_tile(rows: int, splits: int) -> tuple[int, int]:
    """The tile (packed rows, splits) flash_decode_split's fused merge takes for a row block of
    `rows` packed rows: the one with fewer dependent L2 round trips, the wide one on a tie. The
    kernel states it inline (a jit helper would change its SASS); tests/test_kernel_interpreter.py
    holds the kernel's choice to this one."""
    return MERGE_TALL if _merge_trips(rows, splits, MERGE_TALL) < _merge_trips(rows, splits, MERGE_WIDE) else MERGE_WIDE


def merge_round_trips(rows: int, splits: int) -> int:
    """Dependent L2 round trips of the fused merge of one row block of `rows` packed rows, at the
    tile the kernel picks (cpp/decode_heuristics.cc counts the same with the generated constants;
    tests/test_aot_table.py holds the launcher's decision to this one)."""
    return _merge_trips(rows, splits, merge_tile(rows, splits))


@triton.jit
def _merge_splits(OPart, LsePart, Y, Lse, b64, hk, group, Hq, Sq, row_lo, row_hi, offs_dv,
                  Dv, num_splits, store_lse, stride_yb, stride_yh, stride_ym, EVEN_D: tl.constexpr,
                  MERGE_M: tl.constexpr, MERGE_S: tl.constexpr):
    """Y = sum_i w_i O_i / sum_i w_i, w_i = exp(lse_i - max), over the splits, for the packed rows
    [row_lo, row_hi) of one block (the fused merge; flash_decode_combine computes the same per
    row). MERGE_M rows x MERGE_S splits of partials are loaded at once, so up to MERGE_S splits
    cost one L2 round trip per MERGE_M rows (more splits: one per MERGE_S, rescaled online). The
    row tiles run one after another: each is a dependent round trip. The partials come from
    other SMs, so they are read from L2 (.cg), never a stale L1 line. The sum's order is fixed by
    the tile, not by which CTA merges."""
    offs_r = tl.arange(0, MERGE_M)
    offs_s = tl.arange(0, MERGE_S)
    dv_ok = offs_dv < Dv
    for r0 in tl.range(row_lo, row_hi, MERGE_M, num_stages=1):
        rows = r0 + offs_r
        ok = rows < row_hi
        h64 = (hk * group + rows % group).to(tl.int64)
        s64 = (rows // group).to(tl.int64)
        flat = (b64 * Hq + h64) * Sq + s64
        m = tl.full([MERGE_M], float("-inf"), dtype=tl.float32)
        wsum = tl.zeros([MERGE_M], dtype=tl.float32)
        acc = tl.zeros([MERGE_M, offs_dv.shape[0]], dtype=tl.float32)
        for s0 in tl.range(0, num_splits, MERGE_S, num_stages=1):
            part = flat[:, None] * num_splits + (s0 + offs_s)[None, :]
            p_ok = ok[:, None] & ((s0 + offs_s) < num_splits)[None, :]
            ls = tl.load(LsePart + part, mask=p_ok, other=float("-inf"), cache_modifier=".cg")
            o_ok = p_ok[:, :, None] if EVEN_D else p_ok[:, :, None] & dv_ok[None, :]
            o = tl.load(OPart + part[:, :, None] * Dv + offs_dv[None, None, :], mask=o_ok, other=0.0,
                        cache_modifier=".cg")
            m_new = tl.maximum(m, tl.max(ls, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m - m_safe)
            w = tl.exp(ls - m_safe[:, None])
            acc = acc * alpha[:, None] + tl.sum(o * w[:, :, None], 1)
            wsum = wsum * alpha + tl.sum(w, 1)
            m = m_new
        out = acc / tl.where(wsum == 0.0, 1.0, wsum)[:, None]
        y_ptrs = Y + b64 * stride_yb + h64[:, None] * stride_yh + s64[:, None] * stride_ym + offs_dv[None, :]
        tl.store(y_ptrs, out.to(Y.dtype.element_ty), mask=ok[:, None] if EVEN_D else ok[:, None] & dv_ok[None, :])
        if store_lse != 0:
            m_safe = tl.where(m == float("-inf"), 0.0, m)
            tl.store(Lse + flat, tl.where(wsum == 0.0, float("-inf"), m_safe + tl.log(wsum)), mask=ok)


@triton.jit
def flash_decode_combine(
    OPart, LsePart, Y, Lse,
    Hq, Sq, Dv, num_splits, store_lse,
    stride_yb, stride_yh, stride_ym,
    BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """One program per output row (b, h, s): Y = sum_i w_i O_i / sum_i w_i, w_i = exp(lse_i - max)."""
    row = tl.program_id(0).to(tl.int64)
    s = row % Sq
    bh = row // Sq
    h = bh % Hq
    b = bh // Hq
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < Dv
    base = row * num_splits

    m = tl.full([BLOCK_S], float("-inf"), dtype=tl.float32)
    for start in range(0, num_splits, BLOCK_S):
        lse = tl.load(LsePart + base + start + offs_s, mask=start + offs_s < num_splits,
                      other=float("-inf"))
        m = tl.maximum(m, lse)
    m_all = tl.max(m, 0)
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    wsum = tl.zeros([BLOCK_S], dtype=tl.float32)
    for start in range(0, num_splits, BLOCK_S):
        idx = start + offs_s
        ok = idx < num_splits
        lse = tl.load(LsePart + base + idx, mask=ok, other=float("-inf"))
        w = tl.exp(lse - m_safe)
        o = tl.load(OPart + (base + idx)[:, None] * Dv + offs_dv[None, :],
                    mask=ok[:, None] & dv_ok[None, :], other=0.0)
        acc += tl.sum(w[:, None] * o, 0)
        wsum += w
    total = tl.sum(wsum, 0)
    out = acc / tl.where(total == 0.0, 1.0, total)
    y_ptrs = Y + b * stride_yb + h * stride_yh + s * stride_ym + offs_dv
    tl.store(y_ptrs, out.to(Y.dtype.element_ty), mask=dv_ok)
    if store_lse != 0:
        lse_all = tl.where(total == 0.0, float("-inf"), m_safe + tl.log(total))
        tl.store(Lse + row, lse_all)
