"""aot/gqa_prepare.py run by Triton's CPU interpreter against a numpy model of what the CPU op
(cpp/gqa_call.cc run_gqa_cpu) does before its attention: the rotated Q, the present K/V rows
(shared buffer: only the new rows change; a present of its own: zeros, each row's past, the new
rows), the int64 total lengths and a first prompt's key mask. Outputs are poisoned and guarded by
poisoned margins: a write outside a buffer, or a value off by one bit (the sign of a zero too),
fails. Each case says which of the kernel's two paths it must take (`fast`: contiguous halves and
16-byte vectors; else the general, gathering one), and the kernel's alignment promises
(tl.multiple_of) are checked on every address they cover. Each case runs in a subprocess under
TRITON_INTERPRET=1 (Triton reads it when imported), as tests/test_kernel_interpreter.py does."""
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
# buffer's length, 0: none); rotary: 0 none, 1 half-split, 2 interleaved; half (R / 2); fast: the
# path the kernel must take; rows: BLOCK_ROWS ((token, head) rows a program), gather: GATHER_ROWS
# (the general path's chunk); shift: the buffers that start one element in (unaligned: query,
# key, value, cos, sin, present_key, present_value, q_rot); pad: {query, key or value: elements
# past each token's row} (its stride, s even so that the batch stride is a multiple of 8 anyway);
# zeros: some inputs are +0 or -0 (a rotation must keep the sign of a zero).
CASES = [
    # A GenAI first prompt: packed QKV, one shared static buffer, right padding; full rotary at a
    # head size below BLOCK_D (d 32 in BLOCK_D 64: masked halves).
    dict(b=2, s=7, hq=4, hkv=2, d=32, total=7, seqlens=[6, 3], past_len=11, shared=True, packed=True,
         rotary=1, half=16, fast=True),
    # Decode with the shared buffer, interleaved rotary, position_ids.
    dict(b=3, s=1, hq=6, hkv=2, d=48, total=9, seqlens=[8, 2, 5], past_len=9, shared=True, rotary=2,
         half=8, position_ids=True, dtype="bfloat16", fast=False),
    # A continuation (chunked prefill) into a present of its own, partial rotary, fp32.
    dict(b=1, s=4, hq=2, hkv=1, d=64, total=13, seqlens=[12], past_len=9, rotary=1, half=8,
         dtype="float32", fast=False),
    # A separate present that grows (total = past + S), no rotary, head dim 80, odd heads: halves
    # of 40 (a multiple of 8 elements): the fast path's plain copy.
    dict(b=2, s=3, hq=6, hkv=2, d=80, total=8, seqlens=[7, 4], past_len=5, fast=True),
    # A first prompt without a past, separate present, padding, interleaved, position_ids[0, 0].
    dict(b=2, s=5, hq=2, hkv=2, d=32, total=5, seqlens=[4, 1], past_len=0, rotary=2, half=16,
         position_ids=True, packed=True, fast=False),
    # Decode: positions outside cos_cache (unrotated), separate buffers.
    dict(b=2, s=1, hq=2, hkv=1, d=32, total=6, seqlens=[5, 3], past_len=6, rotary=1, half=16,
         position_ids=True, bad_positions=True, fast=True),
    # Head dim 256 (the largest BLOCK_D), a first prompt with partial rotary, separate present.
    dict(b=1, s=3, hq=2, hkv=1, d=256, total=3, seqlens=[2], past_len=0, rotary=1, half=64,
         dtype="bfloat16", fast=False),
    # Hostile seqlens_k: negative, past total_sequence_length, INT32_MAX, fewer keys than new tokens.
    dict(b=5, s=2, hq=2, hkv=1, d=32, total=6, seqlens=[-7, 999999, 2147483647, 0, 5], past_len=6,
         shared=True, rotary=1, half=8, dtype="bfloat16", fast=False),
    dict(b=5, s=2, hq=2, hkv=1, d=32, total=6, seqlens=[-7, 999999, 2147483647, 0, 5], past_len=6,
         rotary=1, half=8, packed=True, fast=False),
    dict(b=3, s=4, hq=2, hkv=1, d=32, total=4, seqlens=[-2, 4, 3], past_len=6, shared=True, rotary=1,
         half=16, fast=True),
    # The same hostile rows on the fast path at a whole head, a separate present.
    dict(b=5, s=2, hq=4, hkv=2, d=64, total=6, seqlens=[-7, 999999, 2147483647, 0, 5], past_len=6,
         rotary=1, half=32, packed=True, fast=True),
    # Decode (S = 1) with many heads, the common LLaMA shape scaled down: 48 rows a token over
    # programs of 16 (fp16 d64, bf16 d128, fp32 d128: full half-split rotary, BLOCK_D = D).
    dict(b=3, s=1, hq=32, hkv=8, d=64, total=40, seqlens=[39, 17, 3], past_len=40, shared=True, packed=True,
         rotary=1, half=32, rows=16, fast=True),
    dict(b=2, s=1, hq=32, hkv=8, d=128, total=9, seqlens=[8, 5], past_len=12, rotary=1, half=64, rows=16,
         dtype="bfloat16", position_ids=True, fast=True),
    dict(b=2, s=1, hq=16, hkv=4, d=128, total=7, seqlens=[6, 6], past_len=7, shared=True, rotary=1, half=64,
         rows=32, dtype="float32", fast=True),
    # Decode with many heads on the general path (interleaved), rows across programs.
    dict(b=2, s=1, hq=16, hkv=4, d=64, total=5, seqlens=[4, 2], past_len=5, shared=True, packed=True,
         rotary=2, half=32, rows=8, fast=False),
    # Prefill whose S * NH rows (5 x 8 = 40) do not fill the programs of 16: the last is partial.
    dict(b=2, s=5, hq=4, hkv=2, d=128, total=5, seqlens=[4, 2], past_len=0, packed=True, rotary=1,
         half=64, rows=16, gather=4, fast=True),
    dict(b=2, s=5, hq=4, hkv=2, d=64, total=5, seqlens=[4, 4], past_len=8, shared=True, rotary=1,
         half=32, rows=16, gather=4, dtype="bfloat16", fast=True),
    # ... and on the general path (partial rotary, fp32), rows a program not a multiple of NH.
    dict(b=2, s=5, hq=4, hkv=2, d=64, total=5, seqlens=[4, 3], past_len=0, packed=True, rotary=1,
         half=16, rows=16, gather=4, dtype="float32", fast=False),
    # The fast path's shapes, unaligned: any one pointer or stride off 16 bytes takes the general path.
    *(dict(b=2, s=3, hq=4, hkv=2, d=64, total=3, seqlens=[2, 1], past_len=4, shared=True, rotary=1,
           half=32, rows=8, shift=[name], fast=False)
      for name in ("query", "key", "value", "cos", "sin", "present_key", "present_value", "q_rot")),
    dict(b=2, s=3, hq=4, hkv=2, d=64, total=3, seqlens=[2, 2], past_len=4, packed=True, rotary=1,
         half=32, rows=8, shift=["query"], dtype="bfloat16", fast=False),
    *(dict(b=2, s=4, hq=4, hkv=2, d=64, total=4, seqlens=[3, 2], past_len=4, rotary=1, half=32, rows=8,
           pad={name: 4}, fast=False) for name in ("query", "key", "value")),
    dict(b=2, s=4, hq=4, hkv=2, d=64, total=4, seqlens=[3, 2], past_len=4, rotary=1, half=32, rows=8,
         pad={"query": 8, "key": 16, "value": 24}, fast=True),
    # Half rows not a multiple of 16 bytes: d 72 (halves of 36 elements), general path.
    dict(b=1, s=3, hq=2, hkv=1, d=72, total=3, seqlens=[2], past_len=0, rotary=1, half=36, fast=False),
    # No rotary: a plain copy, fp32 on the fast path at a whole head; head size 36 on the general.
    dict(b=2, s=4, hq=4, hkv=2, d=128, total=9, seqlens=[8, 6], past_len=9, shared=True, dtype="float32",
         rows=8, fast=True),
    dict(b=2, s=2, hq=2, hkv=2, d=36, total=4, seqlens=[3, 2], past_len=2, fast=False),
    # Signed zeros in the inputs, cos and sin, on both paths.
    dict(b=2, s=3, hq=4, hkv=2, d=64, total=3, seqlens=[2, 2], past_len=0, packed=True, rotary=1,
         half=32, rows=8, zeros=True, fast=True),
    dict(b=2, s=3, hq=4, hkv=2, d=64, total=3, seqlens=[2, 2], past_len=0, rotary=2, half=32,
         rows=8, zeros=True, dtype="bfloat16", fast=False),
    # Q/K norms before the rotary: the fast path (whole half-split rotary, no rotary), the general
    # one (partial and interleaved rotary), a decode step, bf16, a padded first prompt
    dict(b=2, s=5, hq=4, hkv=2, d=64, total=5, seqlens=[4, 2], past_len=8, shared=True, packed=True, rotary=1,
         half=32, rows=8, norm=True, fast=True),
    dict(b=2, s=3, hq=4, hkv=2, d=64, total=3, seqlens=[2, 1], past_len=0, rows=4, norm=True, fast=True),
    dict(b=1, s=4, hq=2, hkv=1, d=64, total=13, seqlens=[12], past_len=9, rotary=1, half=8, norm=True,
         eps=1e-3, fast=False),
    dict(b=2, s=1, hq=8, hkv=2, d=128, total=9, seqlens=[8, 5], past_len=12, rotary=2, half=64, rows=16,
         norm=True, dtype="bfloat16", fast=False),
    # A windowed cache (cap C = past_len, window W): decode into the stage then the compaction.
    # C 6, W 4 (gap 3): rows below the capacity, full ones that drop 3, a row filled again, and an
    # impossible row; shared buffer, then a present of its own with interleaved rotary.
    dict(b=5, s=1, hq=4, hkv=2, d=64, total=10, seqlens=[2, 6, 8, 9, -1], past_len=6, cap=6, window=4,
         shared=True, packed=True, rotary=1, half=32, rows=8, fast=True),
    dict(b=4, s=1, hq=4, hkv=2, d=32, total=10, seqlens=[2, 6, 8, 9], past_len=6, cap=6, window=4,
         rotary=2, half=16, position_ids=True, dtype="bfloat16", fast=False),
    # C = W (gap 1: every step past the capacity drops one row), d128 with many heads.
    dict(b=2, s=1, hq=16, hkv=4, d=128, total=20, seqlens=[16, 19], past_len=16, cap=16, window=16,
         shared=True, rotary=1, half=64, rows=16, fast=True),
    # Chunked prefill (batch 1): 4 tokens onto 6 resident rows of a cache of 8 (W 5, gap 4), and
    # onto 2 (no compaction); Q/K norms on the first.
    dict(b=1, s=4, hq=2, hkv=1, d=64, total=14, seqlens=[13], past_len=8, cap=8, window=5, shared=True,
         rotary=1, half=32, norm=True, fast=True),
    dict(b=1, s=4, hq=2, hkv=1, d=64, total=6, seqlens=[5], past_len=8, cap=8, window=5, rotary=1, half=8,
         dtype="float32", fast=False),
    # A first prompt longer than the cache (7 tokens, C 5, W 3), a row shorter than the prompt
    # (impossible with a windowed cache); one that fits (3 tokens, C 6), shared.
    dict(b=3, s=7, hq=2, hkv=1, d=64, total=7, seqlens=[6, 3, 6], past_len=5, cap=5, window=3,
         packed=True, rotary=1, half=32, fast=True),
    dict(b=2, s=3, hq=4, hkv=2, d=64, total=3, seqlens=[2, 2], past_len=6, cap=6, window=4, shared=True,
         rotary=1, half=32, rows=8, fast=True),
    # A windowed cache no row can pass (total <= C; cpp/gqa_launch.cc): present is the stage (C rows),
    # the past copy and the compaction only for a present of its own; present must end as the
    # staged path leaves it. Decode (an impossible row among them), shared and separate; a first
    # prompt with a row shorter than the prompt, separate and shared; a chunked prefill.
    dict(b=3, s=1, hq=4, hkv=2, d=64, total=6, seqlens=[2, 5, -1], past_len=6, cap=6, window=4, in_place=True,
         shared=True, packed=True, rotary=1, half=32, rows=8, fast=True),
    dict(b=2, s=1, hq=4, hkv=2, d=32, total=6, seqlens=[3, 5], past_len=6, cap=6, window=4, in_place=True,
         rotary=2, half=16, position_ids=True, dtype="bfloat16", fast=False),
    dict(b=3, s=4, hq=2, hkv=1, d=64, total=4, seqlens=[3, 1, 3], past_len=6, cap=6, window=4, in_place=True,
         packed=True, rotary=1, half=32, fast=True),
    dict(b=2, s=3, hq=4, hkv=2, d=64, total=3, seqlens=[2, 0], past_len=6, cap=6, window=4, in_place=True,
         shared=True, rotary=1, half=32, rows=8, fast=True),
    dict(b=1, s=4, hq=2, hkv=1, d=64, total=7, seqlens=[6], past_len=8, cap=8, window=5, in_place=True,
         shared=True, rotary=1, half=32, norm=True, fast=True),
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


def kept(t: int, cap: int, window: int) -> int:
    """L(t): the rows a windowed cache of capacity cap keeps after t tokens (cpp/gqa_shapes.h)."""
    gap = cap - window + 1
    return t if t <= cap else t - gap * -(-(t - cap) // gap)


def lengths(c: dict) -> list[tuple[int, int, int, bool]]:
    """(keys_b, past_b, row0_b, valid) per batch row, as the kernel's _row_lengths and the CPU
    op's checks (cpp/gqa_call.cc gqa_lengths): the keys the attention reads, the first new token's
    absolute position and its buffer row (a windowed cache's L(past_b), else past_b)."""
    first = c["s"] == c["total"]
    plen = max(c["total"], c["past_len"])
    out = []
    for sk in c["seqlens"]:
        t = sk + 1
        past = 0 if first else t - c["s"]
        ok = 1 <= t <= c["total"] and past >= 0
        if c.get("cap"):
            row0 = kept(past, c["cap"], c["window"]) if ok else 0
            ok = ok and (not first or t == c["s"])
            keys = row0 + c["s"]
        else:
            row0, keys = past, t
            ok = ok and past + c["s"] <= plen
        out.append((keys, past, row0, ok) if ok else (0, 0, 0, False))
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


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """The kernel's Q/K norm of a row, in float32: x * (1 / sqrt(sum(x^2) / D + eps)) * w."""
    x = x.astype(np.float32)
    inv = np.float32(1.0) / np.sqrt(np.float32(np.sum(x * x, axis=-1, keepdims=True, dtype=np.float32) / x.shape[-1])
                                    + np.float32(eps))
    return x * inv * w.astype(np.float32)


def expected(c, q, k, v, past_k, past_v, pk0, pv0, cos, sin, pos_ids, qn=None, kn=None):
    """(q_rot, present_k, present_v, totals, mask) in float32 (rotations rounded to the dtype by
    the caller's cast) from the inputs as float32 numpy arrays (B, S, H, D) and (B, Hkv, L, D).
    With a windowed cache (c["cap"]) present_k / present_v are the stage (B, Hkv, C + S, D),
    NaN where nothing is written, and `compacted` gives present after the compaction."""
    s_len = c["s"]
    first = s_len == c["total"]
    pk, pv = pk0.copy(), pv0.copy()
    if c.get("cap"):
        pk = np.full(pk.shape[:2] + (c["cap"] + s_len,) + pk.shape[3:], np.nan, np.float32)
        pv = pk.copy()
    q_rot = q.copy()
    lens = lengths(c)
    for b, (t, past, row0, ok) in enumerate(lens):
        if c.get("cap"):  # the resident rows into the stage, nothing else
            pk[b, :, :row0], pv[b, :, :row0] = past_k[b, :, :row0], past_v[b, :, :row0]
        elif not c.get("shared"):
            pk[b], pv[b] = 0, 0
            n = min(past, c["past_len"])
            pk[b, :, :n], pv[b, :, :n] = past_k[b, :, :n], past_v[b, :, :n]
        for s in range(s_len):
            kk = k[b, s]
            if c.get("norm"):
                q_rot[b, s] = rms_norm(q[b, s], qn, c.get("eps", 1e-6))
                kk = rms_norm(kk, kn, c.get("eps", 1e-6))
            if c.get("rotary"):
                if first:
                    pos = s + (pos_ids[0, 0] if pos_ids is not None else 0)
                else:
                    pos = pos_ids[b, s] if pos_ids is not None else past + s
                if 0 <= pos < cos.shape[0]:
                    q_rot[b, s] = rotate(q_rot[b, s], cos[pos], sin[pos], c["rotary"] == 2)
                    kk = rotate(kk, cos[pos], sin[pos], c["rotary"] == 2)
            if ok:
                pk[b, :, row0 + s], pv[b, :, row0 + s] = kk, v[b, s]
    plen = pk.shape[2]
    mask = np.array([[j < t for j in range(plen)] for t, _, _, _ in lens], dtype=np.int8)
    totals = np.array([t for t, _, _, _ in lens], dtype=np.int64)
    return q_rot, pk, pv, totals, mask


def compacted(c, stage: np.ndarray, present0: np.ndarray) -> np.ndarray:
    """A windowed cache's present after the compaction (cpp/gqa_call.cc run_gqa_cpu's last step):
    rows [0, L(T_b)) the stage's last L(T_b) rows of the batch row, the rest zero in a present of
    its own, kept in a shared buffer (an impossible row: nothing written)."""
    out = present0.copy() if c.get("shared") else np.zeros_like(present0)
    for b, (keys, past, _, ok) in enumerate(lengths(c)):
        if ok:
            n = kept(past + c["s"], c["cap"], c["window"])
            out[b, :, :n] = stage[b, :, keys - n:keys]
    return out


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


def _check_alignment_hints() -> list:
    """Make the interpreter check what the kernel promises the compiler: every element of a
    tensor given tl.multiple_of(x, [n]) (addresses of pointers, in bytes) divisible by n. Returns
    the list each checked hint is appended to (the fast path gives them, the general path none)."""
    import triton.runtime.interpreter as interp

    seen = []
    original = interp._patch_lang_core

    def patched(lang, scope):
        original(lang, scope)
        hint = lang.multiple_of

        def multiple_of(x, values, *args, **kwargs):
            n = [int(getattr(v, "value", v)) for v in (values if isinstance(values, (list, tuple)) else [values])]
            data = np.asarray(x.handle.data).astype(np.int64)
            assert len(n) == 1 and data.ndim == 1, "a hint the check does not model"
            bad = data[data % n[0] != 0]
            assert bad.size == 0, f"tl.multiple_of({n[0]}) broken: {bad[:4]}"
            seen.append(n[0])
            return hint(x, values, *args, **kwargs)

        scope.set_attr(lang, "multiple_of", multiple_of)

    interp._patch_lang_core = patched
    return seen


def _same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """float32 arrays equal bit for bit (assert_array_equal takes -0 for +0)."""
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32), err_msg=what)


def check_case(c: dict) -> None:
    import torch

    from test_kernel_interpreter import _patch_interpreter
    _patch_interpreter()
    _round_bf16_like_gpu()
    hints = _check_alignment_hints()
    from aot.gqa_prepare import gqa_prepare

    c = dict(dict(dtype="float16", rotary=0, half=0, shared=False, packed=False, position_ids=False, rows=4,
                  shift=[], pad={}, zeros=False), **c)
    dt = getattr(torch, c["dtype"])
    rng = np.random.default_rng(sum(map(ord, json.dumps(c))))
    bsz, s_len, hq, hkv, d = (c[k] for k in ("b", "s", "hq", "hkv", "d"))
    first = s_len == c["total"]
    cap = c.get("cap", 0)  # a windowed cache: present is the past's length C
    in_place = bool(c.get("in_place"))  # no row can pass C: present is the stage
    assert not in_place or c["total"] <= cap
    plen = cap or max(c["total"], c["past_len"])
    stage_len = (cap if in_place else cap + s_len) if cap else 0
    max_pos = 3 * max(plen, c["total"])

    def rand(*shape, zeros=False, low=None):
        x = rng.standard_normal(shape, dtype=np.float32) if low is None else rng.uniform(low, 1, shape)
        if zeros:  # a fifth of the entries +0 or -0
            x = np.where(rng.random(shape) < 0.2, np.copysign(np.float32(0), rng.random(shape) - 0.5), x)
        return torch.from_numpy(np.asarray(x, dtype=np.float32)).to(dt)

    def shifted(name, *shape, **kw):
        """rand(shape), one element into its buffer where c["shift"] names it."""
        n, at = int(np.prod(shape)), int(name in c["shift"])
        return rand(n + at, **kw)[at:].view(*shape)

    def guarded(n, dtype, fill, name=""):
        """A flat buffer of n elements between poisoned margins (one more element before it where
        c["shift"] names it); returns (whole, the n in the middle)."""
        at = GUARD + int(name in c["shift"])
        whole = torch.full((n + GUARD + at,), fill, dtype=dtype)
        return whole, whole[at:at + n]

    width = (hq + 2 * hkv) * d if c["packed"] else hq * d
    def tokens(name, w):  # (B, S, w) rows of w + pad elements
        return shifted(name, bsz, s_len, w + c["pad"].get(name, 0), zeros=c["zeros"])[..., :w]

    query = tokens("query", width)
    if c["packed"]:
        q_in, k_in, v_in = query, query[..., hq * d:], query[..., (hq + hkv) * d:]
    else:
        q_in, k_in, v_in = query, tokens("key", hkv * d), tokens("value", hkv * d)
    past_k, past_v = rand(bsz, hkv, max(c["past_len"], 1), d), rand(bsz, hkv, max(c["past_len"], 1), d)
    cos_t = shifted("cos", max_pos, max(c["half"], 1), zeros=c["zeros"], low=-1)
    sin_t = shifted("sin", max_pos, max(c["half"], 1), zeros=c["zeros"], low=-1)
    pos_np = rng.integers(0, max_pos, (bsz, s_len)).astype(np.int64)
    if c.get("bad_positions"):
        pos_np[0, 0], pos_np[-1, -1] = -1, max_pos
    pos_t = torch.from_numpy(pos_np)

    n_present = bsz * hkv * plen * d
    pk_all, pk = guarded(n_present, dt, float("nan"), "present_key")
    pv_all, pv = guarded(n_present, dt, float("nan"), "present_value")
    if c["shared"]:  # the past lives in the present buffer: its rows must survive
        pk.copy_(rand(n_present))
        pv.copy_(rand(n_present))
        if in_place:  # the resident rows are present's own
            past_k, past_v = pk.view(bsz, hkv, plen, d), pv.view(bsz, hkv, plen, d)
    past_k_np, past_v_np = past_k.float().numpy().copy(), past_v.float().numpy().copy()
    pk0 = pk.view(bsz, hkv, plen, d).float().numpy().copy()
    pv0 = pv.view(bsz, hkv, plen, d).float().numpy().copy()
    qr_all, qr = guarded(bsz * s_len * hq * d, dt, float("nan"), "q_rot")
    tot_all, tot = guarded(bsz, torch.int64, -99)
    n_stage = bsz * hkv * max(stage_len, 1) * d
    sk_all, sk = guarded(n_stage, dt, float("nan"))
    sv_all, sv = guarded(n_stage, dt, float("nan"))
    mask_all, mask = guarded(bsz * plen, torch.int8, 7)
    seqlens = torch.tensor(c["seqlens"], dtype=torch.int32)

    rotary = c["rotary"]
    norm = bool(c.get("norm"))
    write_mask = int(first and not cap)  # cpp/gqa_launch.cc: never with a windowed cache
    q_heads = hq if rotary or norm else 0
    qn, kn = (torch.from_numpy((1 + 0.25 * rng.standard_normal(d)).astype(np.float32)).to(dt) for _ in range(2))
    stride_q, stride_k, stride_v = q_in.stride(), k_in.stride(), v_in.stride()
    gap = cap - c["window"] + 1 if cap else 1
    stage = (pk, pv) if in_place else (sk, sv)
    args = [q_in, k_in, v_in, past_k, past_v, pk, pv, qr, cos_t, sin_t, *stage, pos_t, seqlens, tot, mask, qn, kn,
            s_len, hq, hkv, d, q_heads, rotary, c["half"], max_pos, int(c["position_ids"]),
            int(first), write_mask, c["total"], plen, c["past_len"], int(norm), cap, gap, stage_len,
            int(c["shared"]), c.get("eps", 1e-6),
            stride_q[0], stride_q[1], stride_k[0], stride_k[1], stride_v[0], stride_v[1]]
    block_d = min(x for x in (64, 128, 256) if x >= d)  # cpp/gqa_launch.cc gqa_kernel
    if (cap and not in_place) or not c["shared"]:  # a stage of its own takes the resident rows, always
        gqa_prepare[(-(-plen // 8), bsz * hkv)](*args, BLOCK_ROWS=8, BLOCK_D=block_d, GATHER_ROWS=8, MODE=1)
    # cpp/gqa_launch.cc's grid: cdiv(S * NH, BLOCK_ROWS) programs a batch row, NH = q_heads + 2 Hkv
    # rows a token; small tiles, so that programs split tokens and a last one is partial.
    rows = c["rows"]
    gather = c.get("gather", max(1, rows // 2))
    hints.clear()
    gqa_prepare[(bsz * -(-s_len * (q_heads + 2 * hkv) // rows),)](*args, BLOCK_ROWS=rows, BLOCK_D=block_d,
                                                                 GATHER_ROWS=gather, MODE=0)
    assert bool(hints) == c["fast"], f"the kernel took the {'fast' if hints else 'general'} path"
    stage_k = sk.view(bsz, hkv, max(stage_len, 1), d).float().numpy().copy()
    stage_v = sv.view(bsz, hkv, max(stage_len, 1), d).float().numpy().copy()
    if cap and (not in_place or not c["shared"]):  # the compaction after the attention (which reads the stage)
        gqa_prepare[(-(-cap // 8), bsz * hkv)](*args, BLOCK_ROWS=8, BLOCK_D=block_d, GATHER_ROWS=8, MODE=2)
    else:
        assert torch.isnan(sk.float()).all() and torch.isnan(sv.float()).all(), "the stage was written"

    def heads_of(x, h):  # (B, S, H*D) -> (B, S, H, D) float32 numpy
        return x.float().numpy().reshape(bsz, s_len, -1)[..., :h * d].reshape(bsz, s_len, h, d)

    def as_dtype(x):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(dt).float().numpy()

    want = expected(c, heads_of(q_in, hq), heads_of(k_in, hkv), heads_of(v_in, hkv),
                    past_k_np, past_v_np, pk0, pv0, cos_t.float().numpy()[:, :c["half"]],
                    sin_t.float().numpy()[:, :c["half"]], pos_np if c["position_ids"] else None,
                    qn.float().numpy(), kn.float().numpy())
    q_want, pk_want, pv_want, tot_want, mask_want = want

    def same(got, want, what):
        if not norm:  # the same operations in the same order: the same bits
            return _same_bits(got, want, what)
        # The norm's sum runs in another order than numpy's: within two roundings of the dtype.
        ulp = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23}[c["dtype"]]
        np.testing.assert_allclose(got, want, rtol=4 * ulp, atol=4 * ulp, err_msg=what)
    if in_place:  # present as the staged path leaves it: its stage's rows, compacted
        pk_want = compacted(c, as_dtype(np.nan_to_num(pk_want)), pk0)
        pv_want = compacted(c, as_dtype(np.nan_to_num(pv_want)), pv0)
        same(pk.view(bsz, hkv, plen, d).float().numpy(), pk_want, "present_key in place")
        assert torch.isnan(sk.float()).all() and torch.isnan(sv.float()).all(), "the scratch stage was written"
    elif cap:  # the stage: the rows written bit for bit, every other row still poisoned
        for got, want_, what in ((stage_k, pk_want, "stage K"), (stage_v, pv_want, "stage V")):
            unset = np.isnan(want_)
            assert np.isnan(got[unset]).all(), f"{what}: a row written outside the resident and new rows"
            if what == "stage K":
                same(np.where(unset, 0, got), np.where(unset, 0, as_dtype(np.nan_to_num(want_))), what)
            else:
                _same_bits(np.where(unset, 0, got), np.where(unset, 0, as_dtype(np.nan_to_num(want_))), what)
        pk_want = compacted(c, as_dtype(np.nan_to_num(pk_want)), pk0)
        pv_want = compacted(c, as_dtype(np.nan_to_num(pv_want)), pv0)
        _same_bits(pk.view(bsz, hkv, plen, d).float().numpy(), pk_want, "present_key after the compaction")
    else:
        same(pk.view(bsz, hkv, plen, d).float().numpy(), as_dtype(pk_want), "present_key")
    _same_bits(pv.view(bsz, hkv, plen, d).float().numpy(), as_dtype(pv_want), "present_value")
    np.testing.assert_array_equal(tot.numpy(), tot_want)
    if rotary or norm:
        same(qr.view(bsz, s_len, hq, d).float().numpy(), as_dtype(q_want), "rotated Q")
    else:
        assert torch.isnan(qr.float()).all(), "Q was written without rotary"
    if write_mask:
        np.testing.assert_array_equal(mask.view(bsz, plen).numpy(), mask_want)
    else:
        assert (mask == 7).all(), "the key mask was written outside a first prompt"
    for whole, fill in ((pk_all, None), (pv_all, None), (qr_all, None), (tot_all, -99), (mask_all, 7), (sk_all, None),
                        (sv_all, None)):
        for edge in (whole[:GUARD], whole[-GUARD:]):
            ok = torch.isnan(edge.float()).all() if fill is None else (edge == fill).all()
            assert ok, "a write outside a buffer"


if __name__ == "__main__":
    check_case(json.loads(sys.argv[1]))
