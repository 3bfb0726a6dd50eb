"""The GroupQueryAttention prepare kernels: what ort_flash::GroupQueryAttention does on the GPU
before the attention kernel runs (cpp/gqa_call.cc run_gqa_cpu is the same on the host; the
semantics are ort_flash/reference_gqa.py's rules 5-9).

One Triton function, four modes (constexpr MODE):

- new tokens (MODE 0), grid (B * cdiv(S * NH, BLOCK_ROWS),): a program takes BLOCK_ROWS
  consecutive rows p = s * NH + h of one batch row b, a row being one head of one token, NH =
  q_heads + 2 Hkv of them per token in packed QKV's order: the Q heads (q_heads = Hq when
  `rotary`, else 0: Q is then read as it is), the K heads, the V heads. So a decode step (S = 1)
  fills a program with its token's heads, and a prefill program reads consecutive heads of a token
  (one contiguous span in packed QKV). A Q row is rotated into QRot (B, S, Hq, D); a K row rotated
  and a V row copied into the present buffers (B, Hkv, present_len, D) at row past_b + s. The
  program holding row 0 also writes the batch row's total length T_b = seqlens_k[b] + 1 (int64,
  the attention kernels' per-batch key lengths) and, when `write_mask`, its key mask row j < T_b
  (bool, present_len entries) of a first prompt.
- past copy (MODE 1), grid (cdiv(present_len, BLOCK_ROWS), B * Hkv): a present of its own
  (not the past's buffer): rows j < min(past_b, past_len) copied from the past, the other rows
  zeroed except the new tokens' [past_b, past_b + S), which the other mode writes.

Q/K norms (`qk_norm`, QNorm / KNorm (D,)): before the rotary, every Q row and new K row x becomes
x / sqrt(mean(x^2) + qk_eps) * w in fp32 (reference_gqa rule 5a); Q then goes to QRot even
without rotary (the host sets q_heads = Hq).

Rotary in fp32: `rotary` 1 rotates the halves (x[i], x[i + R/2]), 2 interleaved pairs (x[2i],
x[2i + 1]); dims from R = 2 * rotary_half on pass through. A position outside cos_cache's rows
leaves the token unrotated (the host cannot check device positions without a sync). Every path
computes x * cos + (sign * partner) * sin in fp32 (sign -1 for the first of a pair), the same
operations in the same order, so that they round alike.

The new tokens take one of two paths, chosen per call in the kernel (_new_tokens):
- fast: half-split rotary over the whole head (R = D: LLaMA, Mistral, Qwen) or no rotary (D
  even), every row, half-row and cos/sin row 16-byte aligned: each row is two contiguous halves,
  each loaded and stored as 16-byte vectors, cos and sin contiguous too; no gathers.
- general: anything else (interleaved or partial rotary, unaligned rows): each element's partner
  and cos/sin entry gathered, in chunks of GATHER_ROWS rows.

A windowed cache (sliding_window_cache=1, `cap` > 0: the cache's capacity C, `gap` G = C - W + 1;
cpp/gqa_shapes.h's layout): a row's first new token goes to buffer row L(past_b) (L(T) = T for
T <= C, else T - G ceil((T - C) / G)), its rotary position stays past_b + s, and its key count is
L(past_b) + S. Those rows may pass C, so the cache writes of both modes above go to the staging
buffers StageK / StageV (B, Hkv, stage_len, D) instead of present: the past copy moves each row's
L(past_b) resident rows there (nothing else), the new tokens follow them, the attention reads the
stage, and the third mode (MODE 2, compact; grid (cdiv(C, BLOCK_ROWS), B * Hkv)) then writes
present's rows [0, L(T_b)) from the stage's last L(T_b) rows of the batch row, and zeros the rest
of a present of its own (`shared` 0; a shared buffer keeps them). A first prompt into a windowed
cache must fill every row (T_b = S, as the CPU op requires): a shorter row is impossible here.

Present as the stage (`stage_len` == `cap`: StageK / StageV are present's buffers): where the call
either cannot pass C (total_sequence_length <= C) or adds one token (S = 1), each row ends with its
L(past_b + S) kept rows where present keeps them, so no stage is needed: the row's key count is
L(past_b + S), its first new token goes to row0 = L(past_b + S) - S, and its resident rows [E_b,
L(past_b)) move down to [0, row0) first, E_b = L(past_b) + S - L(past_b + S) being the rows it
drops (0 within the capacity). A present of its own takes them from the past in the past copy
(MODE 1, from row E_b); a buffer shared with the past moves them in place in the fourth mode
(MODE 3, shift; grid (cdiv(C, BLOCK_ROWS), B * Hkv), each program one block of BLOCK_ROWS
destination rows of one (batch row, KV head), all blocks at once). A block's source rows past its
own destinations may be another block's destinations, written while it runs, so the shift is two
launches: shift_phase 0 copies each block's such rows (at most min(E_b, BLOCK_ROWS), and E_b is 0
or G) into save buffers of min(G, BLOCK_ROWS) rows a block (StageK / StageV, in the call's
scratch), then shift_phase 1 moves every block, those rows from the save buffers, the rest from
present, each block's reads before its writes. A row with E_b = 0 moves nothing. The compaction
after the attention (a present of its own only) then copies rows [0, L(T_b)) onto themselves and
zeros the rest, as it does within the capacity.

seqlens_k is device data: a row whose length is impossible (T_b < 1 or > total_max, fewer keys
than the new tokens, past the cache) writes no K/V row, moves no row and gets T_b = 0 (its
attention output is 0) and an all-false mask row; nothing is ever written outside the buffers.
"""
import triton
import triton.language as tl

# Key-mask entries written per step.
MASK_STEP = tl.constexpr(1024)


@triton.jit
def _kept(t, cap, gap):
    """L(t): the rows a windowed cache of capacity `cap` keeps after t tokens (t >= 0)."""
    over = tl.maximum(t - cap, 0)
    return t - gap * ((over + gap - 1) // gap)


@triton.jit
def _row_lengths(Seqlens, b, S, total_max, present_len, first_prompt, cap, gap, stage_len):
    """(keys_b, past_b, row0_b, drop_b, valid) of batch row b: the keys its attention reads, the
    absolute position of its first new token, that token's row in the cache buffer, the resident
    rows dropped from its front (E_b: present as a windowed cache's stage, else 0); (0, 0, 0, 0,
    False) where seqlens_k[b] is impossible. Without a windowed cache (cap 0) keys = T_b and row0 =
    past_b."""
    total = tl.load(Seqlens + b).to(tl.int64) + 1
    past = tl.where(first_prompt != 0, 0, total - S)
    ok = (total >= 1) & (total <= total_max) & (past >= 0)
    if cap > 0:
        resident = _kept(tl.maximum(past, 0), cap, gap)
        # present as the stage keeps L(past + S) rows, the new tokens last; a stage of its own
        # holds every resident row, the new tokens after them
        keys = tl.where(stage_len == cap, _kept(tl.maximum(past, 0) + S, cap, gap), resident + S)
        row0 = keys - S
        ok = ok & ((first_prompt == 0) | (total == S)) & (row0 >= 0) & (keys <= stage_len)
        drop = resident - row0
    else:
        row0 = past
        ok = ok & (past + S <= present_len)
        keys = total
        drop = row0 * 0
    return tl.where(ok, keys, 0), tl.where(ok, past, 0), tl.where(ok, row0, 0), tl.where(ok, drop, 0), ok


@triton.jit
def _pair_rows(Q, K, V, PresentK, PresentV, QRot, PositionIds, QNorm, KNorm, pp, b64, S, Hq, Hkv, D, q_heads,
               rotary, max_position, has_position_ids, first_prompt, present_len, past, row0, ok, qk_norm,
               stride_qb, stride_qs, stride_kb, stride_ks, stride_vb, stride_vs, ALIGNED: tl.constexpr):
    """Rows pp (p = s * NH + h) of batch row b: per row (source, destination, load: the row exists,
    store: it is written, its rotary position, turn: it is rotated, normed: it is RMS-normed first,
    the norm's weight row). ALIGNED: the caller checked that every row starts 16-byte aligned and
    says so to the compiler (vector loads and stores)."""
    NH = q_heads + 2 * Hkv
    s = pp // NH
    h = pp - s * NH
    s64 = s.to(tl.int64)
    hk = h - q_heads  # a K head below Hkv, else the V head hk - Hkv
    is_q = h < q_heads
    is_k = (hk >= 0) & (hk < Hkv)
    hkv = tl.where(is_k, hk, hk - Hkv)
    src = tl.where(is_q, Q + b64 * stride_qb + s64 * stride_qs + h * D,
                   tl.where(is_k, K + b64 * stride_kb + s64 * stride_ks + hk * D,
                            V + b64 * stride_vb + s64 * stride_vs + hkv * D))
    kv_row = ((b64 * Hkv + hkv) * present_len + row0 + s64) * D
    dst = tl.where(is_q, QRot + ((b64 * S + s64) * Hq + h) * D,
                   tl.where(is_k, PresentK + kv_row, PresentV + kv_row))
    if ALIGNED:
        src = tl.multiple_of(src, [16])
        dst = tl.multiple_of(dst, [16])
    # Loads do not wait for seqlens_k (every new token's row exists); a K/V row is stored only
    # where the batch row's length is valid, a Q row always.
    load = pp < S * NH
    store = load & (is_q | ok)
    # The token's rotary position (cpp/gqa_call.cc position_of).
    if first_prompt != 0:
        pos = s64
        if has_position_ids != 0:
            pos += tl.load(PositionIds)
    elif has_position_ids != 0:
        pos = tl.load(PositionIds + b64 * S + s64, mask=load, other=0)
    else:
        pos = past + s64
    turn = load & (rotary != 0) & (hk < Hkv) & (pos >= 0) & (pos < max_position)  # a Q or K row
    normed = load & (qk_norm != 0) & (hk < Hkv)
    weight = tl.where(is_q, QNorm, KNorm)
    return src, dst, load, store, pos, turn, normed, weight


@triton.jit
def _new_tokens(Q, K, V, PresentK, PresentV, QRot, Cos, Sin, PositionIds, QNorm, KNorm, b64, p0, S, Hq, Hkv, D,
                q_heads, rotary, rotary_half, max_position, has_position_ids, first_prompt, present_len, past, row0, ok,
                qk_norm, qk_eps, stride_qb, stride_qs, stride_kb, stride_ks, stride_vb, stride_vs,
                BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, GATHER_ROWS: tl.constexpr):
    """Rows p0 .. p0 + BLOCK_ROWS - 1 of batch row b64: the fast path where the call allows it,
    else the general one (the module's docstring)."""
    # The fast path's rows are two halves of `half` elements each, rotated as pairs (rotary 1, R
    # = D) or copied (no rotary). The GQA pointers promise no alignment (K and V may point into
    # packed QKV), so it is checked here: every pointer 16-byte aligned, every stride and `half`
    # a multiple of VEC elements (16 bytes); then every row, half and cos/sin row starts aligned.
    VEC: tl.constexpr = 128 // Q.dtype.element_ty.primitive_bitwidth
    half = tl.where(rotary == 0, D // 2, rotary_half)
    whole = ((rotary == 0) & (D % 2 == 0)) | ((rotary == 1) & (2 * rotary_half == D))
    addresses = (Q.to(tl.int64) | K.to(tl.int64) | V.to(tl.int64) | PresentK.to(tl.int64)
                 | PresentV.to(tl.int64) | QRot.to(tl.int64) | Cos.to(tl.int64) | Sin.to(tl.int64))
    strides = stride_qb | stride_qs | stride_kb | stride_ks | stride_vb | stride_vs | half
    if whole & (addresses % 16 == 0) & (strides % VEC == 0):
        hv = (half // VEC) * VEC  # == half, in a form the compiler knows to be a multiple of VEC
        cols = tl.arange(0, BLOCK_D // 2)
        c_ok = (cols < hv)[None, :]
        pp = p0 + tl.arange(0, BLOCK_ROWS)
        src, dst, load, store, pos, turn, normed, weight = _pair_rows(
            Q, K, V, PresentK, PresentV, QRot, PositionIds, QNorm, KNorm, pp, b64, S, Hq, Hkv, D, q_heads, rotary,
            max_position, has_position_ids, first_prompt, present_len, past, row0, ok, qk_norm,
            stride_qb, stride_qs, stride_kb, stride_ks, stride_vb, stride_vs, True)
        cs = tl.where(turn, pos, 0) * hv
        cos_row = tl.multiple_of(Cos + cs, [16])
        sin_row = tl.multiple_of(Sin + cs, [16])
        t = turn[:, None] & c_ok
        lo = src[:, None] + cols[None, :]
        x_lo = tl.load(lo, mask=load[:, None] & c_ok, other=0.0).to(tl.float32)
        x_hi = tl.load(lo + hv, mask=load[:, None] & c_ok, other=0.0).to(tl.float32)
        if qk_norm != 0:  # the Q/K norm over the row's two halves (V rows keep a factor of 1)
            n = normed[:, None] & c_ok
            w_lo = tl.load(weight[:, None] + cols[None, :], mask=n, other=1.0).to(tl.float32)
            w_hi = tl.load(weight[:, None] + hv + cols[None, :], mask=n, other=1.0).to(tl.float32)
            inv = 1.0 / tl.sqrt(tl.sum(x_lo * x_lo + x_hi * x_hi, axis=1) / D + qk_eps)
            f = tl.where(normed, inv, 1.0)[:, None]
            x_lo = x_lo * f * w_lo
            x_hi = x_hi * f * w_hi
        cos = tl.load(cos_row[:, None] + cols[None, :], mask=t, other=1.0).to(tl.float32)
        sin = tl.load(sin_row[:, None] + cols[None, :], mask=t, other=0.0).to(tl.float32)
        # The general path's x * cos + (sign * xp) * sin, sign -1 for the low half: -1.0 * x is
        # x with its sign flipped (-x would be 0 - x, which turns -0 into +0).
        y_lo = tl.where(t, x_lo * cos + (-1.0 * x_hi) * sin, x_lo).to(QRot.dtype.element_ty)
        y_hi = tl.where(t, x_hi * cos + x_lo * sin, x_hi).to(QRot.dtype.element_ty)
        out = dst[:, None] + cols[None, :]
        tl.store(out, y_lo, mask=store[:, None] & c_ok)
        tl.store(out + hv, y_hi, mask=store[:, None] & c_ok)
    else:
        # Each element's partner (rotary 1: x[i +- R/2]; 2: x[i ^ 1]) and cos/sin entry gathered,
        # dims from R on passed through; GATHER_ROWS rows at a time, since a gathered element
        # costs a 64-bit address per load: the whole tile at once would take registers the fast
        # path then lacks (one register count serves both).
        dd = tl.arange(0, BLOCK_D)
        low = dd < rotary_half
        inter = rotary == 2
        i = tl.where(inter, dd // 2, tl.where(low, dd, dd - rotary_half))
        partner = tl.where(inter, dd ^ 1, tl.where(low, dd + rotary_half, dd - rotary_half))
        sign = tl.where(tl.where(inter, dd % 2 == 0, low), -1.0, 1.0)
        d_ok = (dd < D)[None, :]
        r_ok = (dd < 2 * rotary_half)[None, :]
        for r0 in range(0, BLOCK_ROWS, GATHER_ROWS):
            pp = p0 + r0 + tl.arange(0, GATHER_ROWS)
            src, dst, load, store, pos, turn, normed, weight = _pair_rows(
                Q, K, V, PresentK, PresentV, QRot, PositionIds, QNorm, KNorm, pp, b64, S, Hq, Hkv, D, q_heads,
                rotary, max_position, has_position_ids, first_prompt, present_len, past, row0, ok, qk_norm,
                stride_qb, stride_qs, stride_kb, stride_ks, stride_vb, stride_vs, False)
            t = turn[:, None] & d_ok & r_ok
            cs = tl.where(turn, pos, 0)[:, None] * rotary_half + i[None, :]
            cos = tl.load(Cos + cs, mask=t, other=1.0).to(tl.float32)
            sin = tl.load(Sin + cs, mask=t, other=0.0).to(tl.float32)
            x = tl.load(src[:, None] + dd[None, :], mask=load[:, None] & d_ok, other=0.0).to(tl.float32)
            xp = tl.load(src[:, None] + partner[None, :], mask=t, other=0.0).to(tl.float32)
            if qk_norm != 0:  # the row's factor on x and on the partner, each with its own weight
                n = normed[:, None] & d_ok
                inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + qk_eps)
                f = tl.where(normed, inv, 1.0)[:, None]
                x = x * f * tl.load(weight[:, None] + dd[None, :], mask=n, other=1.0).to(tl.float32)
                xp = xp * f * tl.load(weight[:, None] + partner[None, :], mask=n & t, other=1.0).to(tl.float32)
            y = tl.where(t, x * cos + (sign[None, :] * xp) * sin, x)
            tl.store(dst[:, None] + dd[None, :], y.to(QRot.dtype.element_ty), mask=store[:, None] & d_ok)


@triton.jit
def _copy_past(PastK, PastV, PresentK, PresentV, Seqlens, S, Hkv, D, first_prompt, total_max, present_len,
               past_len, cap, gap, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """MODE 1: cache rows of one (batch row, KV head) of a present of its own, or of the stage
    (PresentK / PresentV and present_len are the stage's then; only the resident rows are written)."""
    dd = tl.arange(0, BLOCK_D)
    d_ok = dd < D
    bh = tl.program_id(1)
    b = bh // Hkv
    keys, past, row0, drop, ok = _row_lengths(Seqlens, b, S, total_max, present_len, first_prompt, cap, gap,
                                              present_len)
    jj = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    new_end = tl.where(ok, row0 + S, 0)
    # row jj from the past's row jj + E_b (E_b > 0 only where present is a full windowed cache's stage)
    copy = ((jj < row0) & (jj + drop < past_len))[:, None] & d_ok[None, :]
    if cap > 0:
        write = copy
    else:
        write = ((jj < present_len) & ((jj < row0) | (jj >= new_end)))[:, None] & d_ok[None, :]
    src = (bh.to(tl.int64) * past_len + drop + jj)[:, None] * D + dd[None, :]
    dst = (bh.to(tl.int64) * present_len + jj)[:, None] * D + dd[None, :]
    tl.store(PresentK + dst, tl.load(PastK + src, mask=copy, other=0.0), mask=write)
    tl.store(PresentV + dst, tl.load(PastV + src, mask=copy, other=0.0), mask=write)


@triton.jit
def _compact(StageK, StageV, PresentK, PresentV, Seqlens, S, Hkv, D, first_prompt, total_max, cap, gap, stage_len,
             shared, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """MODE 2: present rows [0, L(T_b)) of one (batch row, KV head) from the stage's last L(T_b)
    rows of the batch row; the rest zeroed in a present of its own, kept in a shared buffer."""
    dd = tl.arange(0, BLOCK_D)
    d_ok = dd < D
    bh = tl.program_id(1)
    b = bh // Hkv
    keys, past, row0, drop, ok = _row_lengths(Seqlens, b, S, total_max, cap, first_prompt, cap, gap, stage_len)
    kept = tl.where(ok, _kept(past + S, cap, gap), 0)
    jj = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    copy = (jj < kept)[:, None] & d_ok[None, :]
    write = ((jj < cap) & ((jj < kept) | (shared == 0)))[:, None] & d_ok[None, :]
    src = (bh.to(tl.int64) * stage_len + keys - kept + jj)[:, None] * D + dd[None, :]
    dst = (bh.to(tl.int64) * cap + jj)[:, None] * D + dd[None, :]
    tl.store(PresentK + dst, tl.load(StageK + src, mask=copy, other=0.0), mask=write)
    tl.store(PresentV + dst, tl.load(StageV + src, mask=copy, other=0.0), mask=write)


@triton.jit
def _shift(PresentK, PresentV, SaveK, SaveV, Seqlens, S, Hkv, D, first_prompt, total_max, cap, gap, shift_phase,
           BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """MODE 3: present (shared with the past) as a windowed cache's stage: rows [E_b, L(past_b)) of
    one (batch row, KV head) moved down to [0, row0_b) in place, block program_id(0) of BLOCK_ROWS
    destination rows a program, in two launches (the module's docstring): shift_phase 0 saves the
    block's source rows that other blocks overwrite into SaveK / SaveV, 1 moves the block."""
    R: tl.constexpr = BLOCK_ROWS
    bh = tl.program_id(1)
    b = bh // Hkv
    keys, past, row0, drop, ok = _row_lengths(Seqlens, b, S, total_max, cap, first_prompt, cap, gap, cap)
    if drop > 0:
        k = tl.program_id(0).to(tl.int64)
        dd = tl.arange(0, BLOCK_D)
        d_ok = (dd < D)[None, :]
        rr = tl.arange(0, R).to(tl.int64)
        base = bh.to(tl.int64) * cap * D
        # The saved rows of block k: sources k R + max(R, E_b) + i, i < min(E_b, R), the block's
        # sources past its own destinations (those before are its own, read before its writes);
        # min(G, R) rows a block in the save buffers (E_b <= G).
        first_saved = k * R + tl.maximum(drop, R)
        save_rows = tl.minimum(gap, R)
        save = (bh.to(tl.int64) * tl.num_programs(0) + k) * save_rows
        if shift_phase == 0:
            src = first_saved + rr
            m = ((rr < tl.minimum(drop, R)) & (src < row0))[:, None] & d_ok
            at = (save + rr)[:, None] * D + dd[None, :]
            from_row = base + src[:, None] * D + dd[None, :]
            tl.store(SaveK + at, tl.load(PresentK + from_row, mask=m, other=0.0), mask=m)
            tl.store(SaveV + at, tl.load(PresentV + from_row, mask=m, other=0.0), mask=m)
        else:
            dst = k * R + rr
            src = dst + drop
            valid = dst < row0
            # a source another block writes (below row0, past this block's destinations) comes
            # from the save buffers; every other one from present, before any write
            saved = valid & (src >= (k + 1) * R) & (src < row0)
            m_p = ((valid & ~saved)[:, None]) & d_ok
            m_s = saved[:, None] & d_ok
            from_row = base + src[:, None] * D + dd[None, :]
            from_save = (save + src - first_saved)[:, None] * D + dd[None, :]
            kk = tl.load(PresentK + from_row, mask=m_p, other=0.0)
            vv = tl.load(PresentV + from_row, mask=m_p, other=0.0)
            kk = tl.where(m_s, tl.load(SaveK + from_save, mask=m_s, other=0.0), kk)
            vv = tl.where(m_s, tl.load(SaveV + from_save, mask=m_s, other=0.0), vv)
            # every thread's reads of the block's rows before any thread's writes of them
            tl.debug_barrier()
            to_row = base + dst[:, None] * D + dd[None, :]
            m = valid[:, None] & d_ok
            tl.store(PresentK + to_row, kk, mask=m)
            tl.store(PresentV + to_row, vv, mask=m)


@triton.jit
def gqa_prepare(
    Q, K, V, PastK, PastV, PresentK, PresentV, QRot, Cos, Sin, StageK, StageV, PositionIds, Seqlens, Totals, KeyMask,
    QNorm, KNorm,
    S, Hq, Hkv, D, q_heads, rotary, rotary_half, max_position, has_position_ids,
    first_prompt, write_mask, total_max, present_len, past_len, qk_norm, cap, gap, stage_len, shared, qk_eps,
    stride_qb, stride_qs, stride_kb, stride_ks, stride_vb, stride_vs,
    BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, GATHER_ROWS: tl.constexpr, MODE: tl.constexpr,
    shift_phase=0,
):
    # The cache writes of modes 0 and 1: present, or a windowed cache's stage (present's own
    # buffers where stage_len == cap).
    if cap > 0:
        CacheK = StageK
        CacheV = StageV
        cache_len = stage_len
    else:
        CacheK = PresentK
        CacheV = PresentV
        cache_len = present_len
    if MODE == 1:
        _copy_past(PastK, PastV, CacheK, CacheV, Seqlens, S, Hkv, D, first_prompt, total_max, cache_len,
                   past_len, cap, gap, BLOCK_ROWS, BLOCK_D)
    elif MODE == 2:
        _compact(StageK, StageV, PresentK, PresentV, Seqlens, S, Hkv, D, first_prompt, total_max, cap, gap, stage_len,
                 shared, BLOCK_ROWS, BLOCK_D)
    elif MODE == 3:
        _shift(PresentK, PresentV, StageK, StageV, Seqlens, S, Hkv, D, first_prompt, total_max, cap, gap, shift_phase,
               BLOCK_ROWS, BLOCK_D)
    else:
        tiles = tl.cdiv(S * (q_heads + 2 * Hkv), BLOCK_ROWS)
        b = tl.program_id(0) // tiles
        p0 = (tl.program_id(0) % tiles) * BLOCK_ROWS
        keys, past, row0, drop, ok = _row_lengths(Seqlens, b, S, total_max, present_len, first_prompt, cap, gap,
                                                  stage_len)
        b64 = b.to(tl.int64)
        _new_tokens(Q, K, V, CacheK, CacheV, QRot, Cos, Sin, PositionIds, QNorm, KNorm, b64, p0, S, Hq, Hkv, D,
                    q_heads, rotary, rotary_half, max_position, has_position_ids, first_prompt, cache_len, past, row0,
                    ok, qk_norm, qk_eps, stride_qb, stride_qs, stride_kb, stride_ks, stride_vb, stride_vs,
                    BLOCK_ROWS, BLOCK_D, GATHER_ROWS)
        # The batch row's key count and key mask, after its rows' loads are issued.
        if p0 == 0:
            tl.store(Totals + b, keys)
            if write_mask != 0:
                for j0 in range(0, present_len, MASK_STEP):
                    jm = j0 + tl.arange(0, MASK_STEP)
                    tl.store(KeyMask + b64 * present_len + jm, (jm < keys).to(tl.int8), mask=jm < present_len)
