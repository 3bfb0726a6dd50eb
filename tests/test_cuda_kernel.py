"""The AOT cubins called directly (ort_flash._C.run_cuda on torch tensors), without ONNX Runtime:
fresh random inputs, outputs poisoned with NaN, odd shapes, against the float64 reference with
the error contract (2x the plain low-precision error + a floor)."""
from __future__ import annotations

import math
import os
import secrets

import numpy as np
import pytest

from ort_flash.reference import attention_lowp, attention_reference, error_bound

pytestmark = [pytest.mark.gpu, pytest.mark.direct]  # no onnxruntime-gpu needed

torch = pytest.importorskip("torch", reason="direct kernel tests drive the GPU through torch")

FLOORS = {"float16": 1e-3, "bfloat16": 8e-3, "float32": 4e-6}
TORCH = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32"}

CASES = [
    dict(b=2, hq=4, hkv=4, sq=113, skv=203, d=64),
    dict(b=1, hq=8, hkv=2, sq=1023, skv=1024, d=128, causal=True),
    dict(b=2, hq=6, hkv=1, sq=77, skv=77, d=64, causal=True),
    dict(b=1, hq=2, hkv=2, sq=33, skv=300, d=128, causal=True, offset=267),
    dict(b=2, hq=4, hkv=2, sq=129, skv=65, d=80, dv=48),
    dict(b=1, hq=2, hkv=2, sq=70, skv=130, d=256),
    dict(b=1, hq=2, hkv=1, sq=40, skv=50, d=24, dv=24),
    # Full masks at inexact head dims up to 64 (fp16/bf16: the 8-warp superset tiles of
    # docs/build-time.md "Spilling tiles"; fp32: the 4-warp d32 and 8-warp d64 IEEE tiles).
    dict(b=2, hq=4, hkv=2, sq=97, skv=131, d=48, mask="bool", causal=True),
    dict(b=2, hq=4, hkv=4, sq=90, skv=70, d=32, dv=24, mask="add"),
    dict(b=2, hq=4, hkv=4, sq=97, skv=97, d=64, mask="add"),
    dict(b=2, hq=4, hkv=2, sq=64, skv=190, d=128, mask="bool", causal=True),
    dict(b=2, hq=4, hkv=4, sq=50, skv=120, d=64, window=(16, 3), softcap=20.0),
    dict(b=3, hq=4, hkv=4, sq=8, skv=256, d=128, nonpad=True, causal=True),
    # The 3-D layout's (B, S, H, D) storage (on sm_90 the TMA kernel describes it as is), and a
    # static cache whose tail past nonpad_kv_seqlen holds NaN (never read into the output).
    dict(b=2, hq=8, hkv=2, sq=300, skv=333, d=128, causal=True, layout="bshd"),
    dict(b=2, hq=4, hkv=4, sq=129, skv=257, d=64, mask="add", layout="bshd"),
    dict(b=3, hq=4, hkv=2, sq=40, skv=512, d=128, nonpad=True, nan_tail=True, layout="bshd"),
    # A key bound per row beside its mask (FlashParams::key_bound): float32 and d80 read the mask,
    # fp16/bf16 d128 on sm_90 the unmasked Gluon kernel bounding each row (GLUON_CASES: more).
    dict(b=3, hq=4, hkv=2, sq=97, skv=130, d=128, causal=True, key_bound=True),
    dict(b=3, hq=4, hkv=2, sq=97, skv=130, d=80, causal=True, key_bound=True),
    # Packed QKV: Q, K and V as views into one (B, S, (Hq + 2 Hkv) * D) tensor.
    dict(b=2, hq=4, hkv=2, sq=150, skv=150, d=64, mask="add_keys", layout="packed"),
    dict(b=1, hq=4, hkv=4, sq=1030, skv=1030, d=128, causal=True, layout="packed"),
    dict(b=2, hq=6, hkv=3, sq=90, skv=90, d=32, window=(20, 4), layout="packed"),
    # Key-vector masks (query stride 0: the MASK_KEYS variants, TMA on sm_90 for d 64/128; d 256
    # falls back to the full-mask kernel), a (B, 1, 1, S) padding mask and a (1, H, 1, S) bool one.
    dict(b=3, hq=4, hkv=2, sq=211, skv=203, d=64, mask="add_keys"),
    dict(b=2, hq=8, hkv=2, sq=300, skv=333, d=128, mask="add_keys", causal=True, layout="bshd"),
    dict(b=2, hq=4, hkv=4, sq=97, skv=150, d=128, mask="bool_keys", window=(40, 8), softcap=15.0),
    dict(b=2, hq=4, hkv=2, sq=65, skv=129, d=96, mask="add_keys"),
    dict(b=1, hq=2, hkv=2, sq=70, skv=130, d=256, mask="bool_keys", causal=True),
    # Unmasked shapes long enough for the long-sequence TMA tiles on sm_90 (aot/variants.py
    # TMA_TILES; test_tma_tiles checks which cubin each takes): causal at a key offset of 100
    # with GQA, non-causal d64, d128 from 2048 in the 3-D layout, causal d128.
    dict(b=1, hq=2, hkv=1, sq=8200, skv=8300, d=64, causal=True, offset=100),
    dict(b=1, hq=1, hkv=1, sq=8211, skv=8250, d=64),
    dict(b=2, hq=4, hkv=2, sq=2100, skv=2101, d=128, layout="bshd"),
    dict(b=1, hq=1, hkv=1, sq=8193, skv=8193, d=128, causal=True),
    # More query tiles than SMs, GQA, lengths off the tile: on sm_90 the warp-specialized kernel
    # (d128 non-causal: two tiles per CTA), the one-partition one (d64 below 1024), and the dynamic
    # persistent grid (aot/tiles.py GLUON_WS_GRIDS: d64 non-causal from 1024, 288 tiles; d128
    # causal from 1024 at a key offset, 360 tiles; over 132 CTAs, tiles of several heads per CTA).
    dict(b=5, hq=8, hkv=2, sq=600, skv=650, d=128),
    dict(b=3, hq=16, hkv=4, sq=700, skv=700, d=64),
    dict(b=3, hq=16, hkv=4, sq=1100, skv=1100, d=64),
    dict(b=5, hq=8, hkv=2, sq=1100, skv=1150, d=128, causal=True, offset=50),
    # Decode shapes (split-KV kernel + combine; launch_plan below checks the dispatch).
    dict(b=1, hq=32, hkv=8, sq=1, skv=8191, d=128, causal=True),
    dict(b=2, hq=8, hkv=1, sq=4, skv=3000, d=64, causal=True, mask="add"),
    dict(b=3, hq=4, hkv=2, sq=1, skv=2500, d=128, nonpad=True, causal=True, window=(900, 0), softcap=8.0),
    dict(b=1, hq=4, hkv=4, sq=2, skv=1200, d=200, dv=72, mask="bool"),
    # B x Hkv = 64: two splits, merged in the split kernel by default.
    dict(b=16, hq=16, hkv=4, sq=1, skv=3001, d=128, nonpad=True, causal=True),
    # Grids of more CTAs than SMs (160 and 144 row blocks): on sm_90 fp16/bf16 the decode tile
    # for them (aot/variants.py DECODE_WIDE_WAVES; test_decode_dispatch checks it is taken).
    dict(b=40, hq=8, hkv=4, sq=1, skv=1000, d=128, nonpad=True, causal=True),
    dict(b=36, hq=8, hkv=4, sq=1, skv=700, d=64, mask="bool"),
]


def _case_id(c):
    return "-".join(f"{k}{v}" for k, v in c.items())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_kernel_matches_reference(case, dtype, kind=None):
    """`kind` (callers only): the launch plan's kind this call must take."""
    from ort_flash import _C

    c = dict(dict(dv=None, causal=False, offset=0, mask=None, window=(-1, -1), softcap=0.0,
                  nonpad=False, nan_tail=False, layout="bhsd", key_bound=False, rotary=False), **case)
    seed = secrets.randbits(32)
    rng = np.random.default_rng(seed)
    b, hq, hkv, sq, skv, d = c["b"], c["hq"], c["hkv"], c["sq"], c["skv"], c["d"]
    dv = c["dv"] or d
    tdt = getattr(torch, TORCH[dtype])
    dev = torch.device("cuda")

    def rand(bb, h, s, dd, fill=None):  # logical (B, H, S, D), stored as the layout says
        shape = (bb, s, h, dd) if c["layout"] == "bshd" else (bb, h, s, dd)
        t = (torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(dev, tdt) if fill is None
             else torch.full(shape, fill, dtype=tdt, device=dev))
        return t.permute(0, 2, 1, 3) if c["layout"] == "bshd" else t

    if c["layout"] == "packed":  # views into one (B, S, (Hq + 2 Hkv) * D) tensor: Q | K | V per token
        assert sq == skv and dv == d and not c["offset"]
        rows = torch.from_numpy(rng.standard_normal((b, sq, (hq + 2 * hkv) * d), dtype=np.float32)).to(dev, tdt)

        def heads(first, n):
            return rows[..., first * d:(first + n) * d].unflatten(-1, (n, d)).permute(0, 2, 1, 3)

        q, k, v = heads(0, hq), heads(hq, hkv), heads(hq + hkv, hkv)
    else:
        q, k, v = rand(b, hq, sq, d), rand(b, hkv, skv, d), rand(b, hkv, skv, dv)
    y = rand(b, hq, sq, dv, fill=float("nan"))
    lse = torch.full((b, hq, sq), float("nan"), dtype=torch.float32, device=dev)
    p = _C.FlashParams()
    p.dtype = getattr(_C.DType, dtype)
    # What the kernel reads (the reference reads k, v); packed views are read in place.
    kk, vk = (k, v) if c["layout"] == "packed" else (k.clone(), v.clone())
    p.q, p.k, p.v, p.y, p.lse = q.data_ptr(), kk.data_ptr(), vk.data_ptr(), y.data_ptr(), lse.data_ptr()
    p.batch, p.hq, p.hkv, p.sq, p.skv, p.d, p.dv = b, hq, hkv, sq, skv, d, dv
    p.q_stride, p.k_stride, p.v_stride, p.y_stride = (list(t.stride()[:3]) for t in (q, kk, vk, y))
    p.scale = 1.0 / math.sqrt(d)
    p.causal = c["causal"]
    p.offset = c["offset"]
    p.window_left, p.window_right = c["window"]
    p.softcap = c["softcap"]
    ref_kwargs = dict(is_causal=c["causal"], softcap=c["softcap"], left_window_size=c["window"][0],
                      right_window_size=c["window"][1])
    mask_np = None
    if c["mask"] == "add":
        mask_np = rng.standard_normal((b, 1, sq, skv)).astype(np.float32)
        mask_np[:, :, 3, :] = -np.inf  # one fully masked row
        m = torch.from_numpy(mask_np).to(dev, tdt)
        p.mask_kind = _C.MaskKind.add
    elif c["mask"] == "bool":
        mask_np = rng.random((1, hq, sq, skv)) > 0.3
        m = torch.from_numpy(mask_np).to(dev)
        p.mask_kind = _C.MaskKind.bool
    elif c["mask"] in ("add_keys", "add_keys_left", "bool_keys_left", "add_keys_min", "bool_keys_right"):
        # Padding per batch row, batch 0 wholly padded (the masked loop): right padding at -inf
        # ("add_keys"), left padding (a visible run from lo > 0: unmasked from lo, under causal
        # the masked loop), right padding at -1e4 with one batch at -5000 (above the range
        # check's HIDDEN_AT: the masked loop) or as bool.
        mask_np = np.zeros((b, 1, 1, skv), dtype=np.float32)
        hidden = -1e4 if c["mask"] == "add_keys_min" else -np.inf
        for i in range(b):
            n = skv - (i * skv) // (2 * b) if i else 0  # visible keys
            if c["mask"].endswith("_left"):
                mask_np[i, ..., :skv - n] = hidden
            else:
                mask_np[i, ..., n:] = -5000.0 if (c["mask"] == "add_keys_min" and i == b - 1) else hidden
        if c["mask"].startswith("bool"):
            mask_np = mask_np == 0
            m = torch.from_numpy(mask_np).to(dev)
            p.mask_kind = _C.MaskKind.bool
        else:
            m = torch.from_numpy(mask_np).to(dev, tdt)
            p.mask_kind = _C.MaskKind.add
    elif c["mask"] == "bool_keys":
        mask_np = rng.random((1, hq, 1, skv)) > 0.4
        mask_np[0, 1] = False  # head 1 sees no key
        m = torch.from_numpy(mask_np).to(dev)
        p.mask_kind = _C.MaskKind.bool
    if c["key_bound"]:
        # Row i holds T_i <= Sq keys (one full, one of at most 7) and its queries keep their
        # positions: the key bound, and the bool key mask j < T_i that states the same.
        lens = rng.integers(1, sq + 1, size=b)
        lens[0], lens[-1] = sq, min(lens[-1], 7)
        mask_np = (np.arange(skv)[None, :] < lens[:, None])[:, None, None, :]
        m = torch.from_numpy(mask_np).to(dev)
        p.mask_kind = _C.MaskKind.bool
        bound_t = torch.from_numpy(lens.astype(np.int64)).to(dev)
        p.key_bound = bound_t.data_ptr()
    if c["rotary"]:
        # Q's rotary on load (FlashParams::rotary_half): row i turned by row i of cos / sin over the
        # halves of the head; max_position rows (fewer than Sq where the case says: those rows
        # stay as they are). The reference gets Q turned on the host the same way, in fp32.
        half = d // 2
        max_pos = c.get("max_position", sq + 5)
        ang = np.arange(max_pos)[:, None] * (10000.0 ** (-np.arange(half) / half))[None, :]
        cos_t = torch.from_numpy(np.cos(ang).astype(np.float32)).to(dev, tdt)
        sin_t = torch.from_numpy(np.sin(ang).astype(np.float32)).to(dev, tdt)
        p.rotary_cos, p.rotary_sin = cos_t.data_ptr(), sin_t.data_ptr()
        p.rotary_half, p.max_position = half, max_pos
    if mask_np is not None:
        p.mask = m.data_ptr()
        p.mask_stride = [0 if m.shape[i] == 1 else m.stride(i) for i in range(3)] + [1]
        p.mask_len = skv
    if c["nonpad"]:
        lens = rng.integers(sq, skv + 1, size=b)
        lens[0] = 0  # an empty cache row: fully masked
        lens_t = torch.from_numpy(lens.astype(np.int64)).to(dev)
        p.seqlens_k = lens_t.data_ptr()
        ref_kwargs["nonpad_kv_seqlen"] = lens.astype(np.int64)
        if c["nan_tail"]:
            for i, n in enumerate(lens):
                kk[i, :, n:], vk[i, :, n:] = float("nan"), float("nan")
    if kind is not None:
        assert _C.launch_plan(p)[0] == kind, (_case_id(case), dtype, _C.launch_variant(p))
        if c["key_bound"] and kind == "fwd_gluon" and os.environ.get("ORT_FLASH_KEY_BOUND") != "0":
            assert "_none_" in _C.launch_variant(p), (_case_id(case), dtype, _C.launch_variant(p))
    _C.run_cuda(p, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()

    def host(t):
        return t.float().cpu().numpy()

    qh, kh, vh = host(q), host(k), host(v)
    npdt = {"float16": np.float16, "float32": np.float32}.get(dtype)
    if npdt is None:
        import ml_dtypes
        npdt = ml_dtypes.bfloat16
    if c["rotary"]:
        n = min(sq, p.max_position)
        cs, sn = host(cos_t)[:n], host(sin_t)[:n]
        lo, hi = qh[:, :, :n, :half].copy(), qh[:, :, :n, half:].copy()
        qh[:, :, :n, :half] = (lo * cs + (-hi) * sn).astype(npdt).astype(np.float32)
        qh[:, :, :n, half:] = (hi * cs + lo * sn).astype(npdt).astype(np.float32)
    mask_arg = None
    if mask_np is not None:
        mask_arg = mask_np if mask_np.dtype == bool else mask_np.astype(npdt)
    if c["offset"]:
        # The kernel's offset is the past length: give the reference a past of that length.
        past_k, past_v = kh[:, :, :c["offset"]], vh[:, :, :c["offset"]]
        ref_kwargs.update(past_key=past_k.astype(npdt), past_value=past_v.astype(npdt))
        kin, vin = kh[:, :, c["offset"]:], vh[:, :, c["offset"]:]
    else:
        kin, vin = kh, vh
    args = (qh.astype(npdt), kin.astype(npdt), vin.astype(npdt))
    ref_y, _, _, ref_lse = attention_reference(*args, attn_mask=mask_arg, **ref_kwargs)
    low_y, _, _, _ = attention_lowp(*args, attn_mask=mask_arg, **ref_kwargs)
    got = host(y).astype(np.float64)
    ctx = f"{_case_id(case)} {dtype} seed={seed}"
    assert not np.isnan(got).any(), f"{ctx}: {np.isnan(got).sum()} unwritten/NaN elements of Y"
    err = float(np.abs(got - ref_y).max())
    bound = error_bound(ref_y, low_y, FLOORS[dtype])
    assert err <= bound, f"{ctx}: max|Y-ref| {err:.3g} > {bound:.3g}"
    got_lse = lse.cpu().numpy()
    assert np.array_equal(np.isneginf(got_lse), np.isneginf(ref_lse)), f"{ctx}: -inf lse rows differ"
    fin = np.isfinite(ref_lse)
    assert np.abs(got_lse[fin] - ref_lse[fin]).max(initial=0) < 1e-3 * max(1.0, np.abs(ref_lse[fin]).max(initial=1)), ctx


def _decode_params(b, hq, hkv, sq, skv, d, dtype="float16"):
    from ort_flash import _C

    p = _C.FlashParams()
    p.dtype = getattr(_C.DType, dtype)
    p.batch, p.hq, p.hkv, p.sq, p.skv, p.d, p.dv = b, hq, hkv, sq, skv, d, d
    p.q_stride, p.y_stride = [hq * sq * d, sq * d, d], [hq * sq * d, sq * d, d]
    p.k_stride = p.v_stride = [hkv * skv * d, skv * d, d]
    p.causal = True
    return p


def _in_subprocess(code: str, **env: str) -> tuple[str | None, str]:
    """Runs `code` in a fresh Python with this folder first on sys.path and `env` added to the
    environment (the launcher reads its ORT_FLASH_* switches once per process): (its last stdout
    line, or None if it failed or printed nothing; the tail of its output, for a message)."""
    import subprocess
    import sys
    from pathlib import Path

    r = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); " + code,
                        str(Path(__file__).parent)], capture_output=True, text=True,
                       env=dict(os.environ, **env), timeout=600)
    lines = r.stdout.strip().splitlines()
    return (lines[-1] if r.returncode == 0 and lines else None), r.stdout[-2000:] + r.stderr[-4000:]


def test_decode_dispatch():
    """Few query rows per KV head take the split-KV kernel, split to fill the GPU; prefill does not."""
    from ort_flash import _C

    kind, splits, ws, fused = _C.launch_plan(_decode_params(1, 32, 8, 1, 32768, 128))
    assert kind == "decode" and splits > 1 and ws >= 32 * splits * 128 * 4 and fused, (kind, splits, ws, fused)
    assert _C.launch_plan(_decode_params(16, 16, 4, 1, 3001, 128))[:2] == ("decode", 2)  # the fused-merge case
    kind, splits, ws, fused = _C.launch_plan(_decode_params(1, 32, 8, 1, 200, 128))
    assert (kind, splits, ws, fused) == ("decode", 1, 0, False)  # too short to split
    kind, splits, _, _ = _C.launch_plan(_decode_params(64, 32, 8, 1, 4096, 128))
    assert kind == "decode" and splits <= 2, splits  # B x Hkv already fills the GPU
    for p in (_decode_params(1, 32, 8, 128, 4096, 128), _decode_params(1, 32, 1, 4, 4096, 128)):  # 128 packed rows
        assert _C.launch_plan(p)[0] == _unmasked_prefill_kind(p)  # test_tma_dispatch
    # More CTAs than SMs: the wide tile on sm_90 (fp16/bf16, exact head dim), else the base one.
    sms = _C.prepare_device(0)[2]
    wide = _C.prepare_device(0)[1] == 90
    for b, dtype, want in ((32, "float16", wide), (32, "bfloat16", wide), (32, "float32", False),
                           (1, "float16", False), (16, "float16", False)):
        p = _decode_params(b, 32, 8, 1, 4096, 128, dtype)
        kind, splits, _, _ = _C.launch_plan(p)
        name = _C.launch_variant(p)
        assert kind == "decode" and name.startswith("flash_decode_"), (b, dtype, name)
        assert ("_w2" in name) == want, (b, dtype, splits, sms, name)


def test_decode_merge_dispatch():
    """The split kernel merges its own partials where its tile takes at most two dependent round
    trips (aot/flash_decode.py merge_round_trips), else the combine kernel does."""
    from aot import flash_decode
    from ort_flash import _C

    seen = set()
    for b, hq, hkv, sq, skv in ((1, 32, 8, 1, 4096), (1, 32, 8, 1, 32768), (1, 32, 8, 4, 4096),
                                (1, 32, 8, 4, 32768), (8, 32, 8, 4, 4096), (1, 32, 4, 1, 32768),
                                (1, 32, 8, 2, 65536), (2, 28, 4, 3, 20000)):
        kind, splits, _, fused = _C.launch_plan(_decode_params(b, hq, hkv, sq, skv, 128))
        rows = min(16, hq // hkv * sq)
        want = 1 < splits <= 32 and flash_decode.merge_round_trips(rows, splits) <= 2
        assert kind == "decode" and fused == want, (b, hq, hkv, sq, skv, splits, fused)
        seen.add(fused)
    assert seen == {True, False}


def _gluon_built() -> bool:
    """The build has Gluon kernels for this GPU (aot/variants.py GLUON_ENABLED, sm_90)."""
    from ort_flash import _C

    arch = _C.prepare_device(0)[1]
    return any(k["kind"] == "fwd_gluon" and k["arch"] == arch for k in _C.kernels())


def _unmasked_prefill_kind(p) -> str:
    """Where an unmasked fp16/bf16 prefill call with an exact head dim 64/128 and aligned views
    runs: the Gluon kernel where the build has an entry whose range (tile_causal, tile_min_len,
    tile_max_len: aot/variants.py GLUON_LENGTHS) covers it, else the TMA kernel on sm_90, else the
    pointer one."""
    from ort_flash import _C

    arch = _C.prepare_device(0)[1]
    dtype = str(p.dtype).split(".")[-1]
    if any(k["kind"] == "fwd_gluon" and k["arch"] == arch and k["dtype"] == dtype and k["head_dim"] == p.d
           and k["tile_causal"] in (-1, int(p.causal)) and k["tile_min_len"] <= min(p.sq, p.skv)
           and (k["tile_max_len"] == 0 or min(p.sq, p.skv) < k["tile_max_len"]) for k in _C.kernels()):
        return "fwd_gluon"
    return "fwd_tma" if arch == 90 else "fwd"


def test_tma_dispatch():
    """On sm_90 unmasked fp16/bf16 prefill with exact head dims 64/128 takes the TMA-descriptor
    kernel (the Gluon one where built), in either layout, and so do key-vector masks (a causal one
    the Gluon kernel where built); full masks, fp32, other head dims, decode shapes and
    ORT_FLASH_TMA=0 do not."""
    from ort_flash import _C

    arch = _C.prepare_device(0)[1]
    bshd = _decode_params(2, 16, 4, 1000, 1000, 128)
    bshd.q_stride = bshd.y_stride = [1000 * 16 * 128, 128, 16 * 128]
    bshd.k_stride = bshd.v_stride = [1000 * 4 * 128, 128, 4 * 128]
    tma_cases = [_decode_params(2, 16, 4, 1000, 1000, 128), _decode_params(1, 32, 32, 513, 700, 64, "bfloat16"), bshd]
    for p in tma_cases:
        assert _C.launch_plan(p)[0] == _unmasked_prefill_kind(p)
    assert _C.launch_plan(_decode_params(2, 16, 4, 1000, 1000, 128, "float32"))[0] == "fwd"
    def masked(d, causal):
        p = _decode_params(2, 16, 4, 1000, 1000, d)
        p.causal = causal
        p.mask_kind = _C.MaskKind.add
        p.mask_len = 1000
        p.mask_stride = [1000, 0, 0, 1]  # (B, 1, 1, S): one key vector per batch
        return p

    # d64 non-causal below the masked Gluon cubins' range (aot/variants.py GLUON_WS_MASKED_FROM): TMA
    p = masked(64, False)
    assert _C.launch_plan(p)[0] == ("fwd_tma" if arch == 90 else "fwd")
    assert _C.launch_variant(p) == ("flash_fwd_tma_fp16_d64_addk" if arch == 90 else "flash_fwd_fp16_d64_addk")
    # causal at any length: the warp-specialized kernel's masked cubin where the build has it
    p = masked(128, True)
    gluon = _gluon_built()
    assert _C.launch_plan(p)[0] == ("fwd_gluon" if gluon else "fwd_tma" if arch == 90 else "fwd")
    assert ("gluon_ws" in _C.launch_variant(p)) == gluon and "_addk" in _C.launch_variant(p)
    p.mask_stride = [1000 * 1000, 0, 1000, 1]  # (B, 1, S, S): full masks keep the pointer kernels
    assert _C.launch_plan(p)[0] == "fwd" and _C.launch_variant(p) == "flash_fwd_fp16_d128_add"
    assert _C.launch_plan(_decode_params(2, 16, 4, 1000, 1000, 80))[0] == "fwd"
    assert _C.launch_plan(_decode_params(1, 32, 8, 1, 4096, 128))[0] == "decode"
    last, out = _in_subprocess("from ort_flash import _C; from test_cuda_kernel import _decode_params as d; "
                               "print(_C.launch_plan(d(2, 16, 4, 1000, 1000, 128))[0])", ORT_FLASH_TMA="0")
    assert last == "fwd", out


@pytest.mark.parametrize("fused", ["0", "1"])
def test_decode_merge_paths_match_reference(fused):
    """ORT_FLASH_FUSED_COMBINE (read once per process, so in a subprocess) forcing each merge of
    the split-KV partials on the decode cases above, whatever their split count: 0 the combine
    kernel, 1 the split kernel's last CTA; against the same reference and bounds."""
    last, out = _in_subprocess(
        "import test_cuda_kernel as t; cases = [c for c in t.CASES if c['sq'] <= 4]; assert len(cases) == 7; "
        "[t.test_kernel_matches_reference(c, dt) for c in cases for dt in ('float16', 'bfloat16', 'float32')]; "
        "print('ok', len(cases))", ORT_FLASH_FUSED_COMBINE=fused)
    assert last == "ok 7", out


def test_tma_tiles():
    """On sm_90 an unmasked TMA call launches the cubin whose tile aot/variants.py's TMA_TILES
    gives for its causal flag and min(Sq, Skv); with extras the one tile those variants have.
    Where the build has the Gluon kernel (which takes the unmasked calls), with ORT_FLASH_GLUON=0
    in a subprocess."""
    from ort_flash import _C

    if _C.prepare_device(0)[1] != 90:
        pytest.skip("the TMA kernels are sm_90 only")
    if not _gluon_built():
        _tma_tiles()
        return
    last, out = _in_subprocess("import test_cuda_kernel as t; t._tma_tiles(); print('ok')", ORT_FLASH_GLUON="0")
    assert last == "ok", out


def _tma_tiles():
    from aot import variants
    from ort_flash import _C

    tiles = {k["variant"]: (k["block_m"], k["block_n"], k["num_warps"]) for k in _C.kernels()}
    for d, causal, sq, skv, extras in [(64, True, 512, 512, False), (64, False, 1024, 1024, False),
                                       (64, True, 8192, 8192, False), (64, False, 16384, 16384, False),
                                       (64, True, 300, 16384, False), (128, False, 1000, 1000, False),
                                       (128, False, 2048, 4096, False), (128, True, 4096, 4096, False),
                                       (128, True, 8192, 9000, False), (128, True, 8192, 8192, True)]:
        p = _decode_params(1, 16, 16, sq, skv, d)
        p.causal = causal
        if extras:
            p.softcap = 30.0
        t = variants.tma_tile(d, causal, min(sq, skv), extras)
        name = _C.launch_variant(p)
        assert name.startswith("flash_fwd_tma_") and tiles[name] == (t.block_m, t.block_n, t.num_warps), (
            d, causal, sq, skv, extras, name)


# Calls the Gluon kernel takes (aot/variants.py GLUON_*), forced onto it whatever the length
# (ORT_FLASH_GLUON=1): odd lengths, a short chunk against a long cache, causal at a key offset (the
# new keys are the last Sq), GQA and MQA, the 3-D layout's storage; LSE is always written.
GLUON_CASES = [
    dict(b=2, hq=4, hkv=4, sq=113, skv=203, d=64),
    dict(b=2, hq=4, hkv=2, sq=113, skv=203, d=128, causal=True, offset=90),
    dict(b=1, hq=8, hkv=2, sq=1000, skv=1000, d=128),
    dict(b=1, hq=8, hkv=2, sq=1000, skv=1000, d=64, causal=True),
    dict(b=1, hq=6, hkv=1, sq=1000, skv=1300, d=128, causal=True, offset=300),
    dict(b=1, hq=2, hkv=2, sq=17, skv=4000, d=128),
    dict(b=2, hq=8, hkv=2, sq=300, skv=333, d=64, layout="bshd"),
    dict(b=1, hq=2, hkv=1, sq=2100, skv=2101, d=128, causal=True, offset=1, layout="bshd"),
    dict(b=1, hq=1, hkv=1, sq=4113, skv=4113, d=64, causal=True),
    # Fewer keys than one key block: MQA causal, and more queries than keys.
    dict(b=2, hq=6, hkv=1, sq=77, skv=77, d=64, causal=True),
    dict(b=1, hq=4, hkv=4, sq=200, skv=50, d=128),
    # Key-vector masks at head dim 128 (aot/variants.py GLUON_WS_MASKS): right padding per batch
    # (the first batch wholly padded), a per-head bool mask with a head that sees no key, causal
    # at an offset, GQA, the 3-D layout.
    dict(b=3, hq=4, hkv=2, sq=1000, skv=1000, d=128, mask="add_keys"),
    dict(b=2, hq=4, hkv=4, sq=300, skv=777, d=128, mask="bool_keys", causal=True, offset=477),
    dict(b=2, hq=4, hkv=1, sq=2100, skv=2100, d=128, mask="add_keys", layout="bshd"),
    dict(b=1, hq=4, hkv=4, sq=129, skv=4000, d=128, mask="bool_keys"),
    # Key-vector masks through the visible-range check (MASK_PREFIX): right padding (a prefix,
    # run unmasked), left padding (unmasked from the run's start; under causal the masked loop),
    # values above HIDDEN_AT (the masked loop), bool and additive; at head dim 64 (non-causal
    # only) and 128, from the d64 range's 2048 keys.
    dict(b=3, hq=4, hkv=2, sq=2100, skv=2100, d=64, mask="add_keys"),
    dict(b=3, hq=4, hkv=4, sq=2050, skv=2300, d=64, mask="add_keys_left"),
    dict(b=3, hq=4, hkv=2, sq=2300, skv=4200, d=64, mask="bool_keys_left"),
    dict(b=3, hq=2, hkv=2, sq=1000, skv=1500, d=128, mask="bool_keys_left"),
    dict(b=3, hq=2, hkv=1, sq=2200, skv=2200, d=64, mask="bool_keys_right", layout="bshd"),
    dict(b=2, hq=4, hkv=4, sq=2100, skv=2100, d=64, mask="add_keys_min"),
    dict(b=2, hq=4, hkv=2, sq=2100, skv=2100, d=64, mask="bool_keys"),
    dict(b=3, hq=4, hkv=4, sq=1000, skv=1000, d=128, mask="add_keys_min"),
    dict(b=2, hq=4, hkv=2, sq=2100, skv=2100, d=128, mask="add_keys_left", causal=True),
    dict(b=3, hq=4, hkv=4, sq=2100, skv=2300, d=128, mask="bool_keys_right", causal=True, offset=200),
    # Packed QKV (BERT's right-padded batches; GQA causal at d128).
    dict(b=3, hq=4, hkv=4, sq=2100, skv=2100, d=64, mask="add_keys", layout="packed"),
    dict(b=1, hq=4, hkv=2, sq=2100, skv=2100, d=128, causal=True, layout="packed"),
    # A key bound per batch row with positions kept (GroupQueryAttention's batched first prompt:
    # FlashParams::key_bound, beside its mask): the one-partition kernel (d128 below 1024 keys, d64
    # below 2048), the dynamic persistent grid (causal d128 from 1024, d64 from 2048; d64
    # non-causal from 1024), two tiles a CTA (d128 non-causal); with ORT_FLASH_GLUON=0 the mask.
    dict(b=3, hq=8, hkv=2, sq=300, skv=333, d=128, causal=True, key_bound=True),
    dict(b=4, hq=4, hkv=2, sq=700, skv=800, d=64, causal=True, key_bound=True),
    dict(b=3, hq=8, hkv=2, sq=1100, skv=1111, d=128, causal=True, key_bound=True),
    dict(b=2, hq=8, hkv=2, sq=2100, skv=2100, d=64, causal=True, key_bound=True),
    dict(b=3, hq=4, hkv=2, sq=1100, skv=1100, d=64, key_bound=True),
    dict(b=3, hq=4, hkv=2, sq=600, skv=650, d=128, key_bound=True, layout="bshd"),
]


# Q's rotary on load (FlashParams::rotary_half: a GroupQueryAttention first prompt), which only the
# Gluon kernels apply: the one-partition kernel (d128 below 1024 keys, d64 below 2048), the
# warp-specialized one on each grid (per tile; dynamic persistent; two tiles a CTA) and with a
# key-vector mask, rows from max_position on left unrotated, packed QKV.
ROTARY_CASES = [
    dict(b=3, hq=8, hkv=2, sq=300, skv=333, d=128, causal=True, key_bound=True, rotary=True),
    dict(b=2, hq=4, hkv=2, sq=700, skv=700, d=64, causal=True, rotary=True, max_position=650),
    dict(b=2, hq=8, hkv=2, sq=2100, skv=2100, d=64, causal=True, key_bound=True, rotary=True),
    dict(b=3, hq=8, hkv=2, sq=1100, skv=1111, d=128, causal=True, key_bound=True, rotary=True, max_position=1000),
    dict(b=3, hq=4, hkv=2, sq=600, skv=650, d=128, key_bound=True, layout="bshd", rotary=True),
    dict(b=1, hq=4, hkv=2, sq=2100, skv=2100, d=128, causal=True, layout="packed", rotary=True),
    dict(b=3, hq=4, hkv=2, sq=1000, skv=1000, d=128, mask="add_keys", rotary=True),
]


def test_gluon_rotary_matches_reference():
    """ROTARY_CASES in fp16 and bf16 on the Gluon kernels against the float64 reference of the
    host-rotated Q, with NaN-poisoned Y and LSE (in a subprocess: ORT_FLASH_GLUON=1)."""
    if not _gluon_built():
        pytest.skip("this build has no Gluon kernels for this GPU (aot/variants.py GLUON_ENABLED, sm_90)")
    last, out = _in_subprocess(
        "import test_cuda_kernel as t; "
        "[t.test_kernel_matches_reference(c, dt, kind='fwd_gluon') for c in t.ROTARY_CASES "
        "for dt in ('float16', 'bfloat16')]; print('ok', len(t.ROTARY_CASES))", ORT_FLASH_GLUON="1")
    assert last == f"ok {len(ROTARY_CASES)}", out


@pytest.mark.parametrize("switch,kind", [("1", "fwd_gluon"), ("0", "fwd_tma")])
def test_gluon_kernel_matches_reference(switch, kind):
    """GLUON_CASES in fp16 and bf16 against the float64 reference with NaN-poisoned Y and LSE:
    ORT_FLASH_GLUON=1 runs each on the Gluon kernel (the plan says so; a key-bound case on the
    unmasked one), =0 on the TMA kernel it replaces (the kill switch; key-bound cases with their
    mask). In a subprocess (the switches are read once per process)."""
    if not _gluon_built():
        pytest.skip("this build has no Gluon kernels for this GPU (aot/variants.py GLUON_ENABLED, sm_90)")
    n = len(GLUON_CASES)
    last, out = _in_subprocess(
        "import test_cuda_kernel as t; "
        f"[t.test_kernel_matches_reference(c, dt, kind='{kind}') for c in t.GLUON_CASES for dt in ('float16', 'bfloat16')]; "
        "print('ok', len(t.GLUON_CASES))", ORT_FLASH_GLUON=switch)
    assert last == f"ok {n}", out


def test_kernels_load_on_this_gpu():
    from ort_flash import _C

    arch, table_arch, sms, n = _C.prepare_device(0)
    assert table_arch // 10 == arch // 10 and n > 0, (arch, table_arch, n)


def test_tensors_past_2_31_elements():
    """Q and Y of 2^31 + 4736 elements (int64 offsets): the last rows of the last head are right."""
    from ort_flash import _C

    b, hq, hkv, sq, skv, d = 1, 2, 1, (1 << 24) + 37, 64, 64
    assert b * hq * sq * d > 2**31
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(secrets.randbits(31))
    q = torch.randn(b, hq, sq, d, device=dev, dtype=torch.float16, generator=gen)
    k = torch.randn(b, hkv, skv, d, device=dev, dtype=torch.float16, generator=gen)
    v = torch.randn(b, hkv, skv, d, device=dev, dtype=torch.float16, generator=gen)
    y = torch.full_like(q, float("nan"))
    p = _C.FlashParams()
    p.dtype = _C.DType.float16
    p.q, p.k, p.v, p.y = q.data_ptr(), k.data_ptr(), v.data_ptr(), y.data_ptr()
    p.batch, p.hq, p.hkv, p.sq, p.skv, p.d, p.dv = b, hq, hkv, sq, skv, d, d
    p.q_stride, p.k_stride, p.v_stride, p.y_stride = (list(t.stride()[:3]) for t in (q, k, v, y))
    p.scale = 0.125
    _C.run_cuda(p, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    tail = slice(sq - 300, sq)
    qt = q[:, :, tail].float().cpu().numpy().astype(np.float16)
    ref, _, _, _ = attention_reference(qt, k.cpu().numpy(), v.cpu().numpy(), scale=0.125)
    low, _, _, _ = attention_lowp(qt, k.cpu().numpy(), v.cpu().numpy(), scale=0.125)
    got = y[:, :, tail].double().cpu().numpy()
    assert not np.isnan(got).any()
    assert np.abs(got - ref).max() <= error_bound(ref, low, FLOORS["float16"])
    assert not torch.isnan(y).any().item(), "unwritten elements of Y"


def test_decode_pdl_dispatch():
    """On sm_90 the decode split kernel launches with programmatic dependent launch (its cubin
    waits for the grid before it first thing); prefill, other GPUs and ORT_FLASH_PDL=0 do not."""
    from ort_flash import _C

    hopper = _C.prepare_device(0)[1] >= 90
    assert _C.launch_pdl(_decode_params(1, 32, 8, 1, 32768, 128)) == hopper
    assert _C.launch_pdl(_decode_params(32, 32, 8, 1, 4096, 128)) == hopper  # the wide tile
    assert not _C.launch_pdl(_decode_params(1, 32, 8, 128, 4096, 128))  # prefill
    last, out = _in_subprocess("from ort_flash import _C; from test_cuda_kernel import _decode_params as d; "
                               "print(_C.launch_pdl(d(1, 32, 8, 1, 32768, 128)))", ORT_FLASH_PDL="0")
    assert last == "False", out


@pytest.mark.parametrize("pdl", ["", "0"])
@pytest.mark.parametrize("shape", [(1, 32, 8, 4096), (1, 8, 1, 32768), (32, 32, 8, 2048)],
                         ids=lambda s: "x".join(map(str, s)))
def test_decode_chain_reads_the_grid_before(shape, pdl):
    """Back-to-back decode calls on one stream, each one's Q the previous one's Y (NaN until that
    call writes it), with no host synchronization between: with programmatic dependent launch a
    call may start while the one before drains, so any read before its griddepcontrol.wait would
    see NaN or stale rows. Every step against the float64 reference on the Q it was given; the
    shapes take the fused merge (Y written last, by the last CTA), the combine kernel (a second
    launch between) and the wide tile. In a subprocess for ORT_FLASH_PDL=0 (read once)."""
    b, hq, hkv, skv = shape
    last, out = _in_subprocess(f"import test_cuda_kernel as t; t._decode_chain({b}, {hq}, {hkv}, {skv}); print('ok')",
                               ORT_FLASH_PDL=pdl)
    assert last == "ok", out


def _decode_chain(b, hq, hkv, skv, steps=12, d=128):
    from ort_flash import _C

    seed = secrets.randbits(32)
    rng = np.random.default_rng(seed)

    def rand(*shape):  # drawn on the host, like the other tests here
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to("cuda", torch.float16)

    k, v = rand(b, hkv, skv, d), rand(b, hkv, skv, d)
    # Q_0 comes from a kernel just before the chain on the same stream (elementwise: under
    # compute-sanitizer's racecheck a device matmul or torch's device generator in this process
    # ended in "failed to handle a hardware exception" before the first decode call).
    x = rand(b, hq, 1, d)
    ys = [torch.full((b, hq, 1, d), float("nan"), device="cuda", dtype=torch.float16) for _ in range(steps + 1)]
    lens = torch.full((b,), skv, dtype=torch.int64, device="cuda")
    plans = set()
    stream = torch.cuda.current_stream()
    torch.cuda.synchronize()
    torch.mul(x, 0.5, out=ys[0])
    for i in range(steps):
        p = _decode_params(b, hq, hkv, 1, skv, d)
        p.q, p.k, p.v, p.y = ys[i].data_ptr(), k.data_ptr(), v.data_ptr(), ys[i + 1].data_ptr()
        p.scale = 8.0 / d ** 0.5  # sharp enough that a wrong Q shows
        p.seqlens_k = lens.data_ptr()
        plans.add(_C.launch_plan(p)[:2] + (_C.launch_pdl(p),))
        _C.run_cuda(p, stream.cuda_stream)
    torch.cuda.synchronize()
    # The float64 reference on the host.
    kf, vf = (t.cpu().double().repeat_interleave(hq // hkv, 1) for t in (k, v))
    for i in range(steps):
        q = ys[i].cpu().double()
        ref = torch.softmax(q @ kf.transpose(-1, -2) * (8.0 / d ** 0.5), -1) @ vf
        got = ys[i + 1].cpu().double()
        assert not got.isnan().any(), f"step {i} (seed {seed}, plans {plans}): unwritten or NaN-read rows"
        err = float((got - ref).abs().max())
        assert err < 4e-3 * max(1.0, float(ref.abs().max())), f"step {i} (seed {seed}, plans {plans}): max|Y-ref| {err:.3g}"
    assert all(kind == "decode" for kind, *_ in plans), plans
