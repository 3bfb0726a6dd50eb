"""aot/sink_rescale.py, GroupQueryAttention's attention sinks on the GPU, run by Triton's CPU
interpreter against numpy in float64: each row y of head h, scaled in place by
1 / (1 + exp(sink_h - lse)) (sink_h 0 without head_sink), 0 where lse = -inf. Odd shapes (head
sizes below their BLOCK_D such as 40 and 80, query rows not a multiple of the tile), two output
layouts with gaps between rows, NaN-poisoned gaps and margins that must stay NaN (a write outside
a row fails), a NaN-filled sink buffer where the call has none (a read of it fails). Each case runs
in a subprocess under TRITON_INTERPRET=1 (Triton reads it when imported), as
tests/test_gqa_prepare_kernel.py does. Also the kernel's place in the variant table and the
build."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from _paths import run_interpreted

GUARD = 32  # NaN elements before and after every buffer

# b, sq, hq, d; layout: "bshd" (GroupQueryAttention's output (B, S, Hq, D)) or "bhsd"; pad: elements
# past D in each row's storage (NaN, never written); sinks: head_sink given (else smooth_softmax's
# 0); empty: the fraction of rows with lse = -inf; rows: BLOCK_M (None: the variant table's);
# extreme: a head_sink of -inf and one of +60, lse values far from the sinks.
CASES = [
    dict(b=2, sq=37, hq=6, d=80, dtype="float16", sinks=True, layout="bshd"),
    dict(b=2, sq=37, hq=6, d=80, dtype="bfloat16", sinks=True, layout="bshd", pad=8),
    dict(b=3, sq=1, hq=8, d=64, dtype="float16", sinks=False, layout="bshd"),  # decode, smooth_softmax
    dict(b=1, sq=21, hq=5, d=40, dtype="bfloat16", sinks=False, layout="bhsd", pad=3, rows=4),
    dict(b=2, sq=9, hq=3, d=256, dtype="float16", sinks=True, layout="bhsd", extreme=True),
    dict(b=1, sq=19, hq=4, d=128, dtype="bfloat16", sinks=True, layout="bshd", empty=0.4, extreme=True),
    dict(b=2, sq=13, hq=2, d=96, dtype="float32", sinks=True, layout="bshd", pad=5),
    dict(b=1, sq=3, hq=3, d=200, dtype="float32", sinks=False, layout="bhsd", empty=0.5),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_sink_rescale_matches_numpy(case):
    run_interpreted(__file__, case)


def block_d(d: int) -> int:
    """The BLOCK_D the launcher picks for head size d (cpp/gqa_launch.cc gqa_kernel)."""
    from aot import variants

    return min(x for x in variants.SINK_HEAD_DIMS if x >= d)


def expected(y: np.ndarray, lse: np.ndarray, sink: np.ndarray) -> np.ndarray:
    """y (B, Hq, Sq, D) float64 rescaled by the sinks: lse (B, Hq, Sq), sink (Hq,)."""
    with np.errstate(over="ignore", invalid="ignore"):
        factor = 1.0 / (1.0 + np.exp(sink[None, :, None] - lse))
    factor = np.where(np.isneginf(lse), 0.0, factor)
    return y * factor[..., None]


def check_case(c: dict) -> None:
    import torch

    from test_gqa_prepare_kernel import _round_bf16_like_gpu
    from test_kernel_interpreter import _patch_interpreter
    _patch_interpreter()
    _round_bf16_like_gpu()
    from aot import variants
    from aot.sink_rescale import sink_rescale

    c = dict(dict(pad=0, empty=0.15, rows=None, extreme=False), **c)
    dt = getattr(torch, c["dtype"])
    rng = np.random.default_rng()
    b, sq, hq, d = (c[k] for k in ("b", "sq", "hq", "d"))
    dp = d + c["pad"]

    def guarded(n, dtype):
        whole = torch.full((n + 2 * GUARD,), float("nan"), dtype=dtype)
        return whole, whole[GUARD:GUARD + n]

    # Y's storage: rows of dp elements, (B, S, Hq) or (B, Hq, S) of them; the first d of a row hold
    # the attention's output, the rest stay NaN.
    y_all, y_flat = guarded(b * sq * hq * dp, dt)
    if c["layout"] == "bshd":
        y_store = y_flat.view(b, sq, hq, dp)
        y = y_store.permute(0, 2, 1, 3)  # (B, Hq, S, dp) view
    else:
        y_store = y_flat.view(b, hq, sq, dp)
        y = y_store
    y[..., :d] = torch.from_numpy(rng.standard_normal((b, hq, sq, d), dtype=np.float32)).to(dt)
    y0 = y[..., :d].float().numpy().astype(np.float64)

    sink_np = (2 * rng.standard_normal(hq)).astype(np.float32)
    if c["extreme"]:
        sink_np[0], sink_np[-1] = -np.inf, 60.0
    sinks_all, sinks = guarded(hq, dt)
    if c["sinks"]:
        sinks.copy_(torch.from_numpy(sink_np).to(dt))
    sink_used = sinks.float().numpy().astype(np.float64) if c["sinks"] else np.zeros(hq)

    # lse around each head's sink (factors across (0, 1)), some rows -inf (no visible key).
    lse_np = sink_used[None, :, None] + rng.uniform(-6, 6, (b, hq, sq))
    lse_np = np.where(np.isfinite(lse_np), lse_np, rng.uniform(-6, 6, (b, hq, sq)))
    if c["extreme"]:
        lse_np[:, :, ::3] = rng.choice([-80.0, 80.0], (b, hq, len(range(0, sq, 3))))
    empty = rng.random((b, hq, sq)) < c["empty"]
    empty.flat[rng.integers(empty.size)] = True
    lse_np = np.where(empty, -np.inf, lse_np).astype(np.float32)
    lse_all, lse = guarded(b * hq * sq, torch.float32)
    lse.copy_(torch.from_numpy(lse_np.reshape(-1)))

    bd = block_d(d)
    rows = c["rows"] or variants.get_fwd_config(90, variants.Variant(
        "fp16", bd, False, "none", False, "tf32", "sink_rescale")).block_m
    st = y_store.stride()
    strides = (st[0], st[2], st[1]) if c["layout"] == "bshd" else st[:3]  # (batch, head, row)
    grid = (b * hq * -(-sq // rows),)  # cpp/gqa_launch.cc's
    sink_rescale[grid](y_flat, lse, sinks, int(c["sinks"]), hq, sq, d, *strides, BLOCK_M=rows, BLOCK_D=bd)

    got = y[..., :d].float().numpy()
    want = torch.from_numpy(expected(y0, lse_np.astype(np.float64), sink_used).astype(np.float32)).to(dt)
    want = want.float().numpy()
    assert not np.isnan(got).any(), "a row element became NaN"
    assert (got[empty] == 0).all(), "a row with lse = -inf is not 0"
    # One rounding to the dtype from fp32 arithmetic against one from float64: within one ulp (for
    # float16 subnormals, one step of 2^-24).
    ulp = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -21}[c["dtype"]]
    tiny = {"float16": 2.0 ** -24, "bfloat16": 1e-38, "float32": 1e-38}[c["dtype"]]
    np.testing.assert_allclose(got, want, rtol=ulp, atol=tiny, err_msg="rescaled output")
    assert torch.isnan(y[..., d:].float()).all(), "a write past the head size"
    for whole in (y_all, sinks_all, lse_all):
        assert torch.isnan(whole[:GUARD].float()).all() and torch.isnan(whole[-GUARD:].float()).all(), \
            "a write outside a buffer"
    if not c["sinks"]:
        assert torch.isnan(sinks.float()).all()


def test_sink_rescale_variants():
    """One cubin per (dtype, BLOCK_D) for every arch (min arch 0: sm_80 and sm_90), never merged
    into a superset, its kind code fixed once appended (codes are append-only), typed by the
    contract's SinkRescale ABI, and compiled from its own source (an edit to it leaves the other
    cubins cached)."""
    from aot import build, contract
    from aot import variants as v

    s = [x for x in v.all_variants() if x.kind == "sink_rescale"]
    assert s == v.sink_variants() and [x for x in v.all_combinations() if x.kind == "sink_rescale"] == s
    assert sorted((x.dtype, x.head_dim) for x in s) == sorted(
        (t, hd) for t in ("fp16", "bf16", "fp32") for hd in (64, 128, 256))
    assert v.SINK_HEAD_DIMS[-1] == 256  # the CUDA op's largest head size (cpp/gqa_shapes.cc)
    assert contract.KIND_CODES["sink_rescale"] == 10
    assert contract.KIND_CODES["fwd_fp8"] == 9  # the codes before it keep their values
    for x in s:
        assert x.min_arch == 0 and not v.edge_loop(x) and x.name == f"sink_rescale_{x.dtype}_d{x.head_dim}"
        cfg = v.get_fwd_config(90, x)
        assert cfg == v.get_fwd_config(80, x) and cfg.block_m * x.head_dim == v.SINK_ELEMENTS
        _, _, _, sig, constexprs = build.triton_source(x, 90, cfg)
        assert constexprs == {"BLOCK_M": cfg.block_m, "BLOCK_D": x.head_dim}
        elem = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}[x.dtype]
        assert sig["Y"] == sig["Sinks"] == elem and sig["Lse"] == "*fp32" and sig["has_sinks"] == "i32"
        assert sig["stride_ym"] == "i64"
    from aot.sink_rescale import sink_rescale
    assert build.KERNELS["sink_rescale"] is sink_rescale
    assert build.source_hash("sink_rescale") not in {build.source_hash(k) for k in contract.KIND_ABIS
                                                      if k not in ("sink_rescale", "fwd_gluon")}


if __name__ == "__main__":
    check_case(json.loads(sys.argv[1]))
