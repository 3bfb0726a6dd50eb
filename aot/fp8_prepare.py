"""The FP8 (e4m3) operands of the FP8 attention kernel (aot/flash_fwd_fp8.py), made from fp16 / bf16
Q, K, V of logical layout [B, H, N, D] (element strides passed; the head dim contiguous, so BSHD
storage works as it is). Q has Hq heads, K and V Hkv = Hq / group (grouped-query attention: query
head h reads key head h // group; group 1 is multi-head attention).

What is quantized, and why (the error budget is FlashAttention-3's outlier inputs: N(0, 1) entries,
0.1 % of them N(0, 10)):

- Q and K are both multiplied by one orthonormal matrix R = diag(s) · H / sqrt(D) (H Sylvester's
  Hadamard matrix, s a fixed sign pattern), so Q·Kᵀ is unchanged in exact arithmetic while an
  outlier channel is spread over all D channels before e4m3 rounds it. R is generated in the
  kernel (entries ±1 in the input dtype, exact; 1/sqrt(D) applied in fp32): no buffer.
- K is smoothed: its mean over the keys of its (b, h) is subtracted. Every score of a query row
  moves by the same q·mean, which softmax does not see (causal or not); `QBias` keeps q·mean per
  row so the attention can give the true log-sum-exp.
- One fp32 scale per block of BLOCK_M query rows and per block of BLOCK_N key rows of each (b, h):
  scale = max|x| / 448, the block stored as x / scale in e4m3 (saturating, round to nearest even).
- V has one scale per (b, h, channel), max over all keys: the attention applies it once to its
  fp32 accumulator in the epilogue, at no cost in the key loop. Per-block scales of V (which the
  loop would have to fold into its rescaling) give the same error: e4m3 is a floating-point format,
  so a scale only has to keep values out of the subnormal range (an emulation of both on the
  outlier inputs, d64 and d128, N 512 and 2048, causal or not, agreed to 1 %).
- V is stored transposed, [B, H, D, Np]: FP8 wgmma reads both operands K-major, and P·V's
  reduction dimension is the key, so the keys of a channel must be contiguous.

Two launches per call:

1. `fp8_stats`, grid (splits, B * Hkv) (its H is Hkv): split s reads key blocks s, s + splits, ...
   (BLOCK_N rows each) and writes K's column sums and V's column max |v| of its blocks to `Part`. Splits (see
   `stats_splits`) let a call with few heads fill the GPU; the partials make the result
   independent of timing (no atomics), so the quantized buffers are deterministic.
2. `fp8_quantize`, grid (Np // min(BLOCK_M, BLOCK_N), B * Hq, 2): axis 2 picks the role, 0 a query
   block of (b, h), 1 a key block (K and V) of key head (b, h) for h < Hkv (the programs of
   h >= Hkv have no key head and return); each program reduces the (splits x D) partials of its key
   head in the same order, so every block subtracts the same mean.

Buffers the caller allocates (all contiguous; Np = cdiv(N, PAD) * PAD with PAD = max(BLOCK_M,
BLOCK_N); every element, padding included, is written: padded rows and columns hold zeros):

    Part    fp32  [B, Hkv, splits, 2, D] workspace (stats partials)
    Q8      e4m3  [B, Hq, Np, D]         rotated Q / scale_q
    K8      e4m3  [B, Hkv, Np, D]        rotated, smoothed K / scale_k
    V8t     e4m3  [B, Hkv, D, Np]        V / scale_v, transposed
    ScaleQ  fp32  [B, Hq, Np // BLOCK_M]
    ScaleK  fp32  [B, Hkv, Np // BLOCK_N]
    ScaleV  fp32  [B, Hkv, D]
    QBias   fp32  [B, Hq, Np]            q · mean(K of its key head) per query row (for the log-sum-exp)

`buffer_specs` gives these shapes. The attention must be compiled with the same BLOCK_M, BLOCK_N.
"""
import triton
import triton.language as tl

E4M3_MAX = 448.0


def padded_len(n: int, block_m: int, block_n: int) -> int:
    """Np: the FP8 buffers' row count, N rounded up to a multiple of both tiles (powers of two)."""
    pad = max(block_m, block_n)
    return (n + pad - 1) // pad * pad


def stats_splits(b: int, h: int, n: int, block_n: int, sms: int = 132) -> int:
    """How many programs share one (b, h)'s statistics pass: about two programs per SM in all,
    at most one per key block."""
    blocks = (n + block_n - 1) // block_n
    return max(1, min(blocks, (2 * sms + b * h - 1) // (b * h)))


def buffer_specs(b: int, hq: int, hkv: int, n: int, d: int, block_m: int, block_n: int, splits: int) -> dict:
    """{name: (shape, dtype)} of every buffer the two kernels take besides Q, K, V (Hq query heads,
    Hkv key heads)."""
    np_ = padded_len(n, block_m, block_n)
    return {"Part": ((b, hkv, splits, 2, d), "fp32"),
            "Q8": ((b, hq, np_, d), "fp8e4nv"), "K8": ((b, hkv, np_, d), "fp8e4nv"),
            "V8t": ((b, hkv, d, np_), "fp8e4nv"),
            "ScaleQ": ((b, hq, np_ // block_m), "fp32"), "ScaleK": ((b, hkv, np_ // block_n), "fp32"),
            "ScaleV": ((b, hkv, d), "fp32"), "QBias": ((b, hq, np_), "fp32")}


@triton.jit
def _parity8(x):
    """Parity of the low 8 bits of x (int32 tensor): 1 where odd."""
    x = x ^ (x >> 4)
    x = x ^ (x >> 2)
    x = x ^ (x >> 1)
    return x & 1


@triton.jit
def rotation(HEAD_DIM: tl.constexpr, dtype: tl.constexpr):
    """diag(s) · H (entries ±1, exact in fp16/bf16), H[i, j] = (-1)^popcount(i & j); times
    1/sqrt(HEAD_DIM) it is orthonormal. s_i = -1 where (181 i + 57) mod 256 has odd parity."""
    i = tl.arange(0, HEAD_DIM)[:, None]
    j = tl.arange(0, HEAD_DIM)[None, :]
    flip = _parity8(i & j) ^ _parity8((i * 181 + 57) & 255)
    return tl.where(flip == 1, -1.0, 1.0).to(dtype)


@triton.jit
def fp8_stats(K, V, Part, H, N, splits,
              stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    s = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    ksum = tl.zeros([HEAD_DIM], dtype=tl.float32)
    vmax = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for start in range(s * BLOCK_N, N, splits * BLOCK_N):
        rows = start + offs_n
        ok = (rows < N)[:, None]
        k = tl.load(k_base + rows[:, None].to(tl.int64) * stride_kn + offs_d[None, :], mask=ok, other=0.0)
        v = tl.load(v_base + rows[:, None].to(tl.int64) * stride_vn + offs_d[None, :], mask=ok, other=0.0)
        ksum += tl.sum(k.to(tl.float32), 0)
        vmax = tl.maximum(vmax, tl.max(tl.abs(v.to(tl.float32)), 0))
    out = Part + (bh.to(tl.int64) * splits + s) * 2 * HEAD_DIM + offs_d
    tl.store(out, ksum)
    tl.store(out + HEAD_DIM, vmax)


@triton.jit
def _to_e4m3(x, amax):
    """x [rows, D] fp32 as e4m3 with one scale for the tile: (x * 448 / amax, scale amax / 448)."""
    amax = tl.maximum(amax, 1e-30)
    x8 = tl.clamp(x * (448.0 / amax), -448.0, 448.0).to(tl.float8e4nv)
    return x8, amax / 448.0


@triton.jit
def fp8_quantize(Q, K, V, Part, Q8, K8, V8t, ScaleQ, ScaleK, ScaleV, QBias,
                 Hq, group, N, splits,
                 stride_qb, stride_qh, stride_qm,
                 stride_kb, stride_kh, stride_kn,
                 stride_vb, stride_vh, stride_vn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    i = tl.program_id(0)
    bh = tl.program_id(1)
    role = tl.program_id(2)
    PAD: tl.constexpr = BLOCK_M if BLOCK_M > BLOCK_N else BLOCK_N
    n_pad = tl.cdiv(N, PAD) * PAD
    hkv = Hq // group
    if role == 0:  # query head (b, h) of Hq, its key head (b, h // group)
        b = (bh // Hq).to(tl.int64)
        h = (bh % Hq).to(tl.int64)
        kv = b * hkv + h // group
    else:  # key head (b, h) of Hkv; programs past the last key head read the last one's and store nothing
        kv = tl.minimum(bh, tl.num_programs(1) // group - 1).to(tl.int64)
        b = kv // hkv
        h = kv % hkv
    bh64 = bh.to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    inv_sqrt_d = 1.0 / tl.sqrt(HEAD_DIM * 1.0)

    # K's mean over the keys, the same sum in the same order in every program of this key head.
    part = Part + kv * splits * 2 * HEAD_DIM
    ksum = tl.zeros([HEAD_DIM], dtype=tl.float32)
    vmax = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for s in range(0, splits):
        ksum += tl.load(part + s * 2 * HEAD_DIM + offs_d)
        vmax = tl.maximum(vmax, tl.load(part + s * 2 * HEAD_DIM + HEAD_DIM + offs_d))
    mean = ksum / N

    if role == 0:
        if i * BLOCK_M < n_pad:
            rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
            ok = (rows < N)[:, None]
            q = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None].to(tl.int64) * stride_qm
                        + offs_d[None, :], mask=ok, other=0.0)
            qr = tl.dot(q, rotation(HEAD_DIM, Q.dtype.element_ty)) * inv_sqrt_d
            q8, scale = _to_e4m3(qr, tl.max(tl.max(tl.abs(qr), 1), 0))
            tl.store(Q8 + (bh64 * n_pad + rows[:, None]) * HEAD_DIM + offs_d[None, :], q8)
            tl.store(ScaleQ + bh64 * (n_pad // BLOCK_M) + i, scale)
            tl.store(QBias + bh64 * n_pad + rows, tl.sum(q.to(tl.float32) * mean[None, :], 1))
    else:
        if i * BLOCK_N < n_pad and bh < tl.num_programs(1) // group:
            rows = i * BLOCK_N + tl.arange(0, BLOCK_N)
            ok = (rows < N)[:, None]
            k = tl.load(K + b * stride_kb + h * stride_kh + rows[:, None].to(tl.int64) * stride_kn
                        + offs_d[None, :], mask=ok, other=0.0)
            rot = rotation(HEAD_DIM, K.dtype.element_ty)
            # (k - mean) R = k R - mean R: the dot takes the stored k exactly, the mean in fp32.
            mean_r = tl.sum(mean[:, None] * rot.to(tl.float32), 0) * inv_sqrt_d
            kr = tl.where(ok, tl.dot(k, rot) * inv_sqrt_d - mean_r[None, :], 0.0)
            k8, scale = _to_e4m3(kr, tl.max(tl.max(tl.abs(kr), 1), 0))
            tl.store(K8 + (kv * n_pad + rows[:, None]) * HEAD_DIM + offs_d[None, :], k8)
            tl.store(ScaleK + kv * (n_pad // BLOCK_N) + i, scale)

            vscale = tl.maximum(vmax, 1e-30) / 448.0
            v = tl.load(V + b * stride_vb + h * stride_vh + rows[:, None].to(tl.int64) * stride_vn
                        + offs_d[None, :], mask=ok, other=0.0)
            v8 = tl.clamp(v.to(tl.float32) * (448.0 / tl.maximum(vmax, 1e-30))[None, :], -448.0, 448.0)
            v8 = tl.trans(v8.to(tl.float8e4nv))
            tl.store(V8t + (kv * HEAD_DIM + offs_d[:, None]) * n_pad + rows[None, :], v8)
            if i == 0:
                tl.store(ScaleV + kv * HEAD_DIM + offs_d, vscale)
