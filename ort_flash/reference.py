"""The one reference attention of the package: ONNX ``Attention`` (opset 25) in float64.

``attention_reference`` is the exact math in float64; ``attention_lowp`` is the same function
computed plainly in the inputs' precision (every stage rounded to it, matmuls accumulated in
fp32, as a framework's unfused attention would); ``error_bound`` turns the two into the test
contract of flash-attention and FlagAttention: a fused kernel's error against the reference
is at most twice the plain low-precision computation's error, plus a small floor.

Shapes follow the ONNX spec: Q (B, Hq, Sq, D) or (B, Sq, Hq*D) with ``q_num_heads``;
K (B, Hkv, S, D) / (B, S, Hkv*D); V likewise with Dv; past_key / past_value (B, Hkv, P, D/Dv);
attn_mask bool (True = attend) or additive, broadcastable to (B, Hq, Sq, P+S) with a last
dimension that may be shorter (the missing keys are masked); nonpad_kv_seqlen int (B,).
"""

from __future__ import annotations

import numpy as np

__all__ = ["attention_reference", "attention_lowp", "error_bound", "split_packed_kv", "split_packed_qkv"]


def split_packed_qkv(qkv: np.ndarray, q_num_heads: int, kv_num_heads: int):
    """3-D Q, K, V of ort_flash's packed QKV input (B, S, (Hq + 2 Hkv) * D): each token's Hq query
    heads, then its Hkv key heads, then its Hkv value heads, every head D wide (contiguous copies)."""
    d = qkv.shape[-1] // (q_num_heads + 2 * kv_num_heads)
    parts = np.split(qkv, [q_num_heads * d, (q_num_heads + kv_num_heads) * d], axis=-1)
    return tuple(np.ascontiguousarray(x) for x in parts)


def split_packed_kv(kv: np.ndarray, kv_num_heads: int):
    """3-D K, V of ort_flash's packed KV input (B, S, 2 Hkv * D): each key token's Hkv key heads,
    then its Hkv value heads, every head D wide (contiguous copies)."""
    k, v = np.split(kv, 2, axis=-1)
    return np.ascontiguousarray(k), np.ascontiguousarray(v)


def _to_bnsh(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, S, H*D) -> (B, H, S, D)."""
    b, s, hidden = x.shape
    if heads is None or heads <= 0 or hidden % heads:
        raise ValueError(f"hidden size {hidden} is not a multiple of the head count {heads}")
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _prepare(q, k, v, past_key, past_value, q_num_heads, kv_num_heads):
    """4-D Q and the present K, V (past ++ new, input dtype) and whether Q was 3-D."""
    if not q.ndim == k.ndim == v.ndim or q.ndim not in (3, 4):
        raise ValueError(f"Q, K, V must all be 3-D or all 4-D, got {q.ndim}, {k.ndim}, {v.ndim}")
    is_3d = q.ndim == 3
    if is_3d:
        q, k, v = _to_bnsh(q, q_num_heads), _to_bnsh(k, kv_num_heads), _to_bnsh(v, kv_num_heads)
    elif q_num_heads is not None or kv_num_heads is not None:
        raise ValueError("q_num_heads and kv_num_heads must not be given for 4-D inputs")
    if (past_key is None) != (past_value is None):
        raise ValueError("past_key and past_value must be given together")
    if past_key is not None:
        k = np.concatenate([past_key, k], axis=2)
        v = np.concatenate([past_value, v], axis=2)
    b, hq, _, d = q.shape
    if k.shape[0] != b or v.shape[:3] != k.shape[:3] or k.shape[3] != d:
        raise ValueError(f"inconsistent shapes Q {q.shape}, K {k.shape}, V {v.shape}")
    if k.shape[1] == 0 or hq % k.shape[1]:
        raise ValueError(f"q heads {hq} must be a multiple of kv heads {k.shape[1]}")
    return q, k, v, is_3d


def _mask_parts(shape, attn_mask, past_len, nonpad_kv_seqlen, is_causal, left, right):
    """Keys allowed by the positional rules and bool mask, and the additive mask or None.

    Both broadcast to ``shape`` = (B, Hq, Sq, T). Keys past a short mask's last dim are not
    allowed (the spec pads the mask with -inf / False).
    """
    b, _, sq, t = shape
    j = np.arange(t)
    allowed = np.ones((1, 1, 1, t), dtype=bool)
    additive = None
    if attn_mask is not None:
        attn_mask = np.asarray(attn_mask)
        if not 1 <= attn_mask.ndim <= 4 or attn_mask.shape[-1] > t:
            raise ValueError(f"attn_mask of shape {attn_mask.shape} does not fit {shape}")
        allowed = allowed & (j < attn_mask.shape[-1])
        pad = [(0, 0)] * (attn_mask.ndim - 1) + [(0, t - attn_mask.shape[-1])]
        if attn_mask.dtype == np.bool_:
            allowed = allowed & np.pad(attn_mask, pad, constant_values=False)
        else:
            additive = np.pad(attn_mask, pad, constant_values=0)
    if past_len is not None and nonpad_kv_seqlen is not None:
        raise ValueError("nonpad_kv_seqlen cannot be combined with past_key / past_value")
    if nonpad_kv_seqlen is not None:
        lens = np.asarray(nonpad_kv_seqlen, dtype=np.int64).reshape(b, 1, 1, 1)
        allowed = allowed & (j < lens)
        offset = lens - sq
    else:
        offset = past_len or 0
    pos = np.arange(sq).reshape(1, 1, sq, 1) + offset  # absolute position of each query
    if is_causal:
        allowed = allowed & (j <= pos)
    if left is not None and left >= 0:
        allowed = allowed & (pos - j <= left)
    if right is not None and right >= 0:
        allowed = allowed & (j - pos <= right)
    return np.broadcast_to(allowed, shape), (
        None if additive is None else np.broadcast_to(additive, shape)
    )


def _grouped_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a (B, Hq, M, K) @ b (B, Hkv, K, N), q head h using kv head h // (Hq // Hkv)."""
    bsz, hq, m, kd = a.shape
    hkv = b.shape[1]
    out = a.reshape(bsz, hkv, hq // hkv, m, kd) @ b[:, :, None]
    return out.reshape(bsz, hq, m, b.shape[-1])


def _softmax_pv(s, masked_rows, v, dtype=None):
    """Softmax over keys (masked rows give 0) then P @ V; also returns logsumexp."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        m = np.max(s, axis=-1, keepdims=True) if s.shape[-1] else np.full(s.shape[:-1] + (1,), -np.inf, s.dtype)
        safe_m = np.where(np.isfinite(m), m, 0)
        e = np.exp(s - safe_m)
        e = np.where(masked_rows, 0, e)
        l_sum = np.sum(e, axis=-1, keepdims=True)
        p = e / np.where(l_sum == 0, 1, l_sum)
        lse = np.where(masked_rows | (l_sum == 0), -np.inf, safe_m + np.log(l_sum))[..., 0]
    if dtype is not None:
        p = p.astype(dtype)
    return p, lse


def _finish_y(y: np.ndarray, is_3d: bool) -> np.ndarray:
    if is_3d:
        b, h, s, dv = y.shape
        y = y.transpose(0, 2, 1, 3).reshape(b, s, h * dv)
    return y


def attention_reference(
    q, k, v, *, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None,
    scale=None, is_causal=False, softcap=0.0, left_window_size=-1, right_window_size=-1,
    q_num_heads=None, kv_num_heads=None,
):
    """ONNX Attention-25 in float64.

    Returns ``(y, present_key, present_value, lse)``: y float64 in Q's layout (last dim Dv),
    present K/V in the inputs' dtype (B, Hkv, P+S, D/Dv), lse float64 (B, Hq, Sq), natural log
    of the softmax denominator (-inf for a fully masked row, whose y row is 0).
    """
    q4, present_key, present_value, is_3d = _prepare(
        q, k, v, past_key, past_value, q_num_heads, kv_num_heads)
    b, hq, sq, d = q4.shape
    t = present_key.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    s = scale * _grouped_matmul(
        q4.astype(np.float64), present_key.astype(np.float64).swapaxes(-1, -2))
    if softcap and softcap > 0:
        s = softcap * np.tanh(s / softcap)
    allowed, additive = _mask_parts(
        (b, hq, sq, t), attn_mask, None if past_key is None else past_key.shape[2],
        nonpad_kv_seqlen, is_causal, left_window_size, right_window_size)
    bias = np.zeros((b, hq, sq, t)) if additive is None else additive.astype(np.float64)
    bias = np.where(allowed, bias, -np.inf)
    with np.errstate(invalid="ignore"):
        s = s + bias
    # The spec's fully-masked-row guard is decided on the bias, not on the scores.
    masked_rows = np.all(np.isneginf(bias), axis=-1, keepdims=True)
    p, lse = _softmax_pv(s, masked_rows, None)
    y = _grouped_matmul(p, present_value.astype(np.float64))
    return _finish_y(y, is_3d), present_key, present_value, lse


def attention_lowp(
    q, k, v, *, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None,
    scale=None, is_causal=False, softcap=0.0, left_window_size=-1, right_window_size=-1,
    q_num_heads=None, kv_num_heads=None,
):
    """The same attention computed plainly in the inputs' dtype (float32, float16, bfloat16).

    Every stage is rounded to the dtype: Q*scale, the scores (fp32-accumulated matmul), the
    softcap steps, scores + additive mask, the probabilities (softmax evaluated in fp32 from
    the rounded scores) and the output (fp32-accumulated P @ V). Returns
    ``(y, present_key, present_value, lse)`` with y in the dtype and lse float32.
    """
    dtype = q.dtype
    f32 = np.float32

    def rnd(x):
        return np.asarray(x, dtype=f32).astype(dtype)

    q4, present_key, present_value, is_3d = _prepare(
        q, k, v, past_key, past_value, q_num_heads, kv_num_heads)
    b, hq, sq, d = q4.shape
    t = present_key.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    qs = rnd(q4.astype(f32) * f32(scale))
    s = rnd(_grouped_matmul(qs.astype(f32), present_key.astype(f32).swapaxes(-1, -2)))
    if softcap and softcap > 0:
        c = f32(softcap)
        s = rnd(rnd(np.tanh(rnd(s.astype(f32) / c).astype(f32))).astype(f32) * c)
    allowed, additive = _mask_parts(
        (b, hq, sq, t), attn_mask, None if past_key is None else past_key.shape[2],
        nonpad_kv_seqlen, is_causal, left_window_size, right_window_size)
    s = s.astype(f32)
    masked_rows = ~np.any(allowed, axis=-1, keepdims=True)
    if additive is not None:
        with np.errstate(invalid="ignore", over="ignore"):
            s = rnd(s + additive.astype(f32)).astype(f32)
        masked_rows = ~np.any(allowed & ~np.isneginf(additive.astype(f32)), axis=-1, keepdims=True)
    s = np.where(allowed, s, -np.inf).astype(f32)
    p, lse = _softmax_pv(s, masked_rows, dtype)
    y = rnd(_grouped_matmul(p.astype(f32), present_value.astype(f32)))
    return _finish_y(y, is_3d), present_key, present_value, lse.astype(f32)


def error_bound(ref, lowp, floor: float) -> float:
    """Largest error the contract allows a fused result: 2 * max|lowp - ref| + floor.

    ``ref`` and ``lowp`` are arrays of the same shape; non-finite entries (the -inf lse of a
    fully masked row) must agree and are left out of the error.
    """
    ref = np.asarray(ref, dtype=np.float64)
    lowp = np.asarray(lowp, dtype=np.float64)
    finite = np.isfinite(ref) & np.isfinite(lowp)
    err = np.max(np.abs(lowp[finite] - ref[finite]), initial=0.0)
    return 2.0 * float(err) + floor
