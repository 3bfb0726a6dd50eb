"""FlashAttention op cases shared by every execution provider's tests.

A case is a dict overriding DEFAULTS. ``run_case(case, provider)`` draws fresh random inputs
(the seed is printed in every failure message; pass ``seed=`` to replay one), runs the one-node
model on ONNX Runtime and checks every output against ``ort_flash.reference``:

* Y: max |y - ref| <= 2 * max |lowp - ref| + floor (lowp = the plain computation in the
  inputs' dtype), no NaN anywhere (outputs are poisoned with NaN before the run), fully
  masked rows exactly 0;
* softmax_lse: the same contract on |lse - ref| / max(1, |ref|), -inf exactly where the
  reference has it;
* present_key / present_value: bit-exact.

``layout``: "bnsh" (4-D), "bsd" (3-D with head attributes), "packed" (3-D Q holding Q | K | V
on its last axis, K and V omitted; sq == skv) or "kv_packed" (3-D Q, 3-D K holding K | V on its
last axis, V omitted).

Mask specs are (kind, dims): kind "bool", "additive" (normal values, ~10% -inf) or "finfo"
(0 / finfo.min, as Hugging Face builds masks); dims name each mask axis, "1" for a broadcast
one (e.g. "qk", "hqk", "b1qk", "b11k"). ``mask_len`` shortens its key axis; ``masked_rows``
("-inf" / "finfo" / True for bool) fully masks query rows 0 and Sq // 2 in it.
"""

from __future__ import annotations

import secrets

import ml_dtypes
import numpy as np

from _onnx_models import flash_attention_model, run_model
from ort_flash.reference import attention_lowp, attention_reference, error_bound, split_packed_kv, split_packed_qkv

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# Floors of the error contract, (Y absolute, lse relative).
FLOORS = {"float32": (4e-6, 4e-6), "float16": (1e-3, 1e-5), "bfloat16": (8e-3, 1e-5)}

DEFAULTS = dict(
    name="", dtype="float16", b=2, hq=4, hkv=4, sq=113, skv=203, d=64, dv=None,
    layout="bnsh", past=0, mask=None, mask_len=None, masked_rows=None, nonpad=False,
    causal=False, window=(-1, -1), softcap=0.0, scale=None, lse=True,
)

_BASE = [
    dict(name="plain"),
    dict(name="causal", causal=True),
    dict(name="causal_sq_gt_skv", causal=True, sq=203, skv=113),
    dict(name="gqa_causal", hq=8, hkv=2, causal=True),
    dict(name="mqa_decode_past", hq=8, hkv=1, sq=1, skv=1, past=202, causal=True),
    dict(name="past_causal", sq=16, skv=16, past=97, causal=True),
    dict(name="3d_gqa", layout="bsd", hq=8, hkv=2, causal=True),
    dict(name="3d_past", layout="bsd", hq=6, hkv=3, sq=7, skv=7, past=50, d=32, dv=48,
         causal=True),
    dict(name="d_ne_dv", d=96, dv=40),
    dict(name="tiny_dims", d=5, dv=3, sq=9, skv=11),
    dict(name="d256", hq=2, hkv=2, sq=70, skv=130, d=256, causal=True),
    dict(name="bool_mask_qk", mask=("bool", "qk")),
    dict(name="bool_mask_hqk_causal", mask=("bool", "hqk"), causal=True),
    dict(name="bool_mask_b1qk_gqa", mask=("bool", "b1qk"), hq=8, hkv=2),
    dict(name="add_mask_bhqk", mask=("additive", "bhqk")),
    dict(name="add_mask_1hqk_gqa", mask=("additive", "1hqk"), hq=8, hkv=2, causal=True),
    dict(name="add_mask_b11k", mask=("additive", "b11k")),
    dict(name="hf_mask_b11k_causal", mask=("finfo", "b11k"), causal=True),
    # Key-vector masks (query stride 0) on the head dims with their own CUDA variants (TMA on sm_90).
    dict(name="hf_mask_b11k_3d_d128", layout="bsd", hq=8, hkv=2, d=128, mask=("finfo", "b11k")),
    dict(name="short_add_mask_b11k_causal", d=128, mask=("additive", "b11k"), mask_len=150, causal=True),
    dict(name="bool_mask_1h1k_window", hq=8, hkv=2, mask=("bool", "1h1k"), window=(40, 8)),
    dict(name="short_bool_mask_nonpad", mask=("bool", "b1qk"), mask_len=150, nonpad=True),
    dict(name="short_add_mask", mask=("additive", "1qk"), mask_len=120),
    dict(name="short_mask_past", mask=("bool", "qk"), mask_len=100, past=60, sq=20, skv=60),
    dict(name="mask_one_key", mask=("additive", "qk"), mask_len=1),  # padded, not broadcast
    dict(name="nonpad", nonpad=True, b=3),
    dict(name="nonpad_causal", nonpad=True, causal=True, b=4),
    dict(name="window", window=(32, 8)),
    dict(name="window_00", window=(0, 0)),
    dict(name="window_causal_past", window=(40, -1), causal=True, past=64, sq=64, skv=64),
    dict(name="window_nonpad", window=(16, 4), nonpad=True, b=3),
    dict(name="softcap_scale", softcap=2.0, scale=0.3),
    dict(name="sharp_softmax", scale=1.5, causal=True),  # scores of std 12
    dict(name="softcap_mask_causal", softcap=5.0, mask=("additive", "bhqk"), causal=True),
    dict(name="masked_rows_bool", mask=("bool", "bhqk"), masked_rows=True),
    dict(name="masked_rows_neginf", mask=("additive", "1hqk"), masked_rows="-inf"),
    dict(name="masked_rows_finfo", mask=("finfo", "qk"), masked_rows="finfo"),
    dict(name="sq1", sq=1),
    dict(name="sq1_nonpad_causal", sq=1, nonpad=True, causal=True, b=3),
    dict(name="no_lse", causal=True, lse=False),
    dict(name="empty_kv", skv=0),
    dict(name="empty_q", sq=0),
    # Decode shapes: on CUDA the split-KV kernel (GQA rows packed, cache split, then combined).
    dict(name="decode_gqa_long", hq=8, hkv=2, sq=1, skv=2049, d=128, causal=True, b=1),
    dict(name="decode_sq4_mask", hq=8, hkv=2, sq=4, skv=1500, mask=("additive", "b11k"), causal=True),
    dict(name="decode_nonpad_window_softcap", b=3, sq=1, skv=1800, nonpad=True, window=(700, -1),
         softcap=5.0, causal=True),
    dict(name="decode_past_long", hq=4, hkv=1, sq=1, skv=1, past=2000, causal=True),
    dict(name="decode_masked_rows", hq=4, hkv=2, sq=2, skv=1000, mask=("bool", "bhqk"), masked_rows=True),
    dict(name="decode_3d_dv", layout="bsd", hq=6, hkv=3, sq=3, skv=1300, d=96, dv=40, causal=True),
    # Packed QKV (K and V omitted): Q is (B, S, (Hq + 2 Hkv) * D), keys the same tokens.
    dict(name="packed", layout="packed", sq=113, skv=113),
    dict(name="packed_gqa_causal_hf_mask", layout="packed", hq=8, hkv=2, sq=203, skv=203,
         mask=("finfo", "b11k"), causal=True),
    dict(name="packed_d128_bool_mask", layout="packed", hq=4, hkv=4, sq=300, skv=300, d=128,
         mask=("bool", "b11k")),
    dict(name="packed_d32_nonpad_window_softcap", layout="packed", hq=6, hkv=3, sq=77, skv=77,
         d=32, nonpad=True, b=3, window=(20, 5), softcap=4.0),
    # Packed KV (V omitted): K is (B, Skv, 2 Hkv * D), Q apart (cross-attention lengths too).
    dict(name="kv_packed", layout="kv_packed", sq=113, skv=113),
    dict(name="kv_packed_cross_gqa_hf_mask", layout="kv_packed", hq=8, hkv=2, sq=61, skv=203,
         mask=("finfo", "b11k")),
    dict(name="kv_packed_d128_causal_bool_mask", layout="kv_packed", hq=4, hkv=4, sq=300, skv=300,
         d=128, causal=True, mask=("bool", "b11k")),
    dict(name="kv_packed_d40_nonpad_window_softcap", layout="kv_packed", hq=6, hkv=3, sq=77, skv=90,
         d=40, nonpad=True, b=3, window=(20, 5), softcap=4.0),
]
_LARGE = [
    dict(name="large_1023x1024", dtype="float16", b=1, hq=2, hkv=2, sq=1023, skv=1024),
    dict(name="large_1023x1024_causal", dtype="bfloat16", b=1, hq=2, hkv=1, sq=1023,
         skv=1024, causal=True),
    # Packed QKV at lengths where sm_90 runs the TMA and warp-specialized kernels on its rows.
    dict(name="large_packed_2100_hf_mask", dtype="float16", layout="packed", b=1, hq=4, hkv=2,
         sq=2100, skv=2100, mask=("finfo", "b11k")),
    dict(name="large_packed_1100_d128_causal", dtype="bfloat16", layout="packed", b=1, hq=2,
         hkv=2, sq=1100, skv=1100, d=128, causal=True),
    dict(name="large_kv_packed_2100_hf_mask", dtype="float16", layout="kv_packed", b=1, hq=12, hkv=12,
         sq=2100, skv=2100, mask=("finfo", "b11k")),
    dict(name="large_kv_packed_1100_d128_causal", dtype="bfloat16", layout="kv_packed", b=1, hq=2,
         hkv=1, sq=1100, skv=1100, d=128, causal=True),
]
CASES = [dict(c, dtype=dt) for c in _BASE for dt in DTYPES] + _LARGE


def case_id(case: dict) -> str:
    c = {**DEFAULTS, **case}
    return f"{c['name']}-{c['dtype']}"


def _mask(c, rng, dtype, total):
    kind, dims = c["mask"]
    size = {"b": c["b"], "h": c["hq"], "q": c["sq"], "k": c["mask_len"] or total, "1": 1}
    shape = tuple(size[ch] for ch in dims)
    if kind == "bool":
        mask = rng.random(shape) < 0.85
        masked_value = False
    elif kind == "additive":
        mask = rng.standard_normal(shape, dtype=np.float32)
        mask[rng.random(shape) < 0.1] = -np.inf
        masked_value = -np.inf
    else:  # finfo
        finfo_min = float(ml_dtypes.finfo(dtype).min)
        mask = np.where(rng.random(shape) < 0.85, 0.0, finfo_min)
        masked_value = finfo_min
    if c["masked_rows"]:
        if "q" not in dims:
            raise ValueError("masked_rows needs a mask with a query axis")
        index = [slice(None)] * len(dims)
        index[dims.index("q")] = [0, c["sq"] // 2]
        mask[tuple(index)] = masked_value if kind == "bool" else (
            -np.inf if c["masked_rows"] == "-inf" else float(ml_dtypes.finfo(dtype).min))
    return mask if kind == "bool" else mask.astype(dtype)


def make_inputs(case: dict, rng: np.random.Generator):
    """(feeds, attrs, reference kwargs) of a case, with fresh random data from rng."""
    c = {**DEFAULTS, **case}
    dtype = DTYPES[c["dtype"]]
    b, hq, hkv, sq, skv, d = (c[k] for k in ("b", "hq", "hkv", "sq", "skv", "d"))
    dv = c["dv"] or d
    total = c["past"] + skv

    def randn(*shape):
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)

    if c["layout"] == "bnsh":
        feeds = {"Q": randn(b, hq, sq, d), "K": randn(b, hkv, skv, d), "V": randn(b, hkv, skv, dv)}
    elif c["layout"] == "packed":
        if sq != skv or dv != d or c["past"]:
            raise ValueError("packed QKV needs sq == skv, dv == d and no past")
        feeds = {"Q": randn(b, sq, (hq + 2 * hkv) * d)}
    elif c["layout"] == "kv_packed":
        if dv != d or c["past"]:
            raise ValueError("packed KV needs dv == d and no past")
        feeds = {"Q": randn(b, sq, hq * d), "K": randn(b, skv, 2 * hkv * d)}
    else:
        feeds = {"Q": randn(b, sq, hq * d), "K": randn(b, skv, hkv * d),
                 "V": randn(b, skv, hkv * dv)}
    if c["mask"]:
        feeds["attn_mask"] = _mask(c, rng, dtype, total)
    if c["past"]:
        feeds["past_key"] = randn(b, hkv, c["past"], d)
        feeds["past_value"] = randn(b, hkv, c["past"], dv)
    if c["nonpad"]:
        top = min(total, c["mask_len"] or total)
        lens = rng.integers(0, top + 1, size=b)
        lens[0] = top
        if b > 2:
            lens[1] = rng.integers(0, min(sq, top) + 1)  # causal: leading rows see nothing
        feeds["nonpad_kv_seqlen"] = lens.astype(np.int64)
    heads = dict(q_num_heads=hq, kv_num_heads=hkv) if c["layout"] != "bnsh" else {}
    left, right = c["window"]
    attrs = dict(
        scale=c["scale"], is_causal=int(c["causal"]), softcap=c["softcap"] or None,
        left_window_size=left if left >= 0 else None,
        right_window_size=right if right >= 0 else None, **heads)
    f32 = lambda x: None if x is None else float(np.float32(x))  # noqa: E731 (attribute type)
    ref_kwargs = dict(
        attn_mask=feeds.get("attn_mask"), past_key=feeds.get("past_key"),
        past_value=feeds.get("past_value"), nonpad_kv_seqlen=feeds.get("nonpad_kv_seqlen"),
        scale=f32(c["scale"]), is_causal=c["causal"], softcap=f32(c["softcap"]),
        left_window_size=left, right_window_size=right,
        q_num_heads=heads.get("q_num_heads"), kv_num_heads=heads.get("kv_num_heads"))
    return feeds, attrs, ref_kwargs


def qkv(case: dict, feeds: dict):
    """Q, K, V as the reference takes them: the inputs, or the parts of packed QKV / packed KV."""
    c = {**DEFAULTS, **case}
    if c["layout"] == "packed":
        return split_packed_qkv(feeds["Q"], c["hq"], c["hkv"])
    if c["layout"] == "kv_packed":
        return (feeds["Q"], *split_packed_kv(feeds["K"], c["hkv"]))
    return feeds["Q"], feeds["K"], feeds["V"]


def _lse_err(lse, ref, alt=None):
    """Max relative error of lse against ref over the finite rows; where ``alt`` is given, each
    row's error is the smaller of the two (an admitted alternative value per row)."""
    finite = np.isfinite(ref) & np.isfinite(lse)

    def rel(want):
        return np.abs(lse[finite].astype(np.float64) - want[finite]) / np.maximum(1.0, np.abs(want[finite]))
    err = rel(ref) if alt is None else np.minimum(rel(ref), rel(alt))
    return float(np.max(err, initial=0.0))


# docs/guarantees.md: the masked warp-specialized CUDA cubins count an additive mask value below
# -1e38 as -1e38, so the LSE of a row whose every visible key carries such a value (bf16/fp32
# finfo.min) is the exact one shifted by -1e38 - fill; Y is exact.
MASK_CLAMP = -1.0e38


def _clamped_lse(ref_lse, c):
    """The LSE the documented clamp gives, or None where the case's mask has no value below it."""
    if c["mask"] is None or c["mask"][0] != "finfo":
        return None
    fill = float(ml_dtypes.finfo(DTYPES[c["dtype"]]).min)
    if fill >= MASK_CLAMP:
        return None
    return np.where(ref_lse < MASK_CLAMP, ref_lse + (MASK_CLAMP - fill), ref_lse)


def check_case(case: dict, runner, seed: int | None = None) -> dict:
    """Runs one case through ``runner(model_bytes, feeds, output_specs) -> outputs`` and
    asserts the contract. Returns the errors and bounds found."""
    c = {**DEFAULTS, **case}
    seed = secrets.randbits(64) if seed is None else seed
    ctx = f"case {case_id(case)} seed={seed}"
    feeds, attrs, ref_kwargs = make_inputs(case, np.random.default_rng(seed))
    q, k, v = qkv(c, feeds)
    ref_y, ref_pk, ref_pv, ref_lse = attention_reference(q, k, v, **ref_kwargs)
    low_y, _, _, low_lse = attention_lowp(q, k, v, **ref_kwargs)
    dtype = DTYPES[c["dtype"]]
    specs = {"Y": (ref_y.shape, dtype)}
    if c["past"]:
        specs["present_key"] = (ref_pk.shape, dtype)
        specs["present_value"] = (ref_pv.shape, dtype)
    if c["lse"]:
        specs["softmax_lse"] = (ref_lse.shape, np.float32)
    model = flash_attention_model(feeds, {n: s[1] for n, s in specs.items()}, **attrs)
    out = runner(model, feeds, specs)

    y = out["Y"].astype(np.float64)
    assert not np.isnan(y).any(), f"{ctx}: NaN in Y ({np.isnan(y).sum()} elements)"
    floor_y, floor_lse = FLOORS[c["dtype"]]
    err_y = float(np.max(np.abs(y - ref_y), initial=0.0))
    bound_y = error_bound(ref_y, low_y, floor_y)
    assert err_y <= bound_y, f"{ctx}: max |Y - ref| = {err_y:.3g} > bound {bound_y:.3g}"
    masked = np.isneginf(ref_lse)  # fully masked rows, (B, Hq, Sq)
    y4 = y if y.ndim == 4 else y.reshape(c["b"], c["sq"], c["hq"], c["dv"] or c["d"]).transpose(0, 2, 1, 3)
    assert not np.any(y4[masked]), f"{ctx}: a fully masked row of Y is not 0"
    result = dict(err_y=err_y, bound_y=bound_y)
    if c["lse"]:
        lse = out["softmax_lse"]
        assert not np.isnan(lse).any(), f"{ctx}: NaN in softmax_lse"
        assert np.array_equal(np.isneginf(lse), masked) and not np.isposinf(lse).any(), (
            f"{ctx}: softmax_lse is -inf at {np.isneginf(lse).sum()} rows, the reference at "
            f"{masked.sum()}")
        err_lse = _lse_err(lse, ref_lse, _clamped_lse(ref_lse, c))
        bound_lse = 2 * _lse_err(low_lse, ref_lse) + floor_lse
        assert err_lse <= bound_lse, f"{ctx}: lse error {err_lse:.3g} > bound {bound_lse:.3g}"
        result.update(err_lse=err_lse, bound_lse=bound_lse)
    for name, ref in (("present_key", ref_pk), ("present_value", ref_pv)):
        if name in out:
            ref_bytes = np.ascontiguousarray(ref).view(np.uint8)
            assert np.array_equal(out[name].view(np.uint8), ref_bytes), (
                f"{ctx}: {name} differs from past ++ new")
    return result


def run_case(case: dict, provider: str, seed: int | None = None) -> dict:
    """Checks one case on ONNX Runtime with the given execution provider."""
    return check_case(
        case, lambda model, feeds, specs: run_model(model, feeds, specs, [provider]), seed)
