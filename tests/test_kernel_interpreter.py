"""The Triton kernel source (aot/flash_fwd.py) run by Triton's CPU interpreter against the
float64 reference: the GPU kernel's logic (phases, bounds, masks, windows, softcap, GQA, LSE)
checked in CI, where there is no GPU. Small tiles so every phase (left edge, interior, right
edge) is exercised at small sizes. Each case runs in a subprocess started with
TRITON_INTERPRET=1 (Triton reads it when it is imported)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


CASES = [
    dict(b=1, hq=2, hkv=1, sq=37, skv=53, d=64),
    dict(b=2, hq=4, hkv=2, sq=33, skv=33, d=64, causal=True),
    dict(b=1, hq=2, hkv=2, sq=20, skv=45, d=64, causal=True, offset=25),
    dict(b=1, hq=2, hkv=2, sq=21, skv=40, d=64, mask="bool", causal=True),
    dict(b=1, hq=2, hkv=2, sq=21, skv=19, d=64, mask="add"),
    dict(b=1, hq=2, hkv=2, sq=50, skv=77, d=40, dv=24),
    dict(b=1, hq=2, hkv=2, sq=50, skv=90, d=64, window=(7, 0), softcap=5.0),
    dict(b=2, hq=2, hkv=2, sq=9, skv=64, d=64, causal=True, lens=[30, 0]),
    dict(b=1, hq=2, hkv=1, sq=17, skv=29, d=64, dtype="float32"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_kernel_source_matches_reference(case):
    pytest.importorskip("torch", reason="the Triton interpreter runs on torch CPU tensors")
    pytest.importorskip("triton", reason="the kernel source needs Triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, __file__, json.dumps(case)], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def _patch_interpreter():
    """Triton 3.6's interpreter turns loop bounds into ints with int(array) on a 1-element
    array, which numpy >= 2.4 refuses; index the element instead."""
    import triton.runtime.interpreter as interp

    original = interp._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    interp._patch_lang_tensor = patched


def check_case(case):
    import torch
    import triton

    sys.path.insert(0, str(ROOT / "aot"))
    _patch_interpreter()
    from flash_fwd import flash_fwd as kernel

    from ort_flash.reference import attention_reference
    c = dict(dict(dv=None, causal=False, offset=0, mask=None, window=(-1, -1), softcap=0.0,
                  lens=None, dtype="float16"), **case)
    rng = np.random.default_rng()
    b, hq, hkv, sq, skv, d = c["b"], c["hq"], c["hkv"], c["sq"], c["skv"], c["d"]
    dv = c["dv"] or d
    bd = max(16, 1 << (max(d, dv) - 1).bit_length())
    dt = getattr(torch, c["dtype"])

    def rand(*shape):
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(dt)

    q, k, v = rand(b, hq, sq, d), rand(b, hkv, skv, d), rand(b, hkv, skv, dv)
    y = torch.full((b, hq, sq, dv), float("nan"), dtype=dt)
    lse = torch.full((b, hq, sq), float("nan"))
    kw = dict(scale=1 / math.sqrt(d), is_causal=c["causal"], softcap=c["softcap"],
              left_window_size=c["window"][0], right_window_size=c["window"][1])
    mask, mask_kind, ms = torch.zeros(1, dtype=torch.int8), 0, [0, 0, 0]
    if c["mask"] == "bool":
        mask = torch.from_numpy((rng.random((1, hq, sq, skv)) > 0.3).astype(np.int8))
        mask_kind = 1
        kw["attn_mask"] = mask.numpy().astype(bool)
    elif c["mask"] == "add":
        mask = rand(1, 1, sq, skv)
        mask[0, 0, 2, :] = float("-inf")
        mask_kind = 2
        kw["attn_mask"] = mask.numpy()
    if mask_kind:
        ms = [0 if mask.shape[i] == 1 else mask.stride(i) for i in range(3)]
    lens = torch.tensor(c["lens"] or [0], dtype=torch.int64)
    if c["lens"]:
        kw["nonpad_kv_seqlen"] = np.array(c["lens"], dtype=np.int64)
    extras = c["window"] != (-1, -1) or c["softcap"] > 0 or c["lens"] is not None
    kernel[(triton.cdiv(sq, 16), b * hq)](
        q, k, v, y, lse, mask, lens, 1 / math.sqrt(d), c["softcap"],
        hq, hq // hkv, sq, skv, d, dv, c["offset"], int(c["causal"]), c["window"][0], c["window"][1],
        skv, int(c["lens"] is not None), 1,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *y.stride()[:3], *ms,
        BLOCK_M=16, BLOCK_N=16, BLOCK_D=bd, BLOCK_DV=bd, EVEN_D=(d == bd and dv == bd),
        MASK_KIND=mask_kind, EXTRAS=extras, DOT_PRECISION="ieee" if c["dtype"] == "float32" else "tf32")
    qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
    if c["offset"]:
        p = c["offset"]
        kw.update(past_key=kn[:, :, :p], past_value=vn[:, :, :p])
        kn, vn = kn[:, :, p:], vn[:, :, p:]
    ref, _, _, ref_lse = attention_reference(qn, kn, vn, **kw)
    got = y.double().numpy()
    assert not np.isnan(got).any(), "unwritten or NaN elements"
    tol = 1e-5 if c["dtype"] == "float32" else 5e-3
    assert np.abs(got - ref).max() < tol
    got_lse = lse.numpy()
    assert np.array_equal(np.isneginf(got_lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    assert np.abs(got_lse[fin] - ref_lse[fin]).max(initial=0) < 1e-4


if __name__ == "__main__":
    check_case(json.loads(sys.argv[1]))
