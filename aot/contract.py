"""The contract between the kernels and the C++ launcher, stated once: the codes both sides use,
each kernel's launch arguments (names, types, order) and the numbers a launch shares with a kernel.

Plain data (no Triton): aot/build.py types every kernel's signature from it and refuses a kernel
whose runtime parameters differ from it; aot/contract_header.py generates C++'s view of it,
BUILD/aot/contract.gen.h (the enums, an argument struct per kernel ABI with its packing into the
launch's argument array, the constants), which cpp/ includes instead of keeping copies. A
CPU-only build generates the header too.
"""
from __future__ import annotations

# The enums C++ and the variant table share: (code name in aot/, C++ enumerator), the value is the
# position. DType and MaskKind are the op's too (cpp/flash_params.h).
ENUMS = {
    "DType": (("fp32", "kFloat32"), ("fp16", "kFloat16"), ("bf16", "kBFloat16")),
    "MaskKind": (("none", "kNone"), ("bool", "kBool"), ("add", "kAdditive")),
    # How fp32 dot products are computed on the GPU; fp16/bf16 ignore it.
    "Fp32Precision": (("ieee", "kIeee"), ("tf32x3", "kTf32x3"), ("tf32", "kTf32")),
    # Which kernel of the family (aot/variants.py says what each is).
    "KernelKind": (("fwd", "kFwd"), ("decode", "kDecode"), ("combine", "kCombine"), ("fwd_tma", "kFwdTma"),
                   ("fwd_gluon", "kFwdGluon"), ("gqa_prepare", "kGqaPrepare"), ("gqa_past", "kGqaPast"),
                   ("fp8_stats", "kFp8Stats"), ("fp8_quantize", "kFp8Quantize"), ("fwd_fp8", "kFwdFp8"),
                   ("sink_rescale", "kSinkRescale"), ("gqa_compact", "kGqaCompact"), ("gqa_shift", "kGqaShift")),
}


def codes(enum: str) -> dict[str, int]:
    return {name: i for i, (name, _) in enumerate(ENUMS[enum])}


DTYPE_CODES = codes("DType")
MASK_KINDS = codes("MaskKind")
PRECISION_CODES = codes("Fp32Precision")
KIND_CODES = codes("KernelKind")


def _stride_names(tensor: str) -> tuple[str, ...]:
    """A (B, H, S, ...) tensor's three stride parameters: batch, head, row (m: query rows, n: keys)."""
    return tuple(f"stride_{tensor}{d}" for d in ("b", "h", "m" if tensor in "qym" else "n"))


# A parameter's type: "ptr:<element>" a device pointer to the call's dtype ("ptr:dtype"), to the
# mask's element ("ptr:mask": bytes for a bool mask or none, the dtype for an additive one) or to
# f32 / i64 / i32 / i8 / fp8 (e4m3); else the scalar "f32", "i32" or "i64".
_STRIDES = tuple((n, "i64") for t in "qkvym" for n in _stride_names(t))
_TENSORS = (("Q", "ptr:dtype"), ("K", "ptr:dtype"), ("V", "ptr:dtype"), ("Y", "ptr:dtype"), ("Lse", "ptr:f32"),
            ("Mask", "ptr:mask"), ("SeqlensK", "ptr:i64"))
_SHAPE = tuple((n, "i32") for n in ("Hq", "group", "Sq", "Skv", "D", "Dv", "offset", "causal", "window_left",
                                    "window_right", "mask_len", "has_seqlens", "store_lse"))
_FWD = _TENSORS + (("scale", "f32"), ("softcap", "f32")) + _SHAPE + _STRIDES
# Each kernel ABI's runtime parameters in launch order (the non-constexpr parameters of its kernel
# functions; the launch appends Triton's two scratch pointers, passed 0).
ABIS = {
    # flash_fwd (the pointer and the TMA kinds)
    "Fwd": _FWD,
    # flash_fwd_gluon and flash_fwd_gluon_ws: the forward's, then the dynamic tiles' counter pair
    # (int64: tiles claimed, CTAs done; zero at launch, left zero), 0 where the launch has none (a
    # kernel without DYNAMIC_TILES never reads it). After the forward's, so that those keep their
    # places in the parameter buffer. Then Q's rotary, applied as Q's tile is loaded (a
    # GroupQueryAttention first prompt): rotary_half > 0 turns query row i's halves (x[c],
    # x[c + rotary_half]), c < rotary_half = D / 2, by row i of Cos / Sin (max_position rows of
    # rotary_half values each; a row from max_position on stays as it is); 0 takes Q as it is.
    "FwdGluon": _FWD + (("TileCounter", "ptr:i64"), ("Cos", "ptr:dtype"), ("Sin", "ptr:dtype"),
                        ("rotary_half", "i32"), ("max_position", "i32")),
    # flash_decode_split: the forward's, with its partials, counters, splits and merge mode
    "Decode": _TENSORS + (("OPart", "ptr:f32"), ("LsePart", "ptr:f32"), ("Counter", "ptr:i32"), ("scale", "f32"),
                          ("softcap", "f32")) + _SHAPE + (("num_splits", "i32"), ("fused", "i32")) + _STRIDES,
    # flash_decode_combine
    "Combine": (("OPart", "ptr:f32"), ("LsePart", "ptr:f32"), ("Y", "ptr:dtype"), ("Lse", "ptr:f32"), ("Hq", "i32"),
                ("Sq", "i32"), ("Dv", "i32"), ("num_splits", "i32"), ("store_lse", "i32"), ("stride_yb", "i64"),
                ("stride_yh", "i64"), ("stride_ym", "i64")),
    # gqa_prepare (its four kinds). K and V may point into packed QKV. StageK / StageV, cap, gap,
    # stage_len and shared: a windowed cache's stage (cap 0: none); in gqa_shift's launches StageK /
    # StageV are its save buffers and shift_phase says which of its two launches runs (0 elsewhere).
    "GqaPrepare": tuple((n, "ptr:dtype") for n in ("Q", "K", "V", "PastK", "PastV", "PresentK", "PresentV", "QRot",
                                                   "Cos", "Sin", "StageK", "StageV"))
    + (("PositionIds", "ptr:i64"), ("Seqlens", "ptr:i32"), ("Totals", "ptr:i64"), ("KeyMask", "ptr:i8"),
       ("QNorm", "ptr:dtype"), ("KNorm", "ptr:dtype"))
    + tuple((n, "i32") for n in ("S", "Hq", "Hkv", "D", "q_heads", "rotary", "rotary_half", "max_position",
                                 "has_position_ids", "first_prompt", "write_mask", "total_max", "present_len",
                                 "past_len", "qk_norm", "cap", "gap", "stage_len", "shared"))
    + (("qk_eps", "f32"),)
    + tuple((f"stride_{t}{d}", "i64") for t in "qkv" for d in "bs") + (("shift_phase", "i32"),),
    # The FP8 prefill path (aot/fp8_prepare.py, aot/flash_fwd_fp8.py): K's column sums and V's
    # column maxima per key head, then the e4m3 operands and their scales, then the attention.
    "Fp8Stats": (("K", "ptr:dtype"), ("V", "ptr:dtype"), ("Part", "ptr:f32"), ("H", "i32"), ("N", "i32"),
                 ("splits", "i32")) + tuple((n, "i64") for t in "kv" for n in _stride_names(t)),
    "Fp8Quantize": tuple((n, "ptr:dtype") for n in "QKV") + (("Part", "ptr:f32"),)
    + tuple((n, "ptr:fp8") for n in ("Q8", "K8", "V8t"))
    + tuple((n, "ptr:f32") for n in ("ScaleQ", "ScaleK", "ScaleV", "QBias"))
    + tuple((n, "i32") for n in ("Hq", "group", "N", "splits"))
    + tuple((n, "i64") for t in "qkv" for n in _stride_names(t)),
    "FwdFp8": tuple((n, "ptr:fp8") for n in ("Q8", "K8", "V8t"))
    + tuple((n, "ptr:f32") for n in ("ScaleQ", "ScaleK", "ScaleV", "QBias"))
    + (("Y", "ptr:dtype"), ("Lse", "ptr:f32"), ("softmax_scale", "f32"))
    + tuple((n, "i32") for n in ("Hq", "group", "N", "store_lse")) + tuple((n, "i64") for n in _stride_names("y")),
    # sink_rescale (aot/sink_rescale.py): GroupQueryAttention's attention sinks, applied to the
    # attention's output in place from its log-sum-exp. Sinks (Hq,) is read only where has_sinks.
    "SinkRescale": (("Y", "ptr:dtype"), ("Lse", "ptr:f32"), ("Sinks", "ptr:dtype"))
    + tuple((n, "i32") for n in ("has_sinks", "Hq", "Sq", "D")) + tuple((n, "i64") for n in _stride_names("y")),
}
KIND_ABIS = {"fwd": "Fwd", "fwd_tma": "Fwd", "fwd_gluon": "FwdGluon", "decode": "Decode", "combine": "Combine",
             "gqa_prepare": "GqaPrepare", "gqa_past": "GqaPrepare", "gqa_compact": "GqaPrepare",
             "gqa_shift": "GqaPrepare",
             "fp8_stats": "Fp8Stats",
             "fp8_quantize": "Fp8Quantize", "fwd_fp8": "FwdFp8", "sink_rescale": "SinkRescale"}
# fwd_tma, fwd_gluon: these are (B, H, S, D) TMA descriptors. Each is, in the launch, the
# CUtensorMap (128 bytes, by value), its TMA_RANK dims (i32), then its TMA_RANK strides (i64).
TMA_KINDS = ("fwd_tma", "fwd_gluon")
TMA_ARGS = ("Q", "K", "V", "Y")
TMA_RANK = 4
TMA_MAP_BYTES = 128

# The counters a launch passes from the stream's set (cpp/kernel_registry.h): the split-KV
# kernel's arrival counters (int32, one per row block; zero at launch, each block's last CTA
# resets its own), then the dynamic tiles' counter pair (int64: tiles claimed, CTAs done; zeroed
# by the last CTA).
DECODE_COUNTERS_PER_SLOT = 4096
TILE_COUNTER_OFFSET = 4 * DECODE_COUNTERS_PER_SLOT
COUNTER_SLOT_BYTES = TILE_COUNTER_OFFSET + 2 * 8
# The decode kernel's calls: at most this many query rows, and GQA group x Sq rows packed into a
# CTA's rows (the launcher's decode_shape; the variant table sizes the merge counters by it).
MAX_DECODE_SQ = 16
MAX_DECODE_ROWS = 64
# The split-KV kernel's fused merge loads a tile of packed rows x splits (x the head dim) at once:
# one L2 round trip each. Wide: a GQA group of 4 at Sq = 1 against up to 16 splits per trip; tall:
# a whole 16-row block (Sq = 4) against up to 4 splits. Same size, so the same registers. The
# launcher fuses the merge where the tile it picks takes few round trips (merge_round_trips).
MERGE_WIDE = (4, 16)
MERGE_TALL = (16, 4)


def runtime_args(kind: str) -> tuple[str, ...]:
    """A kind's runtime parameter names, in launch order."""
    return tuple(n for n, _ in ABIS[KIND_ABIS[kind]])


def ordered_args(kind: str, values: dict) -> list:
    """`values`, a kind's runtime arguments by name, as its launch's list (runtime_args' order). A
    name the ABI lacks, or one it has that `values` leaves out or sets to None, raises ValueError."""
    names = runtime_args(kind)
    unknown = sorted(set(values) - set(names))
    missing = [n for n in names if values.get(n) is None]
    if unknown or missing:
        raise ValueError(f"{kind} ({KIND_ABIS[kind]} ABI) launch: " + "; ".join(
            f"{what} {', '.join(ns)}" for what, ns in (("no value for", missing), ("no parameter", unknown)) if ns))
    return [values[n] for n in names]


def stride_args(tensor: str, strides) -> dict:
    """A tensor's stride arguments by name (`tensor`: q, k, v, y or m) from its first three strides."""
    return dict(zip(_stride_names(tensor), strides[:3]))


def triton_type(kind: str, dtype: str, mask: str) -> str:
    """A contract type as triton.compile's signature names it, for a variant of `dtype` and `mask`."""
    if kind.startswith("ptr:"):
        elem = kind[4:]
        if elem == "mask":
            elem = dtype if mask == "add" else "i8"
        return "*" + {"dtype": dtype, "f32": "fp32", "fp8": "fp8e4nv"}.get(elem, elem)
    return {"f32": "fp32"}.get(kind, kind)


def launch_arg_count(kind: str) -> int:
    """Parameters in a kind's launch (each TMA descriptor counted as its map, dims and strides;
    the two scratch pointers not counted)."""
    n = len(ABIS[KIND_ABIS[kind]])
    return n + (len(TMA_ARGS) * 2 * TMA_RANK if kind in TMA_KINDS else 0)
