"""FP8 (e4m3) FlashAttention forward for sm_90: Q·Kᵀ and P·V on e4m3 tensor cores (wgmma), fp32
accumulation, over the buffers aot/fp8_prepare.py writes (rotated and block-scaled Q8 and K8, V8
transposed with one scale per channel). The output is written in the input's dtype (fp16 / bf16)
at [B, Hq, N, D] element strides (query head h reads key head h // group of the Hq / group); the log-sum-exp, when asked, in natural units of the true scores.

Program grid: (cdiv(N, BLOCK_M), B * Hq), query blocks in reverse (under CAUSAL the last blocks see
the most keys, so they start first). Per key block:

    S  = (Q8 · K8ᵀ) · (scale_q · scale_k · softmax_scale · log2 e)      fp32, base-2 units
    m  = running row max;  P = exp2(S - m) in [0, 1];  l += rowsum(P) (fp32, unquantized)
    P8 = e4m3(P · 256)     256 = 2^8: an exact scaling that puts P = 1 at 256 (e4m3 saturates at
                           448) and moves e4m3's normal range down to P >= 2^-14; terms below
                           about 2^-18 of the row max flush to zero (448 instead of 256 gave the
                           same emulated error)
    acc = acc · exp2(m_old - m) + P8 · V8

and at the end  O = acc · scale_v / (256 · l). Causal is top-left (query i sees keys j <= i; the
FP8 path assumes Nq == Nk). Interior key blocks run without per-element checks; the causal
diagonal and the ragged tail (N not a multiple of BLOCK_N: the buffers are zero-padded to Np, the
padded keys' scores masked to -inf) with them. BLOCK_M must be a multiple of BLOCK_N.

Tiles for sm_90 (aot/variants.py `FP8_TILES`): 128 x 128 for both head sizes, 8 warps (two warpgroups of 64 query
rows each, one wgmma m64 per warpgroup), 3 pipeline stages of K8 and V8 tiles (16 KB each at
d128); the GPU benchmark lab/experiments/fp8_kernel_bench.py measures them.
"""
import triton
import triton.language as tl

P_SCALE = tl.constexpr(256.0)


@triton.jit
def _attend_fp8(acc, l_i, m_i, q8, k_ptrs, vt_ptrs, sk_ptr, qk_scale, start, end, N, rows,
                BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                MASKED: tl.constexpr):
    """Key blocks [start, end), BLOCK_N-aligned. k_ptrs / vt_ptrs address the block at key 0:
    K8 rows [BLOCK_N, D] (key stride D), V8t columns [D, BLOCK_N] (key stride 1)."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(start, end, BLOCK_N):
        k8 = tl.load(k_ptrs + start_n * HEAD_DIM)
        vt8 = tl.load(vt_ptrs + start_n)
        sk = tl.load(sk_ptr + start_n // BLOCK_N)
        s = tl.dot(q8, tl.trans(k8)) * (qk_scale * sk)
        if MASKED:
            cols = start_n + offs_n
            keep = (cols < N)[None, :]
            if CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None])
            s = tl.where(keep, s, float("-inf"))
        # Every row sees key 0 first (causal or not), so the running max is finite from the first
        # block on and no -inf - -inf can arise.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        p8 = (p * P_SCALE).to(tl.float8e4nv)
        acc = tl.dot(p8, tl.trans(vt8), acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def flash_fwd_fp8(Q8, K8, V8t, ScaleQ, ScaleK, ScaleV, QBias, Y, Lse,
                  softmax_scale, Hq, group, N, store_lse,
                  stride_yb, stride_yh, stride_ym,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                  CAUSAL: tl.constexpr):
    tl.static_assert(BLOCK_M % BLOCK_N == 0, "BLOCK_M must be a multiple of BLOCK_N")
    n_pad = tl.cdiv(N, BLOCK_M) * BLOCK_M  # aot/fp8_prepare.py's Np (BLOCK_M >= BLOCK_N)
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    bh64 = bh.to(tl.int64)
    b = bh // Hq
    h = bh % Hq
    kv = b.to(tl.int64) * (Hq // group) + h // group  # the key head (grouped-query attention)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q8 = tl.load(Q8 + (bh64 * n_pad + rows[:, None]) * HEAD_DIM + offs_d[None, :])
    qk_scale = tl.load(ScaleQ + bh64 * (n_pad // BLOCK_M) + pid_m) * (softmax_scale * 1.4426950408889634)
    k_ptrs = K8 + kv * n_pad * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    vt_ptrs = V8t + kv * HEAD_DIM * n_pad + offs_d[:, None] * n_pad + offs_n[None, :]
    sk_ptr = ScaleK + kv * (n_pad // BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        full_end = pid_m * BLOCK_M
        hi = tl.minimum(full_end + BLOCK_M, N)
    else:
        full_end = N // BLOCK_N * BLOCK_N
        hi = N
    acc, l_i, m_i = _attend_fp8(acc, l_i, m_i, q8, k_ptrs, vt_ptrs, sk_ptr, qk_scale, 0, full_end, N, rows,
                                BLOCK_N, HEAD_DIM, CAUSAL, False)
    acc, l_i, m_i = _attend_fp8(acc, l_i, m_i, q8, k_ptrs, vt_ptrs, sk_ptr, qk_scale, full_end, hi, N, rows,
                                BLOCK_N, HEAD_DIM, CAUSAL, True)

    sv = tl.load(ScaleV + kv * HEAD_DIM + offs_d)
    out = acc * (sv[None, :] / P_SCALE) / l_i[:, None]
    row_ok = rows < N
    y_ptrs = (Y + b.to(tl.int64) * stride_yb + h.to(tl.int64) * stride_yh
              + rows[:, None].to(tl.int64) * stride_ym + offs_d[None, :])
    tl.store(y_ptrs, out.to(Y.dtype.element_ty), mask=row_ok[:, None])
    if store_lse != 0:
        # Scores of the smoothed K are the true ones less q · mean(K) (scaled): added back here.
        bias = tl.load(QBias + bh64 * n_pad + rows)
        lse = (m_i + tl.log2(l_i)) * 0.6931471805599453 + bias * softmax_scale
        tl.store(Lse + bh64 * N + rows, lse, mask=row_ok)
