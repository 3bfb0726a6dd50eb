"""ONNX Runtime's ``com.microsoft.GroupQueryAttention`` (GQA) as its CPU op computes it, in float64.

The semantics below were read from ONNX Runtime's sources and proven against onnxruntime 1.31.1's
CPU execution provider (tests/test_reference_gqa.py). Notation: B batch, S query tokens of this
call, Hq = num_heads, Hkv = kv_num_heads, D head size, T_b = seqlens_k[b] + 1 (the total length
of batch row b), TOTAL = total_sequence_length, M = past_key.shape[2] (0 without past).

Inputs and layout
  1. query (B, S, Hq*D) and key/value (B, S, Hkv*D); or packed QKV in query (B, S, (Hq+2Hkv)*D),
     each token holding its Hq query heads, then Hkv key heads, then Hkv value heads (key and
     value absent). Hq % Hkv == 0; query head h reads kv head h // (Hq/Hkv). D % 8 == 0.
  2. past_key/past_value (B, Hkv, M, D) (BNSH); outputs present_key/present_value (B, Hkv,
     max(TOTAL, M), D) and output (B, S, Hq*D). Without a past TOTAL == S; with one, TOTAL <= M
     (a static, max-length cache) or TOTAL == M + S (a growing cache); else ORT refuses.
     0 <= seqlens_k[b] < max(TOTAL, M). With do_rotary D % 16 == 0 and R/2 % 8 == 0.

Phase: first prompt or continuation
  3. S > 1 and S != TOTAL: a continuation ("subsequent prompt"); only B == 1 is allowed.
     Otherwise the call is the first prompt when S == TOTAL, else a decode step (S == 1).
  4. Past length of row b: P_b = 0 on the first prompt, else P_b = T_b - S. Query token s of row b
     sits at absolute position q = P_b + s. On the first prompt the past buffer's content is
     never read (except keys j < T_b that lie past S, see 9).

Rotary (do_rotary=1)
  5. R = 2 * cos_cache.shape[1] (<= D; dims R..D-1 pass through). Q and the new K are rotated;
     V never; past K is taken as already rotated. Position of token (b, s): without position_ids,
     s on the first prompt and P_b + s otherwise; with position_ids (B, S) int64, on the first
     prompt position_ids[0, 0] + s for EVERY row b (only the first element is read), otherwise
     position_ids[b, s]. c = cos_cache[pos, i], n = sin_cache[pos, i], i < R/2.
     Half-split (rotary_interleaved=0): x[i], x[i+R/2] -> x[i] c - x[i+R/2] n, x[i+R/2] c + x[i] n.
     Interleaved (=1): x[2i], x[2i+1] -> x[2i] c - x[2i+1] n, x[2i+1] c + x[2i] n.
  5a. Q/K norms (q_norm_weight and k_norm_weight (D,), given together; Qwen3 builds for CUDA):
     before any rotary, every Q head row and every new K head row x becomes
     x / sqrt(mean(x^2) + qk_norm_epsilon) * w (w the Q or K weight; epsilon default 1e-6),
     with or without rotary. ONNX Runtime computes it on the CUDA and WebGPU EPs only (its CPU op
     refuses the inputs), so this rule follows the schema's words and the model builder's unfused
     form (SimplifiedLayerNormalization over the head axis), not a CPU run.

Present K/V (the cache)
  6. The new S tokens' (rotated) K and V rows are written to present[b, :, P_b + s] for every
     s < S, padded tokens included (a first-prompt row with T_b < S gets its padding tokens'
     K/V at positions T_b..S-1).
  7. Shared buffer (past and present are one buffer, as GenAI binds them): every other position
     keeps the past's values, also positions past T_b; nothing is zeroed.
  8. Separate buffers: present is zero-filled, then past rows [0, P_b) are copied (never on the
     first prompt), then the new rows written (6). Positions >= P_b + S are zero.

Attention of query (b, h, s) at position q = P_b + s
  9. Keys and values are read from present rows j < T_b of kv head h // (Hq/Hkv) (after 6-8).
     Allowed keys: j < T_b, and with causal=1 (the default) j <= q, and with local_window_size
     W >= 0 also j > q - W, i.e. exactly the W keys q-W+1..q (W = 0 allows none; ONNX
     Attention's left_window_size is W - 1). causal=0 (ORT 1.31's attribute; W must be -1)
     allows every j < T_b.
 10. A first-prompt padding row (s >= T_b) is computed, never zeroed, and its position depends
     on the dtype: float32 keeps q = s, so it sees the keys j < T_b with j > s - W (none, output
     0, once s >= T_b + W - 1); float16 clamps q to T_b - 1, so it sees the last real token's
     keys (all j < T_b without a window, T_b-W..T_b-1 with one). Without a window both see
     every key j < T_b. The padding tokens' own K/V (written by 6) are never attended to.
 11. score = scale * (q . k) with scale = 1/sqrt(D) when the attribute is 0; softcap c > 0:
     score = c * tanh(score / c); then + attention_bias[b|0, h|0, s, j] (shape (1|B, 1|Hq, S,
     TOTAL), column = absolute key position); masked keys get probability 0.
 12. softmax over the allowed keys; with head_sink (Hq,) or smooth_softmax=1 (sink 0) the
     denominator gains exp(sink_h - m), m = max(max score, sink_h): a virtual key of logit
     sink_h and value 0. Given both, ORT 1.31.1 runs and head_sink wins (sink_h = head_sink[h]).
 13. A row with no allowed key (W = 0, or a float32 padding row of 10) outputs 0.
 14. Precision of the CPU op: float16 Q/K/V are widened to float32 for the scores, softmax and
     P.V; the rotated Q/K and the output are rounded to float16.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ort_flash.reference import attention_lowp, attention_reference, split_packed_qkv

__all__ = ["GqaProblem", "gqa_problem", "gqa_reference", "gqa_lowp", "apply_rotary", "rms_norm_heads"]


class GqaProblem(NamedTuple):
    """A GQA call restated as ONNX Attention (4-D, no past): q (B, Hq, S, D), k/v (B, Hkv, N, D)
    where key N-1 is the virtual sink key (zeros) when a sink is in play, mask (B, Hq, S, N)
    additive (-inf = masked, the sink's logit on the sink key), and the presents of the call."""
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray
    scale: float
    softcap: float
    present_key: np.ndarray
    present_value: np.ndarray


def apply_rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """Rotates the first 2 * cos.shape[-1] dims of x (..., D) in float64; cos/sin broadcast
    against x[..., :R/2] (one row per token)."""
    x = np.array(x, dtype=np.float64)
    half = cos.shape[-1]
    if interleaved:
        a, b = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2] = a * cos - b * sin
        x[..., 1:2 * half:2] = b * cos + a * sin
    else:
        a, b = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half] = a * cos - b * sin
        x[..., half:2 * half] = b * cos + a * sin
    return x


def rms_norm_heads(x: np.ndarray, weight, epsilon: float) -> np.ndarray:
    """Rule 5a: each head row x (..., D) -> x / sqrt(mean(x^2) + epsilon) * weight, in float64."""
    x = np.asarray(x, np.float64)
    w = np.asarray(weight, np.float64).reshape(-1)
    if w.shape[0] != x.shape[-1]:
        raise ValueError(f"a Q/K norm weight of {w.shape[0]} entries for heads of {x.shape[-1]}")
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + float(epsilon)) * w


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, S, H*D) -> (B, H, S, D) float64."""
    b, s, hidden = x.shape
    return np.asarray(x, np.float64).reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def gqa_problem(
    query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache,
    *, num_heads, kv_num_heads, scale=0.0, softcap=0.0, local_window_size=-1, do_rotary=0,
    rotary_interleaved=0, position_ids=None, attention_bias=None, head_sink=None, smooth_softmax=0,
    causal=1, q_norm_weight=None, k_norm_weight=None, qk_norm_epsilon=1e-6, share_buffer=False,
) -> GqaProblem:
    """Rules 1-13 of the module docstring: the rotated Q, the presents and the mask of one call.

    ``share_buffer``: past and present are one buffer (rule 7; ORT decides by the pointers, so
    the caller says which), else separate (rule 8). ``causal`` is ORT 1.31's attribute.
    """
    if key is None:
        query, key, value = split_packed_qkv(query, num_heads, kv_num_heads)
    if num_heads % kv_num_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of kv_num_heads {kv_num_heads}")
    bsz, s_len, _ = query.shape
    q = _heads(query, num_heads)
    k_new = _heads(key, kv_num_heads)
    v_new = _heads(value, kv_num_heads)
    d = q.shape[-1]
    total = int(np.asarray(total_sequence_length).reshape(-1)[0])
    t_b = np.asarray(seqlens_k, dtype=np.int64).reshape(bsz) + 1
    m_past = 0 if past_key is None else past_key.shape[2]

    if not (total <= m_past or total == m_past + s_len):
        raise ValueError(f"total_sequence_length {total} is neither <= the past's {m_past} "
                         f"nor past + new ({m_past} + {s_len})")
    if do_rotary and (d % 16 or cos_cache.shape[1] % 8 or 2 * cos_cache.shape[1] > d):
        raise ValueError(f"rotary needs D % 16 == 0 (D {d}) and cos_cache.shape[1] a multiple of 8 <= D/2")
    continuation = s_len > 1 and s_len != total
    if continuation and bsz != 1:
        raise ValueError("ORT allows S > 1 after a past (S != total_sequence_length) only for batch 1")
    first_prompt = not continuation and s_len == total
    past_b = np.zeros(bsz, np.int64) if first_prompt else t_b - s_len
    if np.any(past_b < 0):
        raise ValueError(f"seqlens_k {list(t_b - 1)} too small for {s_len} new tokens")

    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("q_norm_weight and k_norm_weight must be given together")
    if q_norm_weight is not None:  # rule 5a
        q = rms_norm_heads(q, q_norm_weight, qk_norm_epsilon)
        k_new = rms_norm_heads(k_new, k_norm_weight, qk_norm_epsilon)

    if do_rotary:
        if position_ids is None:
            pos = past_b[:, None] + np.arange(s_len)
        elif first_prompt:
            pos = np.broadcast_to(np.asarray(position_ids).reshape(-1)[0] + np.arange(s_len), (bsz, s_len))
        else:
            pos = np.asarray(position_ids, np.int64).reshape(bsz, s_len)
        cos = np.asarray(cos_cache, np.float64)[pos][:, None]  # (B, 1, S, R/2)
        sin = np.asarray(sin_cache, np.float64)[pos][:, None]
        q = apply_rotary(q, cos, sin, rotary_interleaved)
        k_new = apply_rotary(k_new, cos, sin, rotary_interleaved)

    present_len = max(total, m_past)
    if share_buffer and (past_key is None or m_past != present_len):
        raise ValueError(f"a shared buffer needs a past of the present's length {present_len}, got {m_past}")
    shape = (bsz, kv_num_heads, present_len, d)
    present_key, present_value = np.zeros(shape), np.zeros(shape)
    for b in range(bsz):
        p = int(past_b[b])
        if share_buffer:
            present_key[b], present_value[b] = past_key[b], past_value[b]
        elif past_key is not None:
            present_key[b, :, :p], present_value[b, :, :p] = past_key[b, :, :p], past_value[b, :, :p]
        present_key[b, :, p:p + s_len] = k_new[b]
        present_value[b, :, p:p + s_len] = v_new[b]

    n_keys = int(t_b.max())
    j = np.arange(n_keys)
    qpos = past_b[:, None, None] + np.arange(s_len)[None, :, None]  # (B, S, 1)
    if np.asarray(query).dtype == np.float16:  # rule 10: a padding row stands at T_b - 1
        qpos = np.minimum(qpos, t_b[:, None, None] - 1)
    allowed = j < t_b[:, None, None]
    if causal:
        allowed = allowed & (j <= qpos)
    if local_window_size is not None and local_window_size >= 0:
        allowed = allowed & (j > qpos - local_window_size)
    mask = np.zeros((bsz, num_heads, s_len, n_keys))
    if attention_bias is not None:
        mask = mask + np.asarray(attention_bias, np.float64)[..., :n_keys]
    mask = np.where(allowed[:, None], mask, -np.inf)
    k = present_key[:, :, :n_keys]
    v = present_value[:, :, :n_keys]
    if head_sink is not None or smooth_softmax == 1:
        sink = np.zeros(num_heads) if head_sink is None else np.asarray(head_sink, np.float64)
        mask = np.concatenate([mask, np.broadcast_to(sink[None, :, None, None], (bsz, num_heads, s_len, 1))], -1)
        k = np.concatenate([k, np.zeros((bsz, kv_num_heads, 1, d))], 2)
        v = np.concatenate([v, np.zeros((bsz, kv_num_heads, 1, d))], 2)
    return GqaProblem(q, k, v, mask, 1.0 / np.sqrt(d) if not scale else float(scale),
                      float(softcap or 0.0), present_key, present_value)


def _to_bsh(y: np.ndarray) -> np.ndarray:
    b, h, s, d = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, s, h * d)


def gqa_reference(*args, **kwargs):
    """(output (B, S, Hq*D), present_key, present_value), all float64: ONNX Runtime's CPU
    GroupQueryAttention per the module docstring. Arguments as ``gqa_problem``."""
    p = gqa_problem(*args, **kwargs)
    y = attention_reference(p.q, p.k, p.v, attn_mask=p.mask, scale=p.scale, softcap=p.softcap)[0]
    return _to_bsh(y), p.present_key, p.present_value


def gqa_lowp(*args, **kwargs):
    """The output computed plainly in the inputs' precision (``attention_lowp`` over the rotated
    Q/K rounded to query's dtype), for the ``error_bound`` contract."""
    dtype = np.asarray(args[0] if args else kwargs["query"]).dtype
    p = gqa_problem(*args, **kwargs)
    y = attention_lowp(p.q.astype(dtype), p.k.astype(dtype), p.v.astype(dtype),
                       attn_mask=p.mask.astype(dtype), scale=p.scale, softcap=p.softcap)[0]
    return _to_bsh(y)
