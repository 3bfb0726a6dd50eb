"""The gqa suite's inputs and peers: GroupQueryAttention called as ONNX Runtime GenAI calls it.

Per input set (``make_sets``): ``qkv`` the packed query (B, S, (Hq + 2 Hkv)·D); ``k_cache`` /
``v_cache`` the max-length cache (B, Hkv, M, D), bound as past_key AND present_key (past_value
and present_value) so the op appends in place, as GenAI's ``past_present_share_buffer`` does.
Shared by the sets: ``cos`` / ``sin`` (M, D/2) (rotary over the whole head, half-split),
``seqlens`` int32 (B,) on the device = total - 1, ``total`` the int32 scalar on the host; with
``sinks`` one logit per query head (``head_sink``), with ``qk_norm`` the RMS norm weights (D,) of
Q and K (``q_norm_weight``, ``k_norm_weight``: Qwen3's per-head norms, applied before the rotary).

A call is a first prompt (phase ``prefill``: S = N new tokens at positions 0..N-1, total N) or a
decode step (phase ``decode``: S = 1 at position C-1, total C, the first C-1 rows the cache).
Every timed call writes the same rows with the same values, so no reset between calls.

With ``window`` W (``--window``) every node has local_window_size=W and sliding_window_cache=1 and
the buffer W rows (GenAI's Mistral and Gemma 2 layers); total and seqlens count every token. A decode
step past W (``shifts``) moves the resident rows up one: the same work every call, the contents
moving. ort_flash_fa and sdpa have no window-sized cache (unsupported).

| peer      | what runs                                                                           |
|-----------|-------------------------------------------------------------------------------------|
| ort_flash | ort_flash::GroupQueryAttention, the one-node model                                   |
| ort_gqa   | com.microsoft.GroupQueryAttention, the same model in ONNX Runtime's domain           |
| ort_flash_fa | first prompts: ort_flash::FlashAttention (4-D BNSH, causal) on the rotated Q and the new K, V (``attention_inputs``): the same attention as one plain call, without the rotary and the cache write |
| sdpa      | CUDA: torch SDPA (cuDNN backend) on the rotated Q, K, V (``attention_inputs``), the KV heads repeated to Hq; the rotary and the cache write are not in its time |

With CUDA graphs (the suite's default on CUDA) the two ONNX Runtime peers run a model of
``copies`` nodes per session run (``layered.layered_session``: a model's layers in one
step), so a short call is timed as device time in both, as torch's graphs time sdpa.
"""
from __future__ import annotations

import numpy as np

from ort_flash.bench import gqa_graphs, layered, onnx_graphs
from ort_flash.bench.measure import Context
from ort_flash.bench.op_peers import _bnsh_from_bsh
from ort_flash.bench.ort_session import BoundSession, Unsupported
from ort_flash.bench.tensors import Buffer, Tensors
from ort_flash.bench.torch_calls import SdpaCalls
from ort_flash.bench.workload import attention_flops, kv_read_bytes

ROPE_THETA = 10000.0
NORM_EPS = 1e-6  # the op's default qk_norm_epsilon
NORM_INPUTS = ("q_norm_weight", "k_norm_weight")


def attrs(cfg: dict) -> dict:
    """The node's attributes as GenAI's builder writes them for a LLaMA-shaped model."""
    return dict(num_heads=cfg["hq"], kv_num_heads=cfg["hkv"], scale=cfg["d"] ** -0.5, softcap=0.0,
                local_window_size=cfg.get("window") or -1, do_rotary=1, rotary_interleaved=0,
                qk_norm_epsilon=NORM_EPS if cfg.get("qk_norm") else None,
                sliding_window_cache=1 if cfg.get("window") else None)


def positions(cfg: dict) -> tuple[int, int]:
    """(first position of the new tokens, total keys) of the call."""
    if cfg["phase"] == "prefill":
        return 0, cfg["seqlen"]
    return cfg["cache"] - 1, cfg["cache"]


def shifts(cfg: dict) -> bool:
    """Whether a call moves every row of a full window-sized cache (a decode step past W)."""
    return bool(cfg.get("window")) and cfg["phase"] == "decode" and cfg["cache"] > cfg["window"]


def work(cfg: dict) -> tuple[float, float]:
    """(FLOPs, bytes of K and V read) of the call's attention: a first prompt's causal N²/2
    query-key pairs, N·W - W²/2 under a window W < N; a decode step reads its T keys, at most W."""
    b, hq, n, d = cfg["batch"], cfg["hq"], cfg["seqlen"], cfg["d"]
    total = positions(cfg)[1]
    w = cfg.get("window") or total
    keys = min(total, w)
    if cfg["phase"] == "prefill":
        flops = attention_flops(b, hq, n, n, d, causal=True)
        if n > w:
            flops *= (n * w - w * w / 2) / (n * n / 2)
    else:
        flops = attention_flops(b, hq, n, keys, d)
    return flops, kv_read_bytes(b, cfg["hkv"], keys, d, cfg["dtype"])


def set_bytes(cfg: dict) -> float:
    """Bytes of one input set: the packed QKV and both caches (and the copies of the keys a
    shifting call attends, ``attention_inputs``)."""
    size = 4 if cfg["dtype"] == "float32" else 2
    qkv = cfg["batch"] * cfg["seqlen"] * (cfg["hq"] + 2 * cfg["hkv"]) * cfg["d"]
    rows = cfg["buffer"] * (2 if shifts(cfg) else 1)
    return float(size * (qkv + 2 * cfg["batch"] * cfg["hkv"] * rows * cfg["d"]))


def rotary_tables(buffer: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (buffer, d/2): LLaMA's angles pos · theta^(-2i/d)."""
    inv = ROPE_THETA ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(buffer, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang), np.sin(ang)


def make_sets(t: Tensors, cfg: dict, n: int) -> tuple[list[dict], dict]:
    b, s, hq, hkv, d, m = cfg["batch"], cfg["seqlen"], cfg["hq"], cfg["hkv"], cfg["d"], cfg["buffer"]
    dt = cfg["dtype"]
    sets = [{"qkv": t.randn((b, s, (hq + 2 * hkv) * d), dt), "k_cache": t.randn((b, hkv, m, d), dt),
             "v_cache": t.randn((b, hkv, m, d), dt)} for _ in range(n)]
    total = positions(cfg)[1]
    cos, sin = rotary_tables(max(m, total), d)  # a window-sized buffer is shorter than the positions
    shared = {"cos": t.values(cos, dt), "sin": t.values(sin, dt),
              "seqlens": t.values(np.full(b, total - 1, dtype=np.int32), "int32"),
              "total": t.values(np.array(total, dtype=np.int32), "int32", device="cpu")}
    if cfg.get("sinks"):  # gpt-oss's attention sinks: one logit per query head
        shared["head_sink"] = t.values(np.random.default_rng(0).standard_normal(hq), dt)
    if cfg.get("qk_norm"):  # Qwen3's per-head RMS norms of Q and K
        rng = np.random.default_rng(1)
        for name in NORM_INPUTS:
            shared[name] = t.values(1 + 0.25 * rng.standard_normal(d), dt)
    return sets, shared


# -- the function every peer computes, restated as plain attention (for sdpa and the checks) ---------

def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _cat(xs, axis: int):
    if _is_torch(xs[0]):
        import torch
        return torch.cat(xs, axis)
    return np.concatenate(xs, axis)


def _f32(x):
    return x.float() if _is_torch(x) else np.asarray(x, np.float32)


def _cast(x, like):
    return x.to(like.dtype) if _is_torch(x) else x.astype(like.dtype)


def _contiguous(x):
    return x.contiguous() if _is_torch(x) else np.ascontiguousarray(x)


def clone(x):
    """A copy of a tensor (torch or numpy), never a view."""
    return x.clone() if _is_torch(x) else np.array(x, copy=True)


def _rms_norm(x, w):
    """x (B, S, H, D) / sqrt(mean(x^2) + eps) * w (D,), in float32."""
    x = _f32(x)
    if _is_torch(x):
        import torch
        w = torch.as_tensor(np.asarray(w, np.float32), device=x.device) if not _is_torch(w) else w.float()
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + NORM_EPS) * w
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + NORM_EPS) * _f32(w)


def _rotate(x, cos, sin):
    """Half-split rotary of x (B, S, H, D) by cos/sin (S, D/2), in float32."""
    half = cos.shape[-1]
    if _is_torch(x) and not _is_torch(cos):  # CPU tables are numpy (Tensors.values), bfloat16 ml_dtypes too
        import torch
        cos, sin = (torch.as_tensor(np.asarray(t, np.float32), device=x.device) for t in (cos, sin))
    c, s = _f32(cos)[None, :, None, :], _f32(sin)[None, :, None, :]
    x = _f32(x)
    a, b = x[..., :half], x[..., half:2 * half]
    return _cat([a * c - b * s, b * c + a * s, x[..., 2 * half:]], -1)


def attention_inputs(cfg: dict, s: dict, shared: dict) -> tuple[Buffer, Buffer, Buffer, Buffer, Buffer]:
    """(q (B, Hq, S, D), k, v (B, Hkv, T, D), k_new, v_new (B, Hkv, S, D)) of the call: Q and the
    new K rotated at their positions, K/V the keys the call attends (T = total). Decode: the new
    row is written into the caches here, and k / v are views of the caches' first C rows; past a
    window-sized cache (``shifts``) they are copies of its rows but the oldest, then the new row:
    the W keys the call attends, and the cache after it."""
    b, sq, hq, hkv, d = cfg["batch"], cfg["seqlen"], cfg["hq"], cfg["hkv"], cfg["d"]
    start, total = positions(cfg)
    raw = s["qkv"].data.reshape(b, sq, hq + 2 * hkv, d)
    cos, sin = shared["cos"].data[start:start + sq], shared["sin"].data[start:start + sq]
    q, k = raw[:, :, :hq], raw[:, :, hq:hq + hkv]
    if "q_norm_weight" in shared:  # normed before the rotary, rounded once after it
        q, k = _rms_norm(q, shared["q_norm_weight"].data), _rms_norm(k, shared["k_norm_weight"].data)
    q = _contiguous(_cast(_rotate(q, cos, sin), raw).swapaxes(1, 2))
    k_new = _contiguous(_cast(_rotate(k, cos, sin), raw).swapaxes(1, 2))
    v_new = _contiguous(raw[:, :, hq + hkv:].swapaxes(1, 2))
    dev, dt = s["qkv"].device, cfg["dtype"]

    def buf(x):
        return Buffer(x, tuple(x.shape), dt, dev)
    if cfg["phase"] == "prefill":
        return buf(q), buf(k_new), buf(v_new), buf(k_new), buf(v_new)
    if shifts(cfg):
        k, v = (_cat([s[c].data[:, :, 1:], new], 2) for c, new in (("k_cache", k_new), ("v_cache", v_new)))
        return buf(q), buf(k), buf(v), buf(k_new), buf(v_new)
    s["k_cache"].data[:, :, start:total] = k_new
    s["v_cache"].data[:, :, start:total] = v_new
    return (buf(q), buf(s["k_cache"].data[:, :, :total]), buf(s["v_cache"].data[:, :, :total]),
            buf(k_new), buf(v_new))


def cache_writes(cfg: dict, s: dict) -> tuple[slice, object, object]:
    """(the buffer rows a call on set ``s`` writes, the K and V it writes there), from the set's
    ``ref`` (``attention_inputs``, taken before any call): the new rows at their positions, a longer
    prompt's last W in a window-sized cache, every row of a shifting one."""
    _, k, v, k_new, v_new = (x.data for x in s["ref"])
    if shifts(cfg):
        return slice(0, cfg["window"]), k, v
    start = positions(cfg)[0]
    n = min(cfg["seqlen"], cfg.get("window") or cfg["seqlen"])
    return slice(start, start + n), k_new[:, :, cfg["seqlen"] - n:], v_new[:, :, cfg["seqlen"] - n:]


# -- peers ---------------------------------------------------------------------------------------------

def copies(ctx: Context, cfg: dict) -> int:
    """Nodes per session run under CUDA graphs (layered.copies), the call timed as the larger of
    its FLOPs and its K/V read."""
    flops, kv = work(cfg)
    return layered.copies(ctx, max(flops / layered.RATE_FLOPS, kv / layered.RATE_BYTES))


def _io(ctx: Context, cfg: dict, sets: list[dict], shared: dict):
    ys = [ctx.tensors.empty((cfg["batch"], cfg["seqlen"], cfg["hq"] * cfg["d"]), cfg["dtype"]) for _ in sets]
    feeds = [{"query": s["qkv"], "past_key": s["k_cache"], "past_value": s["v_cache"],
              "seqlens_k": shared["seqlens"], "total_sequence_length": shared["total"],
              "cos_cache": shared["cos"], "sin_cache": shared["sin"],
              **{n: shared[n] for n in ("head_sink", *NORM_INPUTS) if n in shared}} for s in sets]
    outs = [{"output": y, "present_key": s["k_cache"], "present_value": s["v_cache"]} for s, y in zip(sets, ys)]
    return feeds, outs, ys


def session(ctx: Context, cfg: dict, sets: list[dict], shared: dict, domain: str, *, n: int | None = None):
    """A bound session of the one-node model in ``domain`` (ONNX Runtime's graph optimizations
    off, as every baseline): ``n`` copies of the node per run (default ``copies``); n = 1 with no
    CUDA graph is the plain session the correctness guard and the kernel probe run."""
    feeds, outs, ys = _io(ctx, cfg, sets, shared)
    model = gqa_graphs.gqa_model(feeds[0], domain, **attrs(cfg))
    kw = dict(custom_ops=domain == "ort_flash", optimize=False)
    if n is None:
        run = layered.layered_session(ctx, copies(ctx, cfg), model, feeds, outs, **kw)
    else:
        run = BoundSession(model, ctx.device, feeds, outs, stream=ctx.stream, **kw)
    run.ys = ys
    run.output = lambda: _bnsh_from_bsh(ys[0], cfg["hq"])
    return run


DOMAINS = {"ort_flash": "ort_flash", "ort_gqa": "com.microsoft"}  # the peers that run the GQA node


def ort_flash(ctx: Context, cfg: dict, sets: list[dict], shared: dict):
    return session(ctx, cfg, sets, shared, DOMAINS["ort_flash"])


def ort_gqa(ctx: Context, cfg: dict, sets: list[dict], shared: dict):
    return session(ctx, cfg, sets, shared, DOMAINS["ort_gqa"])


def ort_flash_fa(ctx: Context, cfg: dict, sets: list[dict], shared: dict):
    if cfg.get("window"):
        raise Unsupported("the plain op has no window-sized cache")
    if cfg["phase"] != "prefill":
        raise Unsupported("the plain op is timed on first prompts only")
    if "head_sink" in shared:
        raise Unsupported("FlashAttention has no attention sinks")
    refs = [s["ref"] for s in sets]
    ys = [ctx.tensors.empty(q.shape, cfg["dtype"]) for q, *_ in refs]
    model = onnx_graphs.flash_attention(cfg["dtype"], {"Q": 4, "K": 4, "V": 4}, {"Y": 4}, is_causal=1)
    run = layered.layered_session(ctx, copies(ctx, cfg), model, [{"Q": q, "K": k, "V": v} for q, k, v, *_ in refs],
                                  [{"Y": y} for y in ys], custom_ops=True)
    run.output = lambda: ys[0].data
    return run


def sdpa(ctx: Context, cfg: dict, sets: list[dict], shared: dict):
    if cfg.get("window"):
        raise Unsupported("torch SDPA has no window-sized cache")
    if ctx.tensors.torch is None:
        raise Unsupported("torch is not installed")
    group = cfg["hq"] // cfg["hkv"]
    refs = [s["ref"] for s in sets]
    ctx.require(sum(group * (k.nbytes + v.nbytes) for _, k, v, *_ in refs), "K/V repeated to Hq heads")
    qs, ks, vs = [], [], []
    for q, k, v, *_ in refs:
        qs.append(q)
        for src, dst in ((k, ks), (v, vs)):
            rep = src.data.repeat_interleave(group, dim=1)
            dst.append(Buffer(rep, tuple(rep.shape), src.dtype, src.device))
    # Prefill: square causal (is_causal); decode: one query row sees every key (no mask).
    return SdpaCalls(qs, ks, vs, backend="cudnn", causal=cfg["phase"] == "prefill")


def peers_for(device: str) -> dict:
    peers = {"ort_flash": ort_flash, "ort_gqa": ort_gqa, "ort_flash_fa": ort_flash_fa}
    if device == "cuda":
        peers["sdpa"] = sdpa  # plain attention (no sinks)
    return peers
