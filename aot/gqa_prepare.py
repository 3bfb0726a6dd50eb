"""The GroupQueryAttention prepare kernels: what ort_flash::GroupQueryAttention does on the GPU
before the attention kernel runs (cpp/gqa_call.cc run_gqa_cpu is the same on the host; the
semantics are ort_flash/reference_gqa.py's rules 5-9).

One Triton function, two modes (constexpr COPY_PAST):

- new tokens (COPY_PAST False), grid (B * S, cdiv(q_heads + Hkv, BLOCK_H)): token (b, s) rotates
  its Q heads into QRot (B, S, Hq, D) when `rotary` (q_heads = Hq then, else 0), rotates its K
  heads and writes them and its V heads into the present buffers (B, Hkv, present_len, D) at row
  past_b + s. The programs of token 0 also write the row's total length T_b = seqlens_k[b] + 1
  (int64, the attention kernels' per-batch key lengths) and, when `write_mask`, the key mask row
  j < T_b (bool, present_len entries) of a first prompt.
- past copy (COPY_PAST True), grid (cdiv(present_len, BLOCK_H), B * Hkv): a present of its own
  (not the past's buffer): rows j < min(past_b, past_len) copied from the past, the other rows
  zeroed except the new tokens' [past_b, past_b + S), which the other mode writes.

Rotary in fp32: `rotary` 1 rotates the halves (x[i], x[i + R/2]), 2 interleaved pairs (x[2i],
x[2i + 1]); dims from R = 2 * rotary_half on pass through. A position outside cos_cache's rows
leaves the token unrotated (the host cannot check device positions without a sync).

seqlens_k is device data: a row whose length is impossible (T_b < 1 or > total_max, fewer keys
than the new tokens, past the cache) writes no K/V row and gets T_b = 0 (its attention output is
0) and an all-false mask row; nothing is ever written outside the buffers.
"""
import triton
import triton.language as tl

# Key-mask entries written per step.
MASK_STEP = tl.constexpr(1024)


@triton.jit
def _row_lengths(Seqlens, b, S, total_max, present_len, first_prompt):
    """(T_b, past_b, valid) of batch row b; (0, 0, False) where seqlens_k[b] is impossible."""
    total = tl.load(Seqlens + b).to(tl.int64) + 1
    past = tl.where(first_prompt != 0, 0, total - S)
    ok = (total >= 1) & (total <= total_max) & (past >= 0) & (past + S <= present_len)
    return tl.where(ok, total, 0), tl.where(ok, past, 0), ok


@triton.jit
def gqa_prepare(
    Q, K, V, PastK, PastV, PresentK, PresentV, QRot, Cos, Sin, PositionIds, Seqlens, Totals, KeyMask,
    S, Hq, Hkv, D, q_heads, rotary, rotary_half, max_position, has_position_ids,
    first_prompt, write_mask, total_max, present_len, past_len,
    stride_qb, stride_qs, stride_kb, stride_ks, stride_vb, stride_vs,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, COPY_PAST: tl.constexpr,
):
    dd = tl.arange(0, BLOCK_D)
    d_ok = dd < D
    if COPY_PAST:
        bh = tl.program_id(1)
        b = bh // Hkv
        total, past, ok = _row_lengths(Seqlens, b, S, total_max, present_len, first_prompt)
        jj = tl.program_id(0).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
        new_end = tl.where(ok, past + S, 0)
        copy = (jj < tl.minimum(past, past_len))[:, None] & d_ok[None, :]
        write = ((jj < present_len) & ((jj < past) | (jj >= new_end)))[:, None] & d_ok[None, :]
        src = (bh.to(tl.int64) * past_len + jj)[:, None] * D + dd[None, :]
        dst = (bh.to(tl.int64) * present_len + jj)[:, None] * D + dd[None, :]
        tl.store(PresentK + dst, tl.load(PastK + src, mask=copy, other=0.0), mask=write)
        tl.store(PresentV + dst, tl.load(PastV + src, mask=copy, other=0.0), mask=write)
        return

    tok = tl.program_id(0)
    b = tok // S
    s = tok % S
    total, past, ok = _row_lengths(Seqlens, b, S, total_max, present_len, first_prompt)
    b64 = b.to(tl.int64)
    s64 = s.to(tl.int64)
    if (s == 0) & (tl.program_id(1) == 0):
        tl.store(Totals + b, total)
        if write_mask != 0:
            for j0 in range(0, present_len, MASK_STEP):
                jm = j0 + tl.arange(0, MASK_STEP)
                tl.store(KeyMask + b64 * present_len + jm, (jm < total).to(tl.int8), mask=jm < present_len)

    # Token (b, s)'s rotary position (cpp/gqa_call.cc position_of).
    if first_prompt != 0:
        pos = s64
        if has_position_ids != 0:
            pos += tl.load(PositionIds)
    elif has_position_ids != 0:
        pos = tl.load(PositionIds + b64 * S + s64)
    else:
        pos = past + s64
    rot = (rotary != 0) & (pos >= 0) & (pos < max_position)
    low = dd < rotary_half
    inter = rotary == 2
    i = tl.where(inter, dd // 2, tl.where(low, dd, dd - rotary_half))
    partner = tl.where(inter, dd ^ 1, tl.where(low, dd + rotary_half, dd - rotary_half))
    sign = tl.where(tl.where(inter, dd % 2 == 0, low), -1.0, 1.0)
    turn = rot & (dd < 2 * rotary_half) & d_ok
    cos = tl.load(Cos + pos * rotary_half + i, mask=turn, other=1.0).to(tl.float32)
    sin = tl.load(Sin + pos * rotary_half + i, mask=turn, other=0.0).to(tl.float32)

    # This program's heads: q_heads Q heads, then the Hkv K/V heads.
    hh = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    is_q = (hh < q_heads)[:, None] & d_ok[None, :]
    hk = hh - q_heads
    is_kv = ((hk >= 0) & (hk < Hkv))[:, None] & d_ok[None, :]
    q_src = Q + b64 * stride_qb + s64 * stride_qs + hh[:, None] * D
    k_src = K + b64 * stride_kb + s64 * stride_ks + hk[:, None] * D
    x = tl.load(q_src + dd[None, :], mask=is_q, other=0.0).to(tl.float32) + \
        tl.load(k_src + dd[None, :], mask=is_kv, other=0.0).to(tl.float32)
    pq = is_q & turn[None, :]
    pk = is_kv & turn[None, :]
    xp = tl.load(q_src + partner[None, :], mask=pq, other=0.0).to(tl.float32) + \
        tl.load(k_src + partner[None, :], mask=pk, other=0.0).to(tl.float32)
    y = tl.where(turn[None, :], x * cos[None, :] + (sign[None, :] * xp) * sin[None, :], x)
    y = y.to(QRot.dtype.element_ty)

    tl.store(QRot + ((b64 * S + s64) * Hq + hh[:, None]) * D + dd[None, :], y, mask=is_q)
    row = ((b64 * Hkv + hk[:, None]) * present_len + past + s64) * D + dd[None, :]
    kv = is_kv & ok
    tl.store(PresentK + row, y, mask=kv)
    v = tl.load(V + b64 * stride_vb + s64 * stride_vs + hk[:, None] * D + dd[None, :], mask=kv, other=0.0)
    tl.store(PresentV + row, v, mask=kv)
