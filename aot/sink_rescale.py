"""GroupQueryAttention's attention sinks on the GPU: the attention runs without them and stores
its log-sum-exp, then this kernel rescales its output in place (cpp/gqa_launch.cc run_gqa_cuda).

A sink of logit s_h is a key of that score and value 0 (ort_flash/reference_gqa.py rule 12): it
adds exp(s_h) to each row's softmax denominator and nothing to its numerator, so the row without
it, y = sum_j exp(x_j) v_j / exp(lse), becomes

    y * exp(lse) / (exp(lse) + exp(s_h)) = y / (1 + exp(s_h - lse)) = y * sigmoid(lse - s_h)

computed in fp32 and stored in Y's type. `has_sinks` 0 (smooth_softmax=1 without head_sink)
takes s_h = 0 for every head and never reads Sinks. A row with lse = -inf (no visible key, output
0) gets the factor 0, whatever the sink (-inf - -inf would be NaN).

Y (B, Sq, Hq, D) by the strides (batch, head, row), the head-dim stride 1; Lse (B, Hq, Sq) float32
contiguous, natural log (the attention kernels' store_lse); Sinks (Hq,) in Y's type.

Grid (B * Hq * cdiv(Sq, BLOCK_M),): a program takes BLOCK_M consecutive query rows of one (batch,
head), the head dimension masked past D (any D up to BLOCK_D), the rows past Sq.
"""
import triton
import triton.language as tl


@triton.jit
def sink_rescale(Y, Lse, Sinks, has_sinks, Hq, Sq, D, stride_yb, stride_yh, stride_ym,
                 BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    tiles = tl.cdiv(Sq, BLOCK_M)
    pid = tl.program_id(0)
    bh = pid // tiles
    m0 = (pid - bh * tiles) * BLOCK_M
    b = (bh // Hq).to(tl.int64)
    h = bh % Hq
    rows = m0 + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    r_ok = rows < Sq
    lse = tl.load(Lse + bh.to(tl.int64) * Sq + rows, mask=r_ok, other=float("-inf"))
    sink = tl.load(Sinks + h, mask=has_sinks != 0, other=0.0).to(tl.float32)
    scale = tl.where(lse == float("-inf"), 0.0, 1.0 / (1.0 + tl.exp(sink - lse)))
    ptrs = Y + b * stride_yb + h.to(tl.int64) * stride_yh + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :]
    ok = r_ok[:, None] & (cols < D)[None, :]
    y = tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)
    tl.store(ptrs, (y * scale[:, None]).to(Y.dtype.element_ty), mask=ok)
