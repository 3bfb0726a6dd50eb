"""aot/gqa_prepare.py run by Triton's CPU interpreter against a numpy model of what the CPU op
(cpp/gqa_call.cc run_gqa_cpu) does before its attention: the rotated Q, the present K/V rows
(shared buffer: only the new rows change; a present of its own: zeros, each row's past, the new
rows), the int64 total lengths and a first prompt's key mask. Outputs are poisoned and guarded by
poisoned margins: a write outside a buffer, or a value off by one bit, fails. Each case runs in a
subprocess under TRITON_INTERPRET=1 (Triton reads it when imported), as
tests/test_kernel_interpreter.py does."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _paths import child_env

ROOT = Path(__file__).resolve().parents[1]
GUARD = 64  # poisoned elements on each side of every output

# b, s, hq, hkv, d; total (total_sequence_length); seqlens (seqlens_k); past_len (the past
# buffer's length, 0: none); rotary: 0 none, 1 half-split, 2 interleaved; half (R / 2).
CASES = [
    # A GenAI first prompt: packed QKV, one shared static buffer, right padding.
    dict(b=2, s=7, hq=4, hkv=2, d=32, total=7, seqlens=[6, 3], past_len=11, shared=True, packed=True,
         rotary=1, half=16),
    # Decode with the shared buffer, interleaved rotary, position_ids.
    dict(b=3, s=1, hq=6, hkv=2, d=48, total=9, seqlens=[8, 2, 5], past_len=9, shared=True, rotary=2,
         half=8, position_ids=True, dtype="bfloat16"),
    # A continuation (chunked prefill) into a present of its own, partial rotary, fp32.
    dict(b=1, s=4, hq=2, hkv=1, d=64, total=13, seqlens=[12], past_len=9, rotary=1, half=8,
         dtype="float32"),
    # A separate present that grows (total = past + S), no rotary, head dim 80, odd heads.
    dict(b=2, s=3, hq=6, hkv=2, d=80, total=8, seqlens=[7, 4], past_len=5),
    # A first prompt without a past, separate present, padding, interleaved, position_ids[0, 0].
    dict(b=2, s=5, hq=2, hkv=2, d=32, total=5, seqlens=[4, 1], past_len=0, rotary=2, half=16,
         position_ids=True, packed=True),
    # Decode: positions outside cos_cache (unrotated), separate buffers.
    dict(b=2, s=1, hq=2, hkv=1, d=32, total=6, seqlens=[5, 3], past_len=6, rotary=1, half=16,
         position_ids=True, bad_positions=True),
    # Head dim 256 (the largest BLOCK_D), a first prompt with partial rotary, separate present.
    dict(b=1, s=3, hq=2, hkv=1, d=256, total=3, seqlens=[2], past_len=0, rotary=1, half=64,
         dtype="bfloat16"),
    # Hostile seqlens_k: negative, past total_sequence_length, INT32_MAX, fewer keys than new tokens.
    dict(b=5, s=2, hq=2, hkv=1, d=32, total=6, seqlens=[-7, 999999, 2147483647, 0, 5], past_len=6,
         shared=True, rotary=1, half=8, dtype="bfloat16"),
    dict(b=5, s=2, hq=2, hkv=1, d=32, total=6, seqlens=[-7, 999999, 2147483647, 0, 5], past_len=6,
         rotary=1, half=8, packed=True),
    dict(b=3, s=4, hq=2, hkv=1, d=32, total=4, seqlens=[-2, 4, 3], past_len=6, shared=True, rotary=1,
         half=16),
]


def _interpreted(case: dict) -> None:
    pytest.importorskip("torch", reason="the Triton interpreter runs on torch CPU tensors")
    pytest.importorskip("triton", reason="the kernel source needs Triton")
    env = child_env(TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, __file__, json.dumps(case)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_prepare_kernel_matches_cpu_op(case):
    _interpreted(case)


def lengths(c: dict) -> list[tuple[int, int, bool]]:
    """(T_b, past_b, valid) per batch row, as the kernel's _row_lengths and the CPU op's checks."""
    first = c["s"] == c["total"]
    plen = max(c["total"], c["past_len"])
    out = []
    for sk in c["seqlens"]:
        t = sk + 1
        past = 0 if first else t - c["s"]
        ok = 1 <= t <= c["total"] and past >= 0 and past + c["s"] <= plen
        out.append((t, past, ok) if ok else (0, 0, False))
    return out


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """cpp/gqa_call.cc rotate, in float32 (products rounded, then the sum, as the host does)."""
    x = x.astype(np.float32).copy()
    for i in range(cos.shape[0]):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + cos.shape[0])
        x1, x2 = x[..., a].copy(), x[..., b].copy()
        x[..., a] = x1 * cos[i] - x2 * sin[i]
        x[..., b] = x2 * cos[i] + x1 * sin[i]
    return x


def expected(c, q, k, v, past_k, past_v, pk0, pv0, cos, sin, pos_ids):
    """(q_rot, present_k, present_v, totals, mask) in float32 (rotations rounded to the dtype by
    the caller's cast) from the inputs as float32 numpy arrays (B, S, H, D) and (B, Hkv, L, D)."""
    s_len = c["s"]
    first = s_len == c["total"]
    pk, pv = pk0.copy(), pv0.copy()
    q_rot = q.copy()
    lens = lengths(c)
    for b, (t, past, ok) in enumerate(lens):
        if not c.get("shared"):
            pk[b], pv[b] = 0, 0
            n = min(past, c["past_len"])
            pk[b, :, :n], pv[b, :, :n] = past_k[b, :, :n], past_v[b, :, :n]
        for s in range(s_len):
            kk = k[b, s]
            if c.get("rotary"):
                if first:
                    pos = s + (pos_ids[0, 0] if pos_ids is not None else 0)
                else:
                    pos = pos_ids[b, s] if pos_ids is not None else past + s
                if 0 <= pos < cos.shape[0]:
                    q_rot[b, s] = rotate(q[b, s], cos[pos], sin[pos], c["rotary"] == 2)
                    kk = rotate(kk, cos[pos], sin[pos], c["rotary"] == 2)
            if ok:
                pk[b, :, past + s], pv[b, :, past + s] = kk, v[b, s]
    plen = pk.shape[2]
    mask = np.array([[j < t for j in range(plen)] for t, _, _ in lens], dtype=np.int8)
    totals = np.array([t for t, _, _ in lens], dtype=np.int64)
    return q_rot, pk, pv, totals, mask


def _round_bf16_like_gpu() -> None:
    """Triton 3.6's interpreter narrows float32 to bfloat16 by truncation; the GPU (cvt.rn, as
    Triton compiles it) and the CPU op round to nearest even: convert as they do."""
    import torch
    import triton.language as tl
    import triton.runtime.interpreter as interp

    original = interp._convert_float

    def convert(x, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16:
            t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)
            return t.view(torch.int16).numpy().view(np.uint16)
        return original(x, src, dst, rounding_mode)

    interp._convert_float = convert


def check_case(c: dict) -> None:
    import torch

    from test_kernel_interpreter import _patch_interpreter
    _patch_interpreter()
    _round_bf16_like_gpu()
    from aot.gqa_prepare import gqa_prepare

    c = dict(dict(dtype="float16", rotary=0, half=0, shared=False, packed=False, position_ids=False), **c)
    dt = getattr(torch, c["dtype"])
    rng = np.random.default_rng(sum(map(ord, json.dumps(c))))
    bsz, s_len, hq, hkv, d = (c[k] for k in ("b", "s", "hq", "hkv", "d"))
    first = s_len == c["total"]
    plen = max(c["total"], c["past_len"])
    max_pos = 3 * plen

    def rand(*shape):
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(dt)

    def guarded(n, dtype, fill):
        """A flat buffer of n elements between poisoned margins; returns (whole, the n in the middle)."""
        whole = torch.full((n + 2 * GUARD,), fill, dtype=dtype)
        return whole, whole[GUARD:GUARD + n]

    width = (hq + 2 * hkv) * d if c["packed"] else hq * d
    query = rand(bsz, s_len, width)
    if c["packed"]:
        q_in, k_in, v_in = query, query[..., hq * d:], query[..., (hq + hkv) * d:]
    else:
        q_in, k_in, v_in = query, rand(bsz, s_len, hkv * d), rand(bsz, s_len, hkv * d)
    past_k, past_v = rand(bsz, hkv, max(c["past_len"], 1), d), rand(bsz, hkv, max(c["past_len"], 1), d)
    cos_t = torch.from_numpy(rng.uniform(-1, 1, (max_pos, max(c["half"], 1))).astype(np.float32)).to(dt)
    sin_t = torch.from_numpy(rng.uniform(-1, 1, (max_pos, max(c["half"], 1))).astype(np.float32)).to(dt)
    pos_np = rng.integers(0, max_pos, (bsz, s_len)).astype(np.int64)
    if c.get("bad_positions"):
        pos_np[0, 0], pos_np[-1, -1] = -1, max_pos
    pos_t = torch.from_numpy(pos_np)

    n_present = bsz * hkv * plen * d
    pk_all, pk = guarded(n_present, dt, float("nan"))
    pv_all, pv = guarded(n_present, dt, float("nan"))
    if c["shared"]:  # the past lives in the present buffer: its rows must survive
        pk.copy_(rand(n_present))
        pv.copy_(rand(n_present))
    pk0 = pk.view(bsz, hkv, plen, d).float().numpy().copy()
    pv0 = pv.view(bsz, hkv, plen, d).float().numpy().copy()
    qr_all, qr = guarded(bsz * s_len * hq * d, dt, float("nan"))
    tot_all, tot = guarded(bsz, torch.int64, -99)
    mask_all, mask = guarded(bsz * plen, torch.int8, 7)
    seqlens = torch.tensor(c["seqlens"], dtype=torch.int32)

    rotary = c["rotary"]
    write_mask = int(first)
    q_heads = hq if rotary else 0
    stride_q, stride_k, stride_v = q_in.stride(), k_in.stride(), v_in.stride()
    args = [q_in, k_in, v_in, past_k, past_v, pk, pv, qr, cos_t, sin_t, pos_t, seqlens, tot, mask,
            s_len, hq, hkv, d, q_heads, rotary, c["half"], max_pos, int(c["position_ids"]),
            int(first), write_mask, c["total"], plen, c["past_len"],
            stride_q[0], stride_q[1], stride_k[0], stride_k[1], stride_v[0], stride_v[1]]
    block_d = min(x for x in (64, 128, 256) if x >= d)  # cpp/gqa_launch.cc gqa_kernel
    if not c["shared"]:
        rows = 8
        gqa_prepare[(-(-plen // rows), bsz * hkv)](*args, BLOCK_ROWS=rows, BLOCK_D=block_d, COPY_PAST=True)
    tokens = 2  # tiles of 2 tokens: odd S leaves a last tile half empty
    gqa_prepare[(bsz * -(-s_len // tokens), q_heads + hkv)](*args, BLOCK_ROWS=tokens, BLOCK_D=block_d,
                                                             COPY_PAST=False)

    def heads_of(x, h):  # (B, S, H*D) -> (B, S, H, D) float32 numpy
        return x.float().numpy().reshape(bsz, s_len, -1)[..., :h * d].reshape(bsz, s_len, h, d)

    def as_dtype(x):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(dt).float().numpy()

    want = expected(c, heads_of(q_in, hq), heads_of(k_in, hkv), heads_of(v_in, hkv),
                    past_k.float().numpy(), past_v.float().numpy(), pk0, pv0, cos_t.float().numpy()[:, :c["half"]],
                    sin_t.float().numpy()[:, :c["half"]], pos_np if c["position_ids"] else None)
    q_want, pk_want, pv_want, tot_want, mask_want = want
    np.testing.assert_array_equal(pk.view(bsz, hkv, plen, d).float().numpy(), as_dtype(pk_want))
    np.testing.assert_array_equal(pv.view(bsz, hkv, plen, d).float().numpy(), as_dtype(pv_want))
    np.testing.assert_array_equal(tot.numpy(), tot_want)
    if rotary:
        np.testing.assert_array_equal(qr.view(bsz, s_len, hq, d).float().numpy(), as_dtype(q_want))
    else:
        assert torch.isnan(qr.float()).all(), "Q was written without rotary"
    if write_mask:
        np.testing.assert_array_equal(mask.view(bsz, plen).numpy(), mask_want)
    else:
        assert (mask == 7).all(), "the key mask was written outside a first prompt"
    for whole, fill in ((pk_all, None), (pv_all, None), (qr_all, None), (tot_all, -99), (mask_all, 7)):
        for edge in (whole[:GUARD], whole[-GUARD:]):
            ok = torch.isnan(edge.float()).all() if fill is None else (edge == fill).all()
            assert ok, "a write outside a buffer"


if __name__ == "__main__":
    check_case(json.loads(sys.argv[1]))
