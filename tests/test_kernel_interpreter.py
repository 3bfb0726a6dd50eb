"""The Triton kernel sources (aot/flash_fwd.py, aot/flash_decode.py) run by Triton's CPU
interpreter against the float64 reference: the GPU kernels' logic (phases, bounds, masks, windows,
softcap, GQA, LSE; for decode the GQA row packing, KV splits and their merge, in the combine
kernel and fused into the split kernel) checked in CI,
where there is no GPU. Small tiles so every phase (left edge, interior, right
edge) is exercised at small sizes. Each case runs in a subprocess started with
TRITON_INTERPRET=1 (Triton reads it when it is imported)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _paths import child_env

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
    # Key-vector masks (MASK_KEYS: one (B, H, 1, S) row per CTA, query stride 0).
    dict(b=2, hq=2, hkv=1, sq=37, skv=53, d=64, mask="add_keys"),
    dict(b=2, hq=4, hkv=2, sq=33, skv=40, d=64, mask="bool_keys", causal=True),
    dict(b=2, hq=2, hkv=2, sq=20, skv=45, d=40, mask="add_keys", window=(9, 3)),
    # Split-KV decode (the launcher's choices: grid (splits, B * Hkv, row blocks), then combine).
    dict(kernel="decode", splits=1, b=2, hq=4, hkv=1, sq=1, skv=70, d=64),
    dict(kernel="decode", splits=5, b=2, hq=8, hkv=2, sq=1, skv=150, d=64, causal=True),
    dict(kernel="decode", splits=3, b=1, hq=6, hkv=2, sq=3, skv=101, d=40, dv=24, causal=True),
    dict(kernel="decode", splits=4, b=2, hq=4, hkv=2, sq=2, skv=90, d=64, mask="add", causal=True),
    dict(kernel="decode", splits=7, b=1, hq=2, hkv=2, sq=1, skv=120, d=64, mask="bool"),
    dict(kernel="decode", splits=4, b=3, hq=4, hkv=1, sq=1, skv=96, d=64, lens=[96, 17, 0]),
    dict(kernel="decode", splits=3, b=1, hq=4, hkv=2, sq=5, skv=80, d=64, window=(20, 0), softcap=4.0),
    dict(kernel="decode", splits=9, b=1, hq=20, hkv=1, sq=1, skv=64, d=64),   # 20 rows: 2 row blocks
    dict(kernel="decode", splits=2, b=1, hq=2, hkv=1, sq=1, skv=77, d=64, dtype="float32"),
    # The fused merge (the last CTA of each row block merges; as the launcher runs it where the
    # stream has counters): several row blocks, both merge tiles (4 rows x 16 splits, 16 x 4) with
    # more rows and splits than one tile holds, a batch with no keys, masks, softcap, fp32.
    dict(kernel="decode", fused=True, splits=5, b=2, hq=8, hkv=2, sq=1, skv=150, d=64, causal=True),
    dict(kernel="decode", fused=True, splits=9, b=1, hq=20, hkv=1, sq=1, skv=64, d=64),
    dict(kernel="decode", fused=True, splits=4, b=3, hq=4, hkv=1, sq=1, skv=96, d=64, lens=[96, 17, 0]),
    dict(kernel="decode", fused=True, splits=3, b=1, hq=6, hkv=2, sq=3, skv=101, d=40, dv=24, causal=True),
    dict(kernel="decode", fused=True, splits=6, b=2, hq=4, hkv=2, sq=2, skv=90, d=64, mask="add", causal=True),
    dict(kernel="decode", fused=True, splits=3, b=1, hq=4, hkv=2, sq=5, skv=80, d=64, window=(20, 0), softcap=4.0),
    dict(kernel="decode", fused=True, splits=2, b=1, hq=2, hkv=1, sq=1, skv=77, d=64, dtype="float32"),
    dict(kernel="decode", fused=True, splits=19, b=1, hq=6, hkv=2, sq=3, skv=1300, d=64, causal=True, lens=[1290]),
    # 8 rows at 17 splits: the wide tile (two row tiles, two split chunks); the 9-row blocks above
    # take the tall one (flash_decode.merge_round_trips).
    dict(kernel="decode", fused=True, splits=17, b=1, hq=8, hkv=1, sq=1, skv=1400, d=64, causal=True),
    # The TMA variant (sm_90): Q/K/V/Y as (B, H, S, D) tensor descriptors, also over the
    # (B, S, H, D) storage of the 3-D layout; rows past S read as zeros and stores clip per head.
    dict(tma=True, b=2, hq=4, hkv=2, sq=37, skv=53, d=64, layout="bshd"),
    dict(tma=True, b=2, hq=4, hkv=2, sq=33, skv=33, d=64, causal=True),
    dict(tma=True, b=1, hq=2, hkv=2, sq=20, skv=45, d=64, causal=True, offset=25, layout="bshd"),
    dict(tma=True, b=1, hq=2, hkv=2, sq=21, skv=40, d=64, mask="bool", causal=True),
    dict(tma=True, b=1, hq=2, hkv=2, sq=21, skv=19, d=64, mask="add", layout="bshd"),
    dict(tma=True, b=1, hq=2, hkv=2, sq=50, skv=90, d=64, window=(7, 0), softcap=5.0),
    dict(tma=True, b=2, hq=2, hkv=2, sq=29, skv=70, d=64, mask="add_keys", causal=True, layout="bshd"),
    dict(tma=True, b=2, hq=4, hkv=1, sq=21, skv=37, d=64, mask="bool_keys"),
    # A static cache's tail past nonpad_kv_seqlen holds NaN: it must not reach the output.
    dict(tma=True, b=2, hq=2, hkv=2, sq=9, skv=64, d=64, causal=True, lens=[30, 0], nan_tail=True),
    dict(b=2, hq=2, hkv=2, sq=9, skv=64, d=64, causal=True, lens=[30, 5], nan_tail=True, layout="bshd"),
    # Tiles of other aspect ratios (bm x bn), as the per-length TMA tiles have (aot/variants.py
    # TMA_TILES: (64, 128) and (128, 64) beside square ones): the causal diagonal then crosses a
    # key block part way, or spans several.
    dict(tma=True, bm=16, bn=32, b=1, hq=2, hkv=1, sq=70, skv=75, d=64, causal=True, offset=5),
    dict(tma=True, bm=32, bn=16, b=1, hq=2, hkv=2, sq=45, skv=70, d=64, causal=True, offset=25, layout="bshd"),
    dict(bm=32, bn=32, b=1, hq=2, hkv=2, sq=70, skv=90, d=64),
    # EDGE_LOOP (the superset variants of rare shapes, aot/variants.py edge_loop): the interior,
    # then both boundary ranges through one loop: windows on both sides, offsets, masks, fp32.
    dict(edge_loop=True, b=1, hq=2, hkv=2, sq=50, skv=90, d=64, window=(7, 3), softcap=5.0),
    dict(edge_loop=True, b=1, hq=2, hkv=2, sq=20, skv=45, d=40, dv=24, causal=True, offset=25, mask="bool"),
    dict(edge_loop=True, b=2, hq=2, hkv=1, sq=17, skv=29, d=64, dtype="float32", mask="add", lens=[20, 0]),
    # A softcap: the interior through the loop with the capped scores (_interior), not the plain one.
    dict(edge_loop=True, b=2, hq=2, hkv=1, sq=40, skv=70, d=40, causal=True, offset=30, mask="add", softcap=6.0),
    dict(edge_loop=True, b=1, hq=2, hkv=2, sq=33, skv=100, d=64, dtype="float32", softcap=3.0),
    dict(edge_loop=True, kernel="decode", splits=3, b=1, hq=4, hkv=2, sq=5, skv=80, d=64, window=(20, 3),
         softcap=4.0),
    dict(edge_loop=True, kernel="decode", fused=True, splits=4, b=3, hq=4, hkv=1, sq=1, skv=96, d=64,
         lens=[96, 17, 0], dtype="float32", mask="add"),
]


def _interpreted(arg: str) -> None:
    """Runs this file's check `arg` in a subprocess under TRITON_INTERPRET=1 (Triton reads it
    when it is imported), on torch CPU tensors."""
    pytest.importorskip("torch", reason="the Triton interpreter runs on torch CPU tensors")
    pytest.importorskip("triton", reason="the kernel source needs Triton")
    env = child_env(TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, __file__, arg], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_kernel_source_matches_reference(case):
    _interpreted(json.dumps(case))


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

    _patch_interpreter()
    from aot.flash_decode import flash_decode_combine, flash_decode_split
    from aot.flash_fwd import flash_fwd as kernel

    from ort_flash.reference import attention_reference
    c = dict(dict(dv=None, causal=False, offset=0, mask=None, window=(-1, -1), softcap=0.0,
                  lens=None, dtype="float16", kernel="fwd", splits=1, tma=False, layout="bhsd",
                  nan_tail=False, bm=16, bn=16, fused=False, edge_loop=False), **case)
    rng = np.random.default_rng()
    b, hq, hkv, sq, skv, d = c["b"], c["hq"], c["hkv"], c["sq"], c["skv"], c["d"]
    dv = c["dv"] or d
    bd = max(16, 1 << (max(d, dv) - 1).bit_length())
    dt = getattr(torch, c["dtype"])

    def rand(*shape):
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(dt)

    def qkvy(bb, h, s, dd, fill=None):  # logical (B, H, S, D), stored as the layout says
        shape = (bb, s, h, dd) if c["layout"] == "bshd" else (bb, h, s, dd)
        t = rand(*shape) if fill is None else torch.full(shape, fill, dtype=dt)
        return t.permute(0, 2, 1, 3) if c["layout"] == "bshd" else t

    q, k, v = qkvy(b, hq, sq, d), qkvy(b, hkv, skv, d), qkvy(b, hkv, skv, dv)
    y = qkvy(b, hq, sq, dv, fill=float("nan"))
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
        mask[0, 0, min(2, sq - 1), :] = float("-inf")
        mask_kind = 2
        kw["attn_mask"] = mask.numpy()
    elif c["mask"] == "bool_keys":  # per batch and head; batch 1's keys all masked
        mask = torch.from_numpy((rng.random((b, hq, 1, skv)) > 0.3).astype(np.int8))
        mask[1:2] = 0
        mask_kind = 1
        kw["attn_mask"] = mask.numpy().astype(bool)
    elif c["mask"] == "add_keys":  # a padding mask: batch 0 right-padded, batch 1 all -inf
        mask = rand(b, 1, 1, skv)
        mask[0, ..., skv - 7:] = float("-inf")
        mask[1:2] = float("-inf")
        mask_kind = 2
        kw["attn_mask"] = mask.numpy()
    if mask_kind:
        ms = [0 if mask.shape[i] == 1 else mask.stride(i) for i in range(3)]
    mask_keys = c["mask"] in ("bool_keys", "add_keys")
    lens = torch.tensor(c["lens"] or [0], dtype=torch.int64)
    if c["lens"]:
        kw["nonpad_kv_seqlen"] = np.array(c["lens"], dtype=np.int64)
    extras = c["window"] != (-1, -1) or c["softcap"] > 0 or c["lens"] is not None
    bm, bn = c["bm"], c["bn"]
    common = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, BLOCK_DV=bd, EVEN_D=(d == bd and dv == bd),
                  MASK_KIND=mask_kind, EXTRAS=extras,
                  DOT_PRECISION="ieee" if c["dtype"] == "float32" else "tf32",
                  **({"EDGE_LOOP": True} if c["edge_loop"] else {}))
    fwd_only = dict(MASK_KEYS=True) if mask_keys else {}
    scalars = (hq, hq // hkv, sq, skv, d, dv, c["offset"], int(c["causal"]), c["window"][0],
               c["window"][1], skv, int(c["lens"] is not None), 1)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *y.stride()[:3], *ms)
    kq, vq = k.clone(), v.clone()  # what the kernels read; the reference gets k, v
    if c["nan_tail"]:
        for i, n in enumerate(c["lens"]):
            kq[i, :, n:], vq[i, :, n:] = float("nan"), float("nan")
    if c["tma"]:
        from triton.tools.tensor_descriptor import TensorDescriptor

        def desc(t, rows):
            return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, t.shape[3]])

        kernel[(triton.cdiv(sq, bm), b * hq)](
            desc(q, bm), desc(kq, bn), desc(vq, bn), desc(y, bm), lse, mask, lens, 1 / math.sqrt(d),
            c["softcap"], *scalars, *strides, **common, **fwd_only, TMA=True)
    elif c["kernel"] == "fwd":
        kernel[(triton.cdiv(sq, bm), b * hq)](
            q, kq, vq, y, lse, mask, lens, 1 / math.sqrt(d), c["softcap"], *scalars, *strides, **common,
            **fwd_only)
    else:
        splits = c["splits"]
        # Partials poisoned too: the combine must read only what the split kernel wrote.
        opart = torch.full((b * hq * sq * splits * dv,), float("nan"))
        lpart = torch.full((b * hq * sq * splits,), float("nan"))
        m_blocks = triton.cdiv(sq * hq // hkv, 16)
        # Fused: the last CTA of each row block merges; the counters start and must end at zero.
        counter = torch.zeros(b * hkv * m_blocks, dtype=torch.int32)
        flash_decode_split[(splits, b * hkv, m_blocks)](
            q, kq, vq, y, lse, mask, lens, opart, lpart, counter, 1 / math.sqrt(d), c["softcap"], *scalars,
            splits, int(c["fused"]), *strides, **common)
        assert not counter.any(), counter
        if splits > 1 and not c["fused"]:
            flash_decode_combine[(b * hq * sq,)](opart, lpart, y, lse, hq, sq, dv, splits, 1,
                                                 *y.stride()[:3], BLOCK_DV=bd, BLOCK_S=4)
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


def test_fused_merge_takes_the_tile_merge_tile_names():
    """flash_decode_split's fused merge picks its tile inline (a jit helper would change the
    cubins' SASS): the tile it runs for a row block of 1..16 packed rows (DECODE_BLOCK_M; 17, 40
    and 64 rows: several blocks, the last one short) at 2..36 splits and past them, up to the
    launcher's 128, is flash_decode.merge_tile's, which merge_round_trips counts and the launcher's
    decision is held to (test_aot_table.py)."""
    _interpreted("merge_tiles")


def check_merge_tiles():
    """One CTA per row block, its counter set as if every other split had arrived, so it merges;
    the scores (_attend) and the merge itself (_merge_splits, recorded) are not what is checked."""
    import torch
    import triton

    _patch_interpreter()
    from aot import flash_decode as fd
    from aot.variants import DECODE_BLOCK_M

    def num(x):
        h = getattr(x, "handle", None)
        return int(np.asarray(h.data).reshape(-1)[0]) if h is not None else int(x)

    taken = []
    fd._attend = lambda acc, l_i, m_i, *a, **kw: (acc, l_i, m_i)
    # _merge_splits(..., row_lo, row_hi, ..., MERGE_M, MERGE_S): positions 9 and 10, the last two.
    fd._merge_splits = lambda *a: taken.append((num(a[10]) - num(a[9]), num(a[-2]), num(a[-1])))
    d = bn = 16
    wide = list(range(2, 37)) + [47, 48, 49, 64, 65, 128]
    cases = [(rows, s) for rows in range(1, DECODE_BLOCK_M + 1) for s in wide]
    cases += [(rows, s) for rows in (17, 40, 64) for s in (2, 9, 33, 64)]
    seen = set()
    for rows, splits in cases:
        blocks = triton.cdiv(rows, DECODE_BLOCK_M)
        q, y = (torch.zeros(1, rows, 1, d, dtype=torch.float16) for _ in range(2))
        kv = torch.zeros(1, 1, bn, d, dtype=torch.float16)
        counter = torch.full((blocks,), splits - 1, dtype=torch.int32)
        strides = (*q.stride()[:3], *kv.stride()[:3], *kv.stride()[:3], *y.stride()[:3], 0, 0, 0)
        taken.clear()
        fd.flash_decode_split[(1, 1, blocks)](
            q, kv, kv, y, torch.zeros(1, rows, 1), torch.zeros(1, dtype=torch.int8), torch.zeros(1, dtype=torch.int64),
            torch.zeros(rows * splits * d), torch.zeros(rows * splits), counter, 1.0, 0.0,
            rows, rows, 1, bn, d, d, 0, 0, -1, -1, bn, 0, 1, splits, 1, *strides,
            BLOCK_M=DECODE_BLOCK_M, BLOCK_N=bn, BLOCK_D=d, BLOCK_DV=d, EVEN_D=True, MASK_KIND=0, EXTRAS=False,
            DOT_PRECISION="tf32")
        assert not counter.any(), (rows, splits, counter)
        want = [(n, *fd.merge_tile(n, splits)) for n in [DECODE_BLOCK_M] * (blocks - 1) + [rows - DECODE_BLOCK_M * (blocks - 1)]]
        assert sorted(taken) == sorted(want), (rows, splits, taken, want)
        seen |= {(m, s) for _, m, s in taken}
    assert seen == {fd.MERGE_WIDE, fd.MERGE_TALL}, seen


def test_decode_floor_kernels_match_reference():
    """lab/experiments/decode_floor.py's floor kernels (the figures under the decode kernel in
    docs/perf-notes.md) compute what they claim: the chunk sums, the dots without softmax, the
    online softmax with and without the 4-replica block-diagonal stack, with and without TMA."""
    _interpreted("floor")


def check_floor():
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    sys.path.insert(0, str(ROOT / "lab" / "experiments"))
    _patch_interpreter()
    from decode_floor import floor_attn, floor_read

    torch.manual_seed(0)
    hkv, s, d, bm, bn, splits = 2, 192, 64, 16, 32, 3
    chunk = s // splits
    k, v = (torch.randn(hkv, s, d, dtype=torch.float16) for _ in range(2))
    q = torch.randn(hkv * bm, d, dtype=torch.float16)
    out = torch.full((hkv * splits * bm * d,), float("nan"))
    floor_read[(splits, hkv)](k, v, out, chunk, s, BLOCK_N=bn, BLOCK_D=d)
    want = (k.double() + v.double()).view(hkv, splits, -1).sum(-1)
    assert torch.allclose(out[:hkv * splits].view(hkv, splits).double(), want, rtol=1e-5, atol=1e-2)
    qd = q.view(hkv, bm, d).double()
    kc, vc = (t.view(hkv, splits, chunk, d).double() for t in (k, v))
    scores = torch.einsum("hmd,hcnd->hcmn", qd, kc)
    dots = torch.einsum("hcmn,hcnd->hcmd", scores, vc)
    attn = torch.einsum("hcmn,hcnd->hcmd", torch.softmax(scores * d ** -0.5, -1), vc)
    for tma in (False, True):
        kk, vv = k, v
        if tma:
            kk, vv = (TensorDescriptor(t.view(-1, d), [hkv * s, d], [d, 1], [bn, d]) for t in (k, v))
        for softmax, rep, want, tol in ((False, 1, dots, 0.05), (True, 1, attn, 2e-3), (True, 4, attn, 2e-3)):
            out.fill_(float("nan"))
            floor_attn[(splits, hkv)](q, kk, vv, out, chunk, s, d ** -0.5, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=d,
                                      REP=rep, TMA=tma, SOFTMAX=softmax)
            got = out.view(hkv, splits, bm, d).double()
            err = float((got - want).abs().max() / want.abs().max())
            assert err < tol, (tma, softmax, rep, err)


def test_decode_flat_kernel_matches_reference():
    """lab/experiments/decode_flat.py's equal-work attention (one loop over the flattened (KV head, key tile)
    space, a partial per head per CTA) merges to attention, over grids where a CTA holds part of
    one head, a head's end and the next's start, several whole heads, or everything."""
    _interpreted("flat")


def check_flat():
    import torch

    sys.path.insert(0, str(ROOT / "lab" / "experiments"))
    _patch_interpreter()
    from decode_flat import BLOCK_M, GROUP, flat_grid, floor_attn_flat, merge_flat

    torch.manual_seed(0)
    heads, nb, bn, d = 3, 5, 16, 64
    s = nb * bn
    q = torch.randn(heads * GROUP, d, dtype=torch.float16)
    k, v = (torch.randn(heads, s, d, dtype=torch.float16) for _ in range(2))
    qd = q.view(heads, GROUP, d).double()
    want = torch.softmax(qd @ k.double().transpose(1, 2) * d ** -0.5, -1) @ v.double()
    # 15 tiles: 1 CTA (all), 2 (8 + 7: a head's end and the next's start), 4 (4 per CTA), 7 and
    # 15 (parts of one head, up to 3 parts per head).
    for wanted in (1, 2, 4, 7, 15):
        ctas, per_cta, max_parts = flat_grid(heads, nb, wanted)
        opart = torch.full((heads * max_parts * GROUP, d), float("nan"))
        lpart = torch.full((heads * max_parts * GROUP,), float("-inf"))
        floor_attn_flat[(ctas,)](q, k, v, opart, lpart, per_cta, heads * nb, nb, s, d ** -0.5, max_parts,
                                 BLOCK_M=BLOCK_M, BLOCK_N=bn, BLOCK_D=d, GROUP=GROUP)
        got = merge_flat(opart, lpart, heads, max_parts, GROUP, d)
        err = float((got - want).abs().max())
        assert err < 2e-3, (wanted, ctas, per_cta, err)


if __name__ == "__main__":
    if sys.argv[1] == "floor":
        check_floor()
    elif sys.argv[1] == "flat":
        check_flat()
    elif sys.argv[1] == "merge_tiles":
        check_merge_tiles()
    else:
        check_case(json.loads(sys.argv[1]))
