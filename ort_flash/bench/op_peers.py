"""The op-level peers on prefill shapes (Sq = Skv = N): each builder takes the shared input sets
(Q, K, V as (B, H, N, D) buffers) and returns a runner for ``measure``; its ``output()`` is set
0's result viewed as (B, H, N, D) for the agreement check.

| peer             | what runs                                                                  |
|------------------|----------------------------------------------------------------------------|
| ort_flash        | ort_flash.FlashAttention (4-D BNSH) in an ORT session, IOBinding            |
| ort_flash_kernel | the same kernel alone, launched through ort_flash._C (no ORT)               |
| ort_flash_fp8    | ort_flash.FlashAttention with attention_precision="fp8" (CUDA): on sm_90 the FP8 path (prepare kernels and e4m3 attention), its error checked against FP8_LIMIT |
| ort_mha          | com.microsoft.MultiHeadAttention, 3-D BSH inputs (its native layout), unidirectional=causal |
| onnx_attention   | ONNX Attention-23 (4-D BNSH, is_causal) run by ORT                         |
| unfused          | MatMul-Softmax-MatMul (+ additive causal mask input) with ORT graph optimizations off |
| sdpa_cudnn/flash | torch SDPA forced onto one backend (CUDA); sdpa on CPU                     |

With CUDA graphs (the suite's default on CUDA) the four ONNX Runtime peers run a model of
``copies`` nodes per session run (``layered.layered_session``: as a model's layers run),
so a short call is timed as device time, as torch's graphs time the torch peers; without
(``--cuda-graph off``) one node per run, its launch cost included.
"""
from __future__ import annotations

import numpy as np

from ort_flash.bench import layered, onnx_graphs
from ort_flash.bench.measure import Context
from ort_flash.bench.ort_session import Unsupported
from ort_flash.bench.tensors import Buffer
from ort_flash.bench.torch_calls import KernelCalls, SdpaCalls
from ort_flash.bench.workload import attention_flops


def copies(ctx: Context, cfg: dict) -> int:
    """Nodes per session run under CUDA graphs (layered.copies), the call timed as its FLOPs."""
    n = cfg["seqlen"]
    return layered.copies(ctx, attention_flops(cfg["batch"], cfg["heads"], n, n, cfg["d"], cfg["causal"])
                          / layered.RATE_FLOPS)


def _session(ctx: Context, cfg: dict, model: bytes, feeds: list[dict], outs: list[dict], **kw):
    return layered.layered_session(ctx, copies(ctx, cfg), model, feeds, outs, **kw)


def _bnsh_from_bsh(buf, heads):
    """(B, S, H*D) -> a (B, H, S, D) view."""
    b, s, hd = buf.shape
    x = buf.data.reshape(b, s, heads, hd // heads)
    return x.transpose(0, 2, 1, 3) if isinstance(x, np.ndarray) else x.transpose(1, 2)


def _bsh_from_bnsh(x):
    """(B, H, S, D) -> (B, S, H*D)."""
    b, h, s, d = x.shape
    x = x.transpose(0, 2, 1, 3) if isinstance(x, np.ndarray) else x.transpose(1, 2)
    return x.reshape(b, s, h * d)


# The FP8 peer's limit on the spot check's relative L2 error (the fp16/bf16 peers keep
# spot_check.LIMITS): e4m3 keeps 3 mantissa bits, so P and V carry a few percent of rounding each,
# which the output's average over keys keeps at a few percent; a wrong head, scale or layout
# gives tens of percent.
FP8_LIMIT = 0.1


def ort_flash(ctx: Context, cfg: dict, sets: list[dict], **attrs):
    t = ctx.tensors
    ys = [t.empty(s["q"].shape, cfg["dtype"]) for s in sets]
    model = onnx_graphs.flash_attention(cfg["dtype"], {"Q": 4, "K": 4, "V": 4}, {"Y": 4},
                                        is_causal=int(cfg["causal"]), **attrs)
    run = _session(ctx, cfg, model, [{"Q": s["q"], "K": s["k"], "V": s["v"]} for s in sets],
                   [{"Y": y} for y in ys], custom_ops=True)
    run.output = lambda: ys[0].data
    return run


def ort_flash_fp8(ctx: Context, cfg: dict, sets: list[dict]):
    """ort_flash with the FP8 opt-in (on a GPU without FP8 kernels it runs in the dtype and says so)."""
    run = ort_flash(ctx, cfg, sets, attention_precision="fp8")
    run.error_limit = FP8_LIMIT
    return run


def kernel(ctx: Context, cfg: dict, sets: list[dict], **kernel_args):
    """The fused kernel alone (ort_flash._C), on the same input sets; kernel_args default to
    the config's causal flag."""
    t = ctx.tensors
    ys = [t.empty(s["q"].shape, cfg["dtype"]) for s in sets]
    kernel_args.setdefault("causal", cfg.get("causal", False))
    run = KernelCalls([s["q"] for s in sets], [s["k"] for s in sets], [s["v"] for s in sets], ys,
                      device=ctx.device, stream=ctx.stream, **kernel_args)
    run.info = {"variant": "/".join(map(str, run.variant)), "tile": run.tile_config()}
    if ctx.device == "cuda":
        kind, splits, _, fused = run._C.launch_plan(run.params[0])
        merge = (", fused merge" if fused else ", combine kernel") if splits > 1 else ""
        run.info["plan"] = f"{kind}, {splits} KV split{'s' if splits > 1 else ''}{merge}"
    return run


def ort_mha(ctx: Context, cfg: dict, sets: list[dict]):
    t = ctx.tensors
    heads = cfg["heads"]
    bsh = [{n: t.like(s[n], _bsh_from_bnsh) for n in ("q", "k", "v")} for s in sets]
    ys = [t.empty(x["q"].shape, cfg["dtype"]) for x in bsh]
    model = onnx_graphs.multi_head_attention(cfg["dtype"], heads, cfg["causal"])
    run = _session(ctx, cfg, model, [{"query": x["q"], "key": x["k"], "value": x["v"]} for x in bsh],
                   [{"output": y} for y in ys])
    run.output = lambda: _bnsh_from_bsh(ys[0], heads)
    run.keep = bsh
    return run


def onnx_attention(ctx: Context, cfg: dict, sets: list[dict]):
    t = ctx.tensors
    ys = [t.empty(s["q"].shape, cfg["dtype"]) for s in sets]
    model = onnx_graphs.onnx_attention(cfg["dtype"], cfg["causal"])
    run = _session(ctx, cfg, model, [{"Q": s["q"], "K": s["k"], "V": s["v"]} for s in sets],
                   [{"Y": y} for y in ys])
    run.output = lambda: ys[0].data
    return run


def unfused(ctx: Context, cfg: dict, sets: list[dict]):
    t = ctx.tensors
    b, h, n, d = sets[0]["q"].shape
    ys = [t.empty(s["q"].shape, cfg["dtype"]) for s in sets]
    model = onnx_graphs.unfused_attention(cfg["dtype"], d ** -0.5, mask=cfg["causal"])
    feeds = [{"Q": s["q"], "K": s["k"], "V": s["v"]} for s in sets]
    mask = None
    if cfg["causal"]:
        mask = causal_additive_mask(t, n, cfg["dtype"])
        for f in feeds:
            f["attn_mask"] = mask
    run = _session(ctx, cfg, model, feeds, [{"Y": y} for y in ys], optimize=False)
    run.output = lambda: ys[0].data
    run.keep = mask
    return run


def causal_additive_mask(t, n: int, dtype: str):
    """(1, 1, n, n): 0 on and below the diagonal, the dtype's lowest finite value above."""
    if t.torch is not None:
        torch = t.torch
        tdt = getattr(torch, dtype)
        m = torch.full((n, n), torch.finfo(tdt).min, dtype=tdt, device=t.device).triu_(1)
        return Buffer(m.view(1, 1, n, n), (1, 1, n, n), dtype, t.device)
    low = np.finfo(np.float16 if dtype == "float16" else np.float32).min
    return t.values(np.triu(np.full((n, n), low, np.float32), 1).reshape(1, 1, n, n), dtype)


def sdpa(backend: str):
    def build(ctx: Context, cfg: dict, sets: list[dict]):
        if ctx.tensors.torch is None:
            raise Unsupported("torch is not installed")
        return SdpaCalls([s["q"] for s in sets], [s["k"] for s in sets], [s["v"] for s in sets],
                         backend=backend, causal=cfg["causal"])
    return build


def peers_for(device: str) -> dict:
    """Peer name -> builder, ours first (their output is the agreement reference)."""
    peers = {"ort_flash": ort_flash, "ort_flash_kernel": kernel, "ort_mha": ort_mha,
             "onnx_attention": onnx_attention, "unfused": unfused}
    if device == "cuda":
        peers.update(ort_flash_fp8=ort_flash_fp8, sdpa_cudnn=sdpa("cudnn"), sdpa_flash=sdpa("flash"))
    else:
        peers.update(sdpa=sdpa("default"))
    return peers
