"""The decode peers: Sq query tokens (1 or 4) against a full KV cache of L tokens, GQA heads.

Shared per input set: ``q`` (B, Hq, Sq, D), ``k`` / ``v`` the cache (B, Hkv, L, D) whose last Sq
rows are the new tokens, ``lens`` int64 (B,) = L on the device. Every peer computes the same
function (bottom-right causal, so for Sq = 1 every key is seen), except MHA where noted.

| peer             | what runs                                                                   |
|------------------|-----------------------------------------------------------------------------|
| ort_flash        | FlashAttention(Q, K=cache, V=cache, nonpad_kv_seqlen=L), is_causal: reads the cache in place |
| ort_flash_run    | the same, one node per session run (ONNX Runtime's per-run cost included)    |
| ort_flash_past   | FlashAttention(Q, K_new, V_new, past_key, past_value) → present_*: the ONNX-standard cache path, which copies the cache into present every step |
| ort_flash_kernel | the kernel alone through _C (seqlens_k = L)                                 |
| ort_gqa          | com.microsoft.GroupQueryAttention, past/present sharing one buffer (the cache) |
| ort_mha          | com.microsoft.MultiHeadAttention with the cache as 4-D BNSH key/value, heads repeated to Hq (MHA has no GQA); not causal |
| sdpa*            | torch SDPA, enable_gqa, causal_lower_right for Sq > 1                        |

**Layers.** With CUDA graphs, ort_flash, ort_gqa and ort_mha run a model of up to ``layered.LAYERS``
copies of their node (``onnx_graphs.replicate``; fewer at the largest caches, see ``_layers``),
node j of graph i reading input set (i + j) mod sets, as a model's layers run in one decode
step; a row's time is a run's over the copies. That is the
timing class of the torch peers and of ort_flash_kernel (a torch CUDA graph of >= 32 calls):
device time, no per-run cost spread over one call. ort_flash_run and ort_flash_past keep one node
per run (ort_flash_past's present copies would not fit ``layered.LAYERS`` times at the large caches).
"""
from __future__ import annotations

import numpy as np

from ort_flash.bench import gqa_graphs, layered, onnx_graphs, op_peers
from ort_flash.bench.layered import layered_session, session
from ort_flash.bench.measure import Context
from ort_flash.bench.op_peers import _bnsh_from_bsh, _bsh_from_bnsh
from ort_flash.bench.ort_session import Unsupported
from ort_flash.bench.tensors import Buffer
from ort_flash.bench.torch_calls import SdpaCalls
from ort_flash.bench.workload import kv_read_bytes



def _layers(ctx: Context, cfg: dict) -> int:
    """Copies of the node per run (layered.copies: down to 1 from a few GB of cache, where 32-copy
    runs of 60 ms measured a 21 % spread, ort_flash_run 1 %), the call timed as its cache read."""
    call_s = kv_read_bytes(cfg["batch"], cfg["hkv"], cfg["cache"], cfg["d"], cfg["dtype"]) / layered.RATE_BYTES
    return layered.copies(ctx, call_s)


def _slice_seq(t, buf: Buffer, start: int, stop: int) -> Buffer:
    return t.like(buf, lambda x: x[:, :, start:stop])


def _ort_flash(ctx: Context, cfg: dict, sets: list[dict], layers: int):
    t = ctx.tensors
    ys = [t.empty(s["q"].shape, cfg["dtype"]) for s in sets]
    model = onnx_graphs.flash_attention(cfg["dtype"], {"Q": 4, "K": 4, "V": 4, "nonpad_kv_seqlen": 1},
                                        {"Y": 4}, is_causal=1)
    feeds = [{"Q": s["q"], "K": s["k"], "V": s["v"], "nonpad_kv_seqlen": s["lens"]} for s in sets]
    outs = [{"Y": y} for y in ys]
    run = layered_session(ctx, layers, model, feeds, outs, custom_ops=True)
    run.output = lambda: ys[0].data
    return run


def ort_flash(ctx: Context, cfg: dict, sets: list[dict]):
    return _ort_flash(ctx, cfg, sets, _layers(ctx, cfg))


def ort_flash_run(ctx: Context, cfg: dict, sets: list[dict]):
    if _layers(ctx, cfg) == 1:
        raise Unsupported("the same as ort_flash here (one node per run)")
    return _ort_flash(ctx, cfg, sets, 1)


def ort_flash_past(ctx: Context, cfg: dict, sets: list[dict]):
    t = ctx.tensors
    sq, cache = cfg["sq"], cfg["cache"]
    ctx.require(sum(4 * s["k"].nbytes for s in sets), "past copies and present outputs")
    feeds, outs, ys = [], [], []
    for s in sets:
        f = {"Q": s["q"], "K": _slice_seq(t, s["k"], cache - sq, cache),
             "V": _slice_seq(t, s["v"], cache - sq, cache),
             "past_key": _slice_seq(t, s["k"], 0, cache - sq), "past_value": _slice_seq(t, s["v"], 0, cache - sq)}
        y = t.empty(s["q"].shape, cfg["dtype"])
        feeds.append(f)
        ys.append(y)
        outs.append({"Y": y, "present_key": t.empty(s["k"].shape, cfg["dtype"]),
                     "present_value": t.empty(s["v"].shape, cfg["dtype"])})
    model = onnx_graphs.flash_attention(cfg["dtype"], {n: 4 for n in ("Q", "K", "V", "past_key", "past_value")},
                                        {"Y": 4, "present_key": 4, "present_value": 4}, is_causal=1)
    run = session(ctx, model, feeds, outs, custom_ops=True)
    run.output = lambda: ys[0].data
    return run


def kernel(ctx: Context, cfg: dict, sets: list[dict]):
    return op_peers.kernel(ctx, cfg, sets, causal=True, seqlens=[s["lens"] for s in sets])


def ort_gqa(ctx: Context, cfg: dict, sets: list[dict]):
    t = ctx.tensors
    b, sq, cache = cfg["batch"], cfg["sq"], cfg["cache"]
    if sq > 1 and b > 1:
        raise Unsupported("GroupQueryAttention with a past takes sequence_length > 1 only at "
                          "batch_size 1 (its contrib-op documentation)")
    feeds, outs, ys = [], [], []
    for s in sets:
        y = t.empty((b, sq, cfg["hq"] * cfg["d"]), cfg["dtype"])
        feeds.append({
            "query": t.like(s["q"], _bsh_from_bnsh),
            "key": t.like(s["k"], lambda x: _bsh_from_bnsh(x[:, :, cache - sq:])),
            "value": t.like(s["v"], lambda x: _bsh_from_bnsh(x[:, :, cache - sq:])),
            "past_key": s["k"], "past_value": s["v"],
            "seqlens_k": t.values(np.full(b, cache - 1), "int32"),
            "total_sequence_length": t.values(np.array(cache, dtype=np.int32), "int32", device="cpu"),
        })
        outs.append({"output": y, "present_key": s["k"], "present_value": s["v"]})  # shared buffer
        ys.append(y)
    model = gqa_graphs.gqa_model(feeds[0], num_heads=cfg["hq"], kv_num_heads=cfg["hkv"], causal=1)
    run = layered_session(ctx, _layers(ctx, cfg), model, feeds, outs)
    run.output = lambda: _bnsh_from_bsh(ys[0], cfg["hq"])
    return run


def ort_mha(ctx: Context, cfg: dict, sets: list[dict]):
    t = ctx.tensors
    group = cfg["hq"] // cfg["hkv"]
    ctx.require(sum(group * (s["k"].nbytes + s["v"].nbytes) for s in sets), "K/V repeated to Hq heads")
    feeds, outs, ys = [], [], []
    for s in sets:
        rep = (lambda x: x.repeat_interleave(group, dim=1)) if s["k"].is_torch else \
              (lambda x: np.repeat(x, group, axis=1))
        y = t.empty((cfg["batch"], cfg["sq"], cfg["hq"] * cfg["d"]), cfg["dtype"])
        feeds.append({"query": t.like(s["q"], _bsh_from_bnsh), "key": t.like(s["k"], rep),
                      "value": t.like(s["v"], rep)})
        outs.append({"output": y})
        ys.append(y)
    model = onnx_graphs.multi_head_attention(cfg["dtype"], cfg["hq"], causal=False, kv_rank=4)
    run = layered_session(ctx, _layers(ctx, cfg), model, feeds, outs)
    if cfg["sq"] == 1:  # with more query rows it is not causal, so it computes another function
        run.output = lambda: _bnsh_from_bsh(ys[0], cfg["hq"])
    return run


def sdpa(backend: str):
    def build(ctx: Context, cfg: dict, sets: list[dict]):
        if ctx.tensors.torch is None:
            raise Unsupported("torch is not installed")
        return SdpaCalls([s["q"] for s in sets], [s["k"] for s in sets], [s["v"] for s in sets],
                         backend=backend, causal=True, lower_right=True)
    return build


def peers_for(device: str) -> dict:
    peers = {"ort_flash": ort_flash, "ort_flash_run": ort_flash_run, "ort_flash_past": ort_flash_past,
             "ort_flash_kernel": kernel, "ort_gqa": ort_gqa, "ort_mha": ort_mha, "sdpa": sdpa("default")}
    if device == "cuda":
        peers.update(sdpa_flash=sdpa("flash"), sdpa_cudnn=sdpa("cudnn"))
    return peers
