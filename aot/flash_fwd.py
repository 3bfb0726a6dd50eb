"""The FlashAttention forward kernel family, the source of truth for every cubin.

One Triton kernel, specialized through constexpr flags (dtype by pointer type, head-dim bucket,
mask kind, the "extras" group: windows, softcap and per-batch key lengths); causal is a run-time
flag (it moves loop bounds). It follows ort_flash's op contract (cpp/flash_params.h): query row
i of batch b sits at absolute position i + offset_b and attends key j when j < key_end_b, causal
(j <= pos), windows and the mask allow.

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
            scale, cap, cap_on, left, right,
            BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, MASK_KIND: tl.constexpr,
            EXTRAS: tl.constexpr, DOT_PRECISION: tl.constexpr, BOUNDARY: tl.constexpr):
    # Scores in base-2 units (log2(e) folded into the scale) unless an additive mask is added:
    # then natural units, so a finfo.min mask cannot overflow when rescaled, and log2(e) is
    # applied to differences (s - max) only.
    unit = 1.0 if MASK_KIND == MASK_ADD else 1.4426950408889634
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        if BOUNDARY:
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
        if EXTRAS:
            # c * tanh(x / c) = c * (1 - 2 / (exp(2x / c) + 1)), stable at both ends.
            capped = cap * (1.0 - 2.0 / (tl.exp(2.0 * s * (scale / cap)) + 1.0))
            s = tl.where(cap_on, capped * unit, s * (scale * unit))
        else:
            s = s * (scale * unit)
        if MASK_KIND != MASK_NONE:
            if BOUNDARY:
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
    DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // Hq
    h = pid_bh % Hq
    hk = h // group

    b64 = b.to(tl.int64)
    q_base = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh
    k_base = K + b64 * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + hk.to(tl.int64) * stride_vh
    y_base = Y + b64 * stride_yb + h.to(tl.int64) * stride_yh

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)

    # Key range of this batch and this block of queries, and the visibility limits:
    # key j is seen by the row at position pos iff lo <= j < hi and pos - left <= j <= pos + right.
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
    pos_lo = pid_m * BLOCK_M + off
    pos_hi = tl.minimum((pid_m + 1) * BLOCK_M, Sq) - 1 + off
    hi = tl.minimum(key_end, pos_hi + right + 1)
    lo = tl.maximum(0, pos_lo - left)
    lo = (lo // BLOCK_N) * BLOCK_N
    hi = tl.maximum(hi, lo)
    # Interior blocks [lo_full, hi_full): every row of the tile sees every key of them.
    lo_full = tl.minimum(tl.maximum(lo, ((pos_hi - left + BLOCK_N - 1) // BLOCK_N) * BLOCK_N), hi)
    hi_full = lo_full + tl.maximum(tl.minimum(key_end, pos_lo + right + 1) - lo_full, 0) // BLOCK_N * BLOCK_N

    row_ok = offs_m < Sq
    if EVEN_D:
        q = tl.load(q_base + offs_m[:, None].to(tl.int64) * stride_qm + offs_d[None, :],
                    mask=row_ok[:, None], other=0.0)
    else:
        q = tl.load(q_base + offs_m[:, None].to(tl.int64) * stride_qm + offs_d[None, :],
                    mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    pos = offs_m + off
    m_base = Mask + b64 * stride_mb + h.to(tl.int64) * stride_mh \
        + offs_m[:, None].to(tl.int64) * stride_mm

    # Left edge, interior, right edge (causal diagonal, window, ragged end).
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, m_base, lo, lo_full, hi, pos, row_ok,
                            offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
                            scale, cap, cap_on, left, right,
                            BLOCK_N, EVEN_D, MASK_KIND, EXTRAS, DOT_PRECISION, True)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, m_base, lo_full, hi_full, hi, pos, row_ok,
                            offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
                            scale, cap, cap_on, left, right,
                            BLOCK_N, EVEN_D, MASK_KIND, EXTRAS, DOT_PRECISION, False)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, m_base, hi_full, hi, hi, pos, row_ok,
                            offs_n, offs_d, offs_dv, D, Dv, stride_kn, stride_vn,
                            scale, cap, cap_on, left, right,
                            BLOCK_N, EVEN_D, MASK_KIND, EXTRAS, DOT_PRECISION, True)

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    y_ptrs = y_base + offs_m[:, None].to(tl.int64) * stride_ym + offs_dv[None, :]
    if EVEN_D:
        tl.store(y_ptrs, out.to(Y.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(y_ptrs, out.to(Y.dtype.element_ty), mask=row_ok[:, None] & (offs_dv[None, :] < Dv))
    if store_lse != 0:
        if MASK_KIND == MASK_ADD:
            lse = m_i + tl.log(l_safe)
        else:
            lse = (m_i + tl.log2(l_safe)) * 0.6931471805599453
        lse = tl.where(l_i == 0.0, float("-inf"), lse)
        tl.store(Lse + pid_bh.to(tl.int64) * Sq + offs_m, lse, mask=row_ok)
