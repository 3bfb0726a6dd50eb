"""The FlashAttention forward kernel family, the source of truth for every cubin.

One Triton kernel, specialized through constexpr flags (dtype by pointer type, head-dim bucket,
mask kind, whether the mask is one key vector per (batch, head) (MASK_KEYS: its query stride is
0, as a (B, 1, 1, S) padding mask), the "extras" group: windows, softcap and per-batch key
lengths); causal is a run-time flag (it moves loop bounds). It follows ort_flash's op contract
(cpp/flash_params.h): query row i of batch b sits at absolute position i + offset_b and attends
key j when j < key_end_b, causal (j <= pos), windows and the mask allow.

With TMA (sm_90, fp16/bf16, exact head dims 64/128), Q, K, V and Y are host-encoded tensor
descriptors over the logical (B, H, S, D) view instead of pointers: the bulk-copy engine moves
the tiles (no per-thread address math, 128-byte swizzled shared memory), rows past S read as
zeros and stores past S are clipped per (b, h), so a tile never touches another head's rows.
cpp/cuda_launch.cc encodes the maps (cuTensorMapEncodeTiled) from the box and swizzle that
aot/build.py records, and falls back to the pointer variant when a tensor cannot be described.

Program grid: (cdiv(Sq, BLOCK_M), B * Hq). Online softmax with exp2 (log2(e) folded into the
scale unless an additive mask is added), fp32 accumulation, int64 offsets. The key loop runs in
two phases: interior blocks, where every row of the tile sees every key, without per-element
position checks; then the boundary blocks (causal diagonal, window edges, the ragged end) with
them.
"""
import triton
import triton.language as tl

MASK_NONE = tl.constexpr(0)
MASK_BOOL = tl.constexpr(1)
MASK_ADD = tl.constexpr(2)


@triton.jit
def _attend(acc, l_i, m_i, q, k_base, v_base, m_base, start, end, hi, pos, row_ok,
            offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
            scale, cap, cap_on, left, right, kv_b, kv_h,
            BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, MASK_KIND: tl.constexpr,
            EXTRAS: tl.constexpr, DOT_PRECISION: tl.constexpr, BOUNDARY: tl.constexpr,
            TMA: tl.constexpr = False, MASK_KEYS: tl.constexpr = False, CAP_BRANCH: tl.constexpr = False):
    # k_base / v_base: pointers to this (batch, KV head), or with TMA the K / V descriptors,
    # addressed at [kv_b, kv_h, key, 0]. m_base: the mask rows of this tile's queries
    # ([BLOCK_M, 1] pointers), or with MASK_KEYS the one key vector all of them share (a scalar
    # pointer; the mask's query stride is 0, e.g. a (B, 1, 1, S) padding mask).
    # Scores in base-2 units (log2(e) folded into the scale) unless an additive mask is added:
    # then natural units, so a finfo.min mask cannot overflow when rescaled, and log2(e) is
    # applied to differences (s - max) only.
    unit = 1.0 if MASK_KIND == MASK_ADD else 1.4426950408889634
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        if TMA:
            k = k_base.load([kv_b, kv_h, start_n, 0]).reshape(BLOCK_N, offs_d.shape[0])
            v = v_base.load([kv_b, kv_h, start_n, 0]).reshape(BLOCK_N, offs_dv.shape[0])
            if BOUNDARY:
                # Keys in [hi, Skv) are in the tensor and read as stored (a static cache's unused
                # tail may hold anything): their scores become -inf below, and V is zeroed so
                # that p = 0 times a NaN there cannot leak into the sum.
                col_ok = cols < hi
                v = tl.where(col_ok[:, None], v, 0.0)
        elif BOUNDARY:
            col_ok = cols < hi
            if EVEN_D:
                k = tl.load(k_base + cols[:, None].to(tl.int64) * stride_kn + offs_d[None, :],
                            mask=col_ok[:, None], other=0.0)
                v = tl.load(v_base + cols[:, None].to(tl.int64) * stride_vn + offs_dv[None, :],
                            mask=col_ok[:, None], other=0.0)
            else:
                k = tl.load(k_base + cols[:, None].to(tl.int64) * stride_kn + offs_d[None, :],
                            mask=col_ok[:, None] & (offs_d[None, :] < D), other=0.0)
                v = tl.load(v_base + cols[:, None].to(tl.int64) * stride_vn + offs_dv[None, :],
                            mask=col_ok[:, None] & (offs_dv[None, :] < Dv), other=0.0)
        else:
            if EVEN_D:
                k = tl.load(k_base + cols[:, None].to(tl.int64) * stride_kn + offs_d[None, :])
                v = tl.load(v_base + cols[:, None].to(tl.int64) * stride_vn + offs_dv[None, :])
            else:
                k = tl.load(k_base + cols[:, None].to(tl.int64) * stride_kn + offs_d[None, :],
                            mask=offs_d[None, :] < D, other=0.0)
                v = tl.load(v_base + cols[:, None].to(tl.int64) * stride_vn + offs_dv[None, :],
                            mask=offs_dv[None, :] < Dv, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if EXTRAS and CAP_BRANCH:
            # A branch, not a select: without a softcap its exp and divide would sit on every
            # iteration's critical path (decode at one CTA per SM ran 20-25 % slower). The prefill
            # kernel keeps the select (Triton 3.6's software pipeliner rejects its loop with a
            # branch inside, and at several CTAs per SM the cost hides).
            if cap_on:  # c * tanh(x / c) = c * (1 - 2 / (exp(2x / c) + 1)), stable at both ends
                s = cap * (1.0 - 2.0 / (tl.exp(2.0 * s * (scale / cap)) + 1.0)) * unit
            else:
                s = s * (scale * unit)
        elif EXTRAS:
            capped = cap * (1.0 - 2.0 / (tl.exp(2.0 * s * (scale / cap)) + 1.0))
            s = tl.where(cap_on, capped * unit, s * (scale * unit))
        else:
            s = s * (scale * unit)
        if MASK_KIND != MASK_NONE:
            if MASK_KEYS:  # one row of BLOCK_N values instead of a BLOCK_M x BLOCK_N tile
                if BOUNDARY:
                    mv = tl.load(m_base + cols, mask=col_ok, other=0)[None, :]
                else:
                    mv = tl.load(m_base + cols)[None, :]
            elif BOUNDARY:
                mv = tl.load(m_base + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0)
            else:
                mv = tl.load(m_base + cols[None, :], mask=row_ok[:, None], other=0)
            if MASK_KIND == MASK_ADD:
                s = s + mv.to(tl.float32)
            else:
                s = tl.where(mv != 0, s, float("-inf"))
        if BOUNDARY:
            keep = row_ok[:, None] & col_ok[None, :]
            keep = keep & (cols[None, :] <= pos[:, None] + right) & (cols[None, :] >= pos[:, None] - left)
            s = tl.where(keep, s, float("-inf"))

        if MASK_KIND == MASK_NONE and not BOUNDARY:
            # Every score is finite here, so the running max is too.
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            if MASK_KIND == MASK_ADD:
                p = tl.exp2((s - m_safe[:, None]) * 1.4426950408889634)
                alpha = tl.exp2((m_i - m_safe) * 1.4426950408889634)
            else:
                p = tl.exp2(s - m_safe[:, None])
                alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _interior(acc, l_i, m_i, q, k_base, v_base, m_base, start, end, hi, pos, row_ok,
              offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
              scale, cap, cap_on, left, right, kv_b, kv_h,
              BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, MASK_KIND: tl.constexpr,
              EXTRAS: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, MASK_KEYS: tl.constexpr):
    """The interior blocks. Without a softcap (windows and key lengths only move its bounds) an
    extras variant runs the loop of the variant without extras, so such a call does not pay the
    capped scores' exp and divide that _attend's select computes for every score."""
    if EXTRAS and not cap_on:
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, m_base, start, end, hi, pos, row_ok,
                                offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
                                scale, cap, cap_on, left, right, kv_b, kv_h,
                                BLOCK_N, EVEN_D, MASK_KIND, False, DOT_PRECISION, False, TMA, MASK_KEYS)
    else:
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, m_base, start, end, hi, pos, row_ok,
                                offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
                                scale, cap, cap_on, left, right, kv_b, kv_h,
                                BLOCK_N, EVEN_D, MASK_KIND, EXTRAS, DOT_PRECISION, False, TMA, MASK_KEYS)
    return acc, l_i, m_i


@triton.jit
def _visibility(SeqlensK, b, Sq, Skv, offset, causal, window_left, window_right, mask_len,
                has_seqlens, softcap, row_lo, row_hi,
                BLOCK_N: tl.constexpr, MASK_KIND: tl.constexpr, EXTRAS: tl.constexpr):
    """Batch b's visibility limits for a block of query rows [row_lo, row_hi]: key j is seen by
    the row at position pos (= row + off) iff lo <= j < hi and pos - left <= j <= pos + right.
    Also the interior [lo_full, hi_full), BLOCK_N-aligned blocks every row of the block sees
    whole, and the softcap (cap, cap_on)."""
    key_end = Skv
    off = offset
    right = tl.where(causal != 0, 0, 1 << 30)
    left = 1 << 30
    cap = 1.0
    cap_on = False
    if EXTRAS:
        if has_seqlens != 0:
            nonpad = tl.load(SeqlensK + b).to(tl.int32)
            key_end = tl.minimum(key_end, nonpad)
            off = nonpad - Sq
        right = tl.minimum(right, tl.where(window_right >= 0, window_right, 1 << 30))
        left = tl.where(window_left >= 0, window_left, 1 << 30)
        cap = tl.where(softcap > 0, softcap, 1.0)
        cap_on = softcap > 0
    if MASK_KIND != MASK_NONE:
        key_end = tl.minimum(key_end, mask_len)
    pos_lo = row_lo + off
    pos_hi = row_hi + off
    hi = tl.minimum(key_end, pos_hi + right + 1)
    lo = tl.maximum(0, pos_lo - left)
    lo = (lo // BLOCK_N) * BLOCK_N
    hi = tl.maximum(hi, lo)
    lo_full = tl.minimum(tl.maximum(lo, ((pos_hi - left + BLOCK_N - 1) // BLOCK_N) * BLOCK_N), hi)
    hi_full = lo_full + tl.maximum(tl.minimum(key_end, pos_lo + right + 1) - lo_full, 0) // BLOCK_N * BLOCK_N
    return off, left, right, cap, cap_on, lo, hi, lo_full, hi_full


@triton.jit
def flash_fwd(
    Q, K, V, Y, Lse, Mask, SeqlensK,
    scale, softcap,
    Hq, group, Sq, Skv, D, Dv, offset, causal, window_left, window_right, mask_len, has_seqlens,
    store_lse,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_yb, stride_yh, stride_ym,
    stride_mb, stride_mh, stride_mm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_D: tl.constexpr, MASK_KIND: tl.constexpr, EXTRAS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr = False, MASK_KEYS: tl.constexpr = False,
    EDGE_LOOP: tl.constexpr = False,
):
    # Query blocks in reverse: under a causal mask the last blocks see the most keys, so they start
    # first and the short ones fill the tail of the grid (no effect without causal).
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // Hq
    h = pid_bh % Hq
    hk = h // group

    b64 = b.to(tl.int64)
    if TMA:  # descriptors, addressed by (b, head, row, 0)
        k_base = K
        v_base = V
    else:
        q_base = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh
        k_base = K + b64 * stride_kb + hk.to(tl.int64) * stride_kh
        v_base = V + b64 * stride_vb + hk.to(tl.int64) * stride_vh
        y_base = Y + b64 * stride_yb + h.to(tl.int64) * stride_yh

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)

    off, left, right, cap, cap_on, lo, hi, lo_full, hi_full = _visibility(
        SeqlensK, b, Sq, Skv, offset, causal, window_left, window_right, mask_len, has_seqlens,
        softcap, pid_m * BLOCK_M, tl.minimum((pid_m + 1) * BLOCK_M, Sq) - 1, BLOCK_N, MASK_KIND, EXTRAS)

    row_ok = offs_m < Sq
    if TMA:
        q = Q.load([b, h, pid_m * BLOCK_M, 0]).reshape(BLOCK_M, BLOCK_D)
    elif EVEN_D:
        q = tl.load(q_base + offs_m[:, None].to(tl.int64) * stride_qm + offs_d[None, :],
                    mask=row_ok[:, None], other=0.0)
    else:
        q = tl.load(q_base + offs_m[:, None].to(tl.int64) * stride_qm + offs_d[None, :],
                    mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    pos = offs_m + off
    m_base = Mask + b64 * stride_mb + h.to(tl.int64) * stride_mh
    if not MASK_KEYS:
        m_base = m_base + offs_m[:, None].to(tl.int64) * stride_mm

    if EDGE_LOOP:
        # Shapes compiled as superset variants (aot/variants.py edge_loop): the interior, then both
        # boundary ranges through one compiled loop, for about half the code to compile; the
        # same scores, summed in another order.
        acc, l_i, m_i = _interior(acc, l_i, m_i, q, k_base, v_base, m_base, lo_full, hi_full, hi, pos,
                                  row_ok, offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
                                  scale, cap, cap_on, left, right, b, hk,
                                  BLOCK_N, EVEN_D, MASK_KIND, EXTRAS, DOT_PRECISION, TMA, MASK_KEYS)
        for edge in range(2):
            e_lo = tl.where(edge == 0, lo, hi_full)
            e_hi = tl.where(edge == 0, lo_full, hi)
            acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, m_base, e_lo, e_hi, hi, pos,
                                    row_ok, offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
                                    scale, cap, cap_on, left, right, b, hk,
                                    BLOCK_N, EVEN_D, MASK_KIND, EXTRAS, DOT_PRECISION, True, TMA, MASK_KEYS)
    else:
        # Left edge, interior, right edge (causal diagonal, window, ragged end).
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, m_base, lo, lo_full, hi, pos, row_ok,
                                offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
                                scale, cap, cap_on, left, right, b, hk,
                                BLOCK_N, EVEN_D, MASK_KIND, EXTRAS, DOT_PRECISION, True, TMA, MASK_KEYS)
        acc, l_i, m_i = _interior(acc, l_i, m_i, q, k_base, v_base, m_base, lo_full, hi_full, hi, pos,
                                  row_ok, offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
                                  scale, cap, cap_on, left, right, b, hk,
                                  BLOCK_N, EVEN_D, MASK_KIND, EXTRAS, DOT_PRECISION, TMA, MASK_KEYS)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, m_base, hi_full, hi, hi, pos, row_ok,
                                offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
                                scale, cap, cap_on, left, right, b, hk,
                                BLOCK_N, EVEN_D, MASK_KIND, EXTRAS, DOT_PRECISION, True, TMA, MASK_KEYS)

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    if TMA:  # rows past Sq are clipped by the copy engine
        Y.store([b, h, pid_m * BLOCK_M, 0], out.to(Y.dtype).reshape(1, 1, BLOCK_M, BLOCK_DV))
    elif EVEN_D:
        y_ptrs = y_base + offs_m[:, None].to(tl.int64) * stride_ym + offs_dv[None, :]
        tl.store(y_ptrs, out.to(Y.dtype.element_ty), mask=row_ok[:, None])
    else:
        y_ptrs = y_base + offs_m[:, None].to(tl.int64) * stride_ym + offs_dv[None, :]
        tl.store(y_ptrs, out.to(Y.dtype.element_ty), mask=row_ok[:, None] & (offs_dv[None, :] < Dv))
    if store_lse != 0:
        if MASK_KIND == MASK_ADD:
            lse = m_i + tl.log(l_safe)
        else:
            lse = (m_i + tl.log2(l_safe)) * 0.6931471805599453
        lse = tl.where(l_i == 0.0, float("-inf"), lse)
        tl.store(Lse + pid_bh.to(tl.int64) * Sq + offs_m, lse, mask=row_ok)
