"""The GroupQueryAttention prepare kernels: what ort_flash::GroupQueryAttention does on the GPU
before the attention kernel runs (cpp/gqa_call.cc run_gqa_cpu is the same on the host; the
semantics are ort_flash/reference_gqa.py's rules 5-9).

One Triton function, two modes (constexpr COPY_PAST):

- new tokens (COPY_PAST False), grid (B * cdiv(S, BLOCK_ROWS), q_heads + Hkv): BLOCK_ROWS tokens
  (b, s) of one batch row and one head each. A Q head's program rotates it into QRot (B, S, Hq, D)
  when `rotary` (q_heads = Hq then, else 0); a K/V head's rotates the K head and writes it and the
  V head into the present buffers (B, Hkv, present_len, D) at rows past_b + s. The program of the
  row's first tokens and head 0 also writes the row's total length T_b = seqlens_k[b] + 1 (int64,
  the attention kernels' per-batch key lengths) and, when `write_mask`, the key mask row j < T_b
  (bool, present_len entries) of a first prompt. A program moves a few KB, so that its loads are
  many and independent (one token's few heads per program was latency-bound: 0.69 ms for 16k
  tokens whatever the head dim, perf-notes "GroupQueryAttention on CUDA").
- past copy (COPY_PAST True), grid (cdiv(present_len, BLOCK_ROWS), B * Hkv): a present of its own
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
    BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, COPY_PAST: tl.constexpr,
):
    dd = tl.arange(0, BLOCK_D)
    d_ok = dd < D
    if COPY_PAST:
        bh = tl.program_id(1)
        b = bh // Hkv
        total, past, ok = _row_lengths(Seqlens, b, S, total_max, present_len, first_prompt)
        jj = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        new_end = tl.where(ok, past + S, 0)
        copy = (jj < tl.minimum(past, past_len))[:, None] & d_ok[None, :]
        write = ((jj < present_len) & ((jj < past) | (jj >= new_end)))[:, None] & d_ok[None, :]
        src = (bh.to(tl.int64) * past_len + jj)[:, None] * D + dd[None, :]
        dst = (bh.to(tl.int64) * present_len + jj)[:, None] * D + dd[None, :]
        tl.store(PresentK + dst, tl.load(PastK + src, mask=copy, other=0.0), mask=write)
        tl.store(PresentV + dst, tl.load(PastV + src, mask=copy, other=0.0), mask=write)
        return

    # This program: BLOCK_ROWS tokens of batch row b from s0, one head h (a Q head below
    # q_heads, then the Hkv K/V heads).
    tiles = tl.cdiv(S, BLOCK_ROWS)
    b = tl.program_id(0) // tiles
    s0 = (tl.program_id(0) % tiles) * BLOCK_ROWS
    h = tl.program_id(1)
    total, past, ok = _row_lengths(Seqlens, b, S, total_max, present_len, first_prompt)
    b64 = b.to(tl.int64)
    if (s0 == 0) & (h == 0):
        tl.store(Totals + b, total)
        if write_mask != 0:
            for j0 in range(0, present_len, MASK_STEP):
                jm = j0 + tl.arange(0, MASK_STEP)
                tl.store(KeyMask + b64 * present_len + jm, (jm < total).to(tl.int8), mask=jm < present_len)
    ss = s0 + tl.arange(0, BLOCK_ROWS)
    s_ok = ss < S
    s64 = ss.to(tl.int64)
    here = s_ok[:, None] & d_ok[None, :]

    # Each token's rotary position (cpp/gqa_call.cc position_of).
    if first_prompt != 0:
        pos = s64
        if has_position_ids != 0:
            pos += tl.load(PositionIds)
    elif has_position_ids != 0:
        pos = tl.load(PositionIds + b64 * S + s64, mask=s_ok, other=0)
    else:
        pos = past + s64
    rot = (rotary != 0) & (pos >= 0) & (pos < max_position)
    low = dd < rotary_half
    inter = rotary == 2
    i = tl.where(inter, dd // 2, tl.where(low, dd, dd - rotary_half))
    partner = tl.where(inter, dd ^ 1, tl.where(low, dd + rotary_half, dd - rotary_half))
    sign = tl.where(tl.where(inter, dd % 2 == 0, low), -1.0, 1.0)
    turn = here & rot[:, None] & (dd < 2 * rotary_half)[None, :]
    cos = tl.load(Cos + pos[:, None] * rotary_half + i[None, :], mask=turn, other=1.0).to(tl.float32)
    sin = tl.load(Sin + pos[:, None] * rotary_half + i[None, :], mask=turn, other=0.0).to(tl.float32)

    hk = h - q_heads
    if h < q_heads:
        rows = Q + b64 * stride_qb + s64[:, None] * stride_qs + h * D
    else:
        rows = K + b64 * stride_kb + s64[:, None] * stride_ks + hk * D
    x = tl.load(rows + dd[None, :], mask=here, other=0.0).to(tl.float32)
    xp = tl.load(rows + partner[None, :], mask=turn, other=0.0).to(tl.float32)
    y = tl.where(turn, x * cos + (sign[None, :] * xp) * sin, x)
    y = y.to(QRot.dtype.element_ty)

    if h < q_heads:
        tl.store(QRot + ((b64 * S + s64[:, None]) * Hq + h) * D + dd[None, :], y, mask=here)
    elif ok:
        row = ((b64 * Hkv + hk) * present_len + past + s64[:, None]) * D + dd[None, :]
        tl.store(PresentK + row, y, mask=here)
        v = tl.load(V + b64 * stride_vb + s64[:, None] * stride_vs + hk * D + dd[None, :], mask=here, other=0.0)
        tl.store(PresentV + row, v, mask=here)
