"""The variant table: which specializations of the kernels get compiled, and their tiles.

Five kernel kinds: "fwd" (aot/flash_fwd.py, every shape), "fwd_tma" (the same kernel with Q/K/V/Y
as TMA tensor descriptors: sm_90+, fp16/bf16, exact head dims 64 and 128, no mask or a key-vector
mask, taken when the tensors can be described), "fwd_gluon" (aot/flash_fwd_gluon.py, the Gluon
Hopper kernel with the same arguments and descriptors: sm_90, the calls GLUON_* below allow),
"decode" (aot/flash_decode.py's split-KV kernel, few query rows against a long cache) and
"combine" (its merge step); and outside attention, "gqa_prepare" and "gqa_past" (aot/gqa_prepare.py:
GroupQueryAttention's rotary, KV-cache writes and lengths before its attention; one per dtype).
Forward variants with
`mask_keys` read a mask whose query stride is 0 (a (B, 1, 1, S) padding mask) as one key vector per
(batch, head) instead of a BLOCK_M x BLOCK_N tile (the full-mask kernels spill registers).

This file is the single source of the kernel family's shape. aot/build.py compiles the product
below for each target arch and generates the C++ table (`kernel_table.gen.cc`) that the runtime
dispatcher (cpp/cuda_launch.cc, select_variant) searches by `VariantKey`; tile sizes reach C++
through that table, so the launcher never restates them.

Tiles are for Triton 3.6 (the pinned version). The sm_90 fp16/bf16 tiles for head dims 64 and
128 come from experiments/tune.py on the H200 (docs/perf-notes.md), and the unmasked TMA kernels have
one per (causal, sequence-length bucket) (TMA_TILES); the rest are chosen by hand to fit shared
memory and have not been tuned.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

TRITON_VERSION = "3.6.0"

# (dtype, dot precision). fp32 defaults to exact IEEE dots; TF32 is an explicit opt-in.
DTYPE_PRECISIONS = (("fp16", "tf32"), ("bf16", "tf32"), ("fp32", "ieee"), ("fp32", "tf32"))
# Head-dim buckets (BLOCK_D == BLOCK_DV) and whether an exact-size ("even") variant exists.
HEAD_DIMS = ((32, False), (64, True), (128, True), (256, True))
MASK_KINDS = {"none": 0, "bool": 1, "add": 2}
DTYPE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}    # mirrors ort_flash::DType
PRECISION_CODES = {"ieee": 0, "tf32x3": 1, "tf32": 2}  # mirrors ort_flash::Fp32Precision
KIND_CODES = {"fwd": 0, "decode": 1, "combine": 2, "fwd_tma": 3, "fwd_gluon": 4,  # mirrors ort_flash::KernelKind
              "gqa_prepare": 5, "gqa_past": 6}
# TMA descriptors (Hopper's bulk-copy engine): compiled for these archs and shapes only.
TMA_MIN_ARCH = 90
TMA_DTYPES = ("fp16", "bf16")
TMA_HEAD_DIMS = (64, 128)
# The Gluon forward kernel (FA3's Hopper design; its module owns its tiles, get_gluon_config):
# sm_90 only, fp16/bf16, D == Dv in GLUON_HEAD_DIMS with 16-aligned strides, no mask, no extras;
# causal or not, any GQA group and offset. Every other call keeps the kinds above. GLUON_ENABLED
# False builds no such cubin (the dispatch is then exactly the one without it). GLUON_MODULE is
# the module that build.py compiles it from (tests point it at a stand-in).
GLUON_ENABLED = True
GLUON_MODULE = f"{__package__}.flash_fwd_gluon"
GLUON_MIN_ARCH = 90
GLUON_DTYPES = ("fp16", "bf16")
GLUON_HEAD_DIMS = (64, 128)
# Where the Gluon kernels take a call: min(Sq, Skv) in [lo, hi) (hi 0: unbounded), per (dtype,
# head dim, causal). GLUON_WS_LENGTHS: the warp-specialized kernel (GLUON_WS_MODULE: a TMA producer
# warp and two or three consumer warpgroups, FA3's CTA layout), listed only where it takes calls;
# GLUON_LENGTHS: the one-partition kernel (GLUON_MODULE), (0, 0) where not listed, cut below the
# warp-specialized kernel's lower bound (none where that is 0); elsewhere the TMA_TILES kernels
# run. Each cubin carries its range as tile_min_len / tile_max_len, which cpp/cuda_launch.cc's
# pick_tile reads from the generated table, so it is stated here only. From experiments/gluon_attn.py
# on the H200 (JIT, both Gluon kernels, the TMA kernel and cuDNN in one run per file:
# docs/measurements/prefill/gluon-v7-ws.json, gluon-v7-ws-short.json; perf-notes prefill v7): the
# warp-specialized kernel at d128 was 1.09-1.18x the one-partition kernel from N 1024 non-causal
# and 1.04-1.17x from N 2048 causal, even at N 512 non-causal, 0.95-0.99x causal at N 512-1024;
# at d64 (three consumers, 192 rows) 1.05-1.18x from N 2048 non-causal, 1.03-1.13x from N 4096
# causal, 0.58-0.92x below.
GLUON_WS_MODULE = f"{__package__}.flash_fwd_gluon_ws"
# GLUON_WS_PERSISTENT: non-causal unmasked calls on the persistent grid (get_ws_config PERSISTENT:
# one CTA per SM over all tiles; cpp/cuda_launch.cc launches it). Measured in JIT on the H200 (perf-notes
# prefill v14, docs/measurements/prefill/gluon-v14-persistent.json): d128 1.03-1.13x the shipped
# grid at N 512-2048, 1.01-1.06x from 4096; d64 1.01-1.06x the one-partition kernel at N 512-1024
# and 1.00-1.07x the per-tile grid from 2048 (fp16 and bf16). Off until its AOT cubins and the
# launcher's grid have run through the library on a GPU (the GPU suite and `ort-flash bench --suite
# op`): the session that built it lost its GPU before that run. On: d128 non-causal one cubin at
# every length (no two-tile split), d64 non-causal from 512 keys (masked d64 still from 2048).
GLUON_WS_PERSISTENT = False
# GLUON_WS_DYNAMIC: causal unmasked calls on the persistent grid too, its CTAs claiming tiles through
# a per-stream counter as they free up (DYNAMIC_TILES; heads in groups that share L2, each group's
# longest tiles first), where the static order of v14 measured 0.82-0.98x. Written after the last
# GPU session (perf-notes prefill v15): compiled, not yet run. Off until it is measured in JIT
# (experiments/gluon_attn.py) and runs through the library on a GPU.
GLUON_WS_DYNAMIC = False
# GLUON_WS_SKIP: on the unmasked warp-specialized cubins, a consumer whose rows of a tile all lie
# past Sq passes the tile's barriers without its GEMMs (SKIP_PAST_ROWS; at d64 the last of N 512's
# or 1024's 192-row tiles leaves one or two of three consumers without rows). Not yet run: off.
# (Masked cubins never: with it their consumers spill.)
GLUON_WS_SKIP = False
# A development build may turn these on without an edit: ORT_FLASH_GLUON_WS_ON="persistent,dynamic,skip"
# (any of them), so that one build on the GPU machine measures what the switches would ship.
for _name in filter(None, os.environ.get("ORT_FLASH_GLUON_WS_ON", "").replace(" ", "").split(",")):
    if _name not in ("persistent", "dynamic", "skip"):
        raise ValueError(f"ORT_FLASH_GLUON_WS_ON: unknown switch {_name!r} (persistent, dynamic, skip)")
    globals()["GLUON_WS_" + _name.upper()] = True


def ws_tables(persistent: bool, dynamic: bool = False) -> tuple[dict, dict]:
    """GLUON_WS_LENGTHS and GLUON_WS_TILES with the persistent grid off or on (tests build both).
    GLUON_WS_TILES: query tiles per CTA of the warp-specialized kernel, from a min(Sq, Skv) on (1
    elsewhere): a CTA running two tiles in turn has the next tile's Q and K/V loads in flight under
    the last one's epilogue (perf-notes prefill v7: d128 non-causal, two tiles 1.02-1.10x one tile
    at N 512-2048). With the persistent grid none: it measured 1.03-1.13x two tiles per CTA at N
    512-2048 and 1.01-1.06x the shipped tiles from 4096 (perf-notes prefill v14). With dynamic
    tiles causal calls take the persistent grid at every length too (the prediction of perf-notes
    prefill v15, to be measured against the one-partition kernel below 2048 / 4096 keys)."""
    ws_from = {(128, False): 0, (128, True): 0 if dynamic else 2048, (64, False): 512 if persistent else 2048,
               (64, True): 512 if dynamic else 4096}
    lengths = {(dt, hd, c): (lo, 0) for dt in ("fp16", "bf16") for (hd, c), lo in ws_from.items()}
    return lengths, ({} if persistent else {(128, False): {0: 2, 8192: 1}})


GLUON_WS_LENGTHS, GLUON_WS_TILES = ws_tables(GLUON_WS_PERSISTENT, GLUON_WS_DYNAMIC)
# Key-vector masks (a (B, 1, 1, S) padding mask: padded batches) in the warp-specialized kernel,
# per head dim, over the same length range as its unmasked cubins; below it, at other head
# dims and for full masks, the TMA and pointer kernels as before. From experiments/gluon_mask.py on
# the H200 (docs/measurements/prefill/gluon-v8-mask.json, perf-notes prefill v8): at d128 1.09-1.14x
# the TMA key-vector kernel (bool) and 1.03-1.10x (additive) at N 2048-16384. One query tile per
# CTA (gluon_ws_entries): under a mask two measured no faster. Every masked cubin checks whether
# the keys a tile sees show one visible run (right padding, none, or left padding without causal)
# and then runs unmasked over it (MASK_PREFIX, perf-notes prefill v10,
# docs/measurements/prefill/gluon-v10-range.json, N 2048-16384, TFLOP/s over the whole S): against
# the TMA key-vector kernel, unpadded 1.21-1.42x at d64 and 1.38-1.55x at d128, right or left
# padded 1.33-1.48x / 1.48-1.66x; a mask with holes (the masked loop) 0.80-0.94x at d64 (the one
# regression, stated in the README) and 1.01-1.15x at d128. d64 takes non-causal calls only
# (GLUON_WS_MASKED_CAUSAL: its causal masked speed was not measured).
GLUON_WS_MASKS = {128: ("bool", "add"), 64: ("bool", "add")}
GLUON_WS_MASKED_CAUSAL = (128,)  # head dims whose masked cubins also take causal calls
# The masked cubins' lower bound where it lies above the unmasked ones' (GLUON_WS_LENGTHS): d64's
# masked kernel was measured from 2048 keys only (perf-notes prefill v10); its unmasked calls run the
# persistent grid from 512 (prefill v14).
GLUON_WS_MASKED_FROM = {64: 2048}
GLUON_LENGTHS: dict = {}
# Split-KV decode: memory-bound, so fp32 always uses IEEE dots (TF32 would gain nothing); head
# dims 64 and 128 (exact and masked) and 256 (masked). Shapes outside it use the "fwd" kernel.
DECODE_DTYPES = ("fp16", "bf16", "fp32")
DECODE_HEAD_DIMS = ((64, True), (128, True), (256, False))
DECODE_BLOCK_M = 16         # packed rows (query heads of a GQA group x query positions) per CTA
# The decode tile for grids of more CTAs than SMs (sm_90, fp16/bf16, exact head dims 64/128): a
# variant of it per decode variant, with tile_min_len = DECODE_WIDE_WAVES (for the decode kind
# tile_min_len counts the grid's CTAs per SM, rounded up; cpp/cuda_launch.cc plan_decode). One
# pipeline stage fewer (70 KB of shared memory, not 102): experiments/tune_decode.py --fused --nonpad on
# the H200 (docs/perf-notes.md, decode v6) measured it 0.5-11 % faster wherever the grid had more
# CTAs than SMs (B32 4k-128k, B24 8k, B16 at 2 splits, B8 at 4, B4 at 8) and 1-3 % slower at one
# CTA per SM (B1 32k, B8 4k, B4 8k at the launcher's splits). Same BLOCK_M and BLOCK_N as the
# base tile, which plans the splits.
DECODE_WIDE_WAVES = 2
DECODE_WIDE_MIN_ARCH = 90
MAX_DECODE_ROWS = 64        # group * Sq up to this takes the decode kernel (cpp/cuda_launch.cc)
# GroupQueryAttention's prepare kernels (aot/gqa_prepare.py): one cubin per (kind, dtype), its
# BLOCK_D the largest head size the CUDA op takes (cpp/gqa_shapes.cc), rows masked past D. Tiles:
# heads of one token per CTA (gqa_prepare), cache rows per CTA (gqa_past); memory-bound, untuned.
GQA_KINDS = ("gqa_prepare", "gqa_past")
GQA_DTYPES = ("fp16", "bf16", "fp32")
GQA_HEAD_DIM = 256
GQA_TILES = {"gqa_prepare": (4, 0, 4, 1), "gqa_past": (8, 0, 4, 1)}
# Key-vector mask variants (MASK_KEYS) of the forward kinds.
MASK_KEYS_DTYPES = ("fp16", "bf16")
MASK_KEYS_HEAD_DIMS = (64, 128)
# The unmasked TMA kernels' tiles per (head dim, causal, sequence length): (causal, min length,
# tile); an entry serves calls with that causal flag (-1: either) and min(Sq, Skv) from its min
# length up to the next matching entry's (the length is the shorter side, so a short chunk
# against a long cache keeps the small-BLOCK_M tile and its larger grid).
# experiments/tune.py --tma over the op grid on the H200 (fp16, Triton 3.6, 2026-12-01,
# docs/measurements/prefill/tune-tma-grid.json; docs/perf-notes.md, v5). d128 non-causal at
# 2048-4096, where the sweep favoured the (128, 128) tile by 2-4 %, measured +0-1 % for fp16 and
# -4 to -7 % for bf16 in ONNX Runtime against the one-tile build's run two days before: to
# re-check in one A/B run.
# Each entry is one more cubin per dtype; the C++ dispatcher reads the ranges from the generated
# table (KernelEntry::tile_causal, tile_min_len), so they are stated here only. The extras
# variants (windows, softcap, nonpad_kv_seqlen) keep one
# tile, the short non-causal one: d128's (128, 128) tile spills with them (255 registers, 24 B of
# stack).
TMA_TILES = {
    64: ((0, 0, (128, 64, 8, 3)), (1, 0, (64, 64, 4, 2)), (-1, 8192, (64, 128, 4, 2))),
    128: ((-1, 0, (64, 64, 4, 3)), (0, 2048, (128, 128, 8, 3)), (1, 8192, (128, 128, 8, 3))),
}


@dataclass(frozen=True)
class Variant:
    dtype: str
    head_dim: int          # BLOCK_D == BLOCK_DV bucket (power of two)
    even_d: bool           # D == Dv == head_dim: no head-dim masking, 16-aligned strides
    mask: str              # key of MASK_KINDS
    extras: bool           # windows, softcap, nonpad_kv_seqlen
    precision: str         # dot precision; "tf32" (ignored by Triton) for fp16/bf16
    kind: str = "fwd"      # key of KIND_CODES
    mask_keys: bool = False  # the mask is one key vector per (batch, head): query stride 0
    # Which calls this cubin's tile is for (TMA_TILES): causal flag (-1: any), least min(Sq, Skv);
    # for the decode kind the least CTAs per SM of the grid (DECODE_WIDE_WAVES).
    # Left out of repr (the build cache key adds them when set), so other cubins stay cached.
    tile_causal: int = field(default=-1, repr=False)
    tile_min_len: int = field(default=0, repr=False)
    tile_max_len: int = field(default=0, repr=False)  # fwd_gluon: min(Sq, Skv) below it (0: any)
    ws: bool = field(default=False, repr=False)  # fwd_gluon: the warp-specialized kernel

    @property
    def min_arch(self) -> int:
        if self.kind == "decode" and self.tile_min_len:
            return DECODE_WIDE_MIN_ARCH
        if self.kind == "fwd_gluon":
            return GLUON_MIN_ARCH
        return TMA_MIN_ARCH if self.kind == "fwd_tma" else 0

    @property
    def name(self) -> str:
        if self.kind in GQA_KINDS:
            return f"{self.kind}_{self.dtype}"
        if self.kind == "combine":
            return f"flash_combine_{self.dtype}_d{self.head_dim}"
        prec = f"_{self.precision}" if self.dtype == "fp32" and self.kind == "fwd" else ""
        tile = ("" if self.tile_causal < 0 else ("_c" if self.tile_causal else "_nc")) + (
            (f"_w{self.tile_min_len}" if self.kind == "decode" else f"_k{self.tile_min_len}")
            if self.tile_min_len else "") + (f"_lt{self.tile_max_len}" if self.tile_max_len else "")
        kind = self.kind + ("_ws" if self.ws else "")
        return (f"flash_{kind}_{self.dtype}{prec}_d{self.head_dim}{'' if self.even_d else 'm'}"
                f"_{self.mask}{'k' if self.mask_keys else ''}{tile}{'_x' if self.extras else ''}")


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # The warp-specialized Gluon kernel's knobs (0: the other kernels). Out of repr, so the other
    # cubins' cache keys stay; build.cache_key adds them where set.
    consumers: int = field(default=0, repr=False)      # consumer warpgroups (block_m / consumers rows each)
    maxnreg: int = field(default=0, repr=False)        # registers per thread outside the partitions
    consumer_regs: int = field(default=0, repr=False)  # registers per thread of a consumer partition
    pingpong: bool = field(default=False, repr=False)  # the consumers take turns issuing their GEMMs
    tiles: int = field(default=1, repr=False)          # query tiles a CTA runs in turn (block_m: all of them)
    overlap: bool = field(default=False, repr=False)   # a consumer's softmax also runs under its own P V
    persistent: int = field(default=0, repr=False)     # CTAs per SM of a persistent grid (0: a CTA per tile)
    dynamic: bool = field(default=False, repr=False)   # its CTAs claim tiles through a counter
    skip: bool = field(default=False, repr=False)      # consumers without rows in a tile skip its GEMMs

    @property
    def desc_rows(self) -> tuple[int, int]:
        """Box rows of (the Q and Y, the K and V) TMA descriptors."""
        return self.block_m // self.tiles // max(self.consumers, 1), self.block_n


def get_fwd_config(arch: int, v: Variant) -> TileConfig:
    """Tile table per (arch, kind, dtype, head dim), and for the unmasked TMA kernels per causal
    flag and sequence length (TMA_TILES)."""
    if v.kind in GQA_KINDS:
        return TileConfig(*GQA_TILES[v.kind])
    if v.kind == "combine":
        return TileConfig(1, 16, 4 if v.head_dim >= 128 else 2, 1)  # block_n: splits per step
    if v.kind == "decode":
        # Streams K/V: a small row tile, deep enough pipelining to keep loads in flight. On sm_90
        # 4 stages (102 KB of shared memory), best at the one CTA per SM per wave the launcher's
        # split count plans for: experiments/tune_decode.py on the H200, docs/perf-notes.md (decode v3).
        if v.dtype == "fp32" or v.head_dim >= 256:
            return TileConfig(DECODE_BLOCK_M, 32, 4, 2)
        if v.tile_min_len >= DECODE_WIDE_WAVES:
            return TileConfig(DECODE_BLOCK_M, 64, 4, 3)
        return TileConfig(DECODE_BLOCK_M, 64, 4, 4 if arch >= 90 else 3)
    if v.kind == "fwd_gluon":
        if v.ws:
            tiles = [t for lo, _, t in gluon_ws_entries(v.dtype, v.head_dim, v.tile_causal == 1, v.mask)
                     if lo == v.tile_min_len]
            return gluon_ws_tile(v.dtype, v.head_dim, v.tile_causal == 1, tiles[0] if tiles else 1, v.mask)
        return gluon_tile(v.dtype, v.head_dim, v.tile_causal == 1)
    if v.dtype == "fp32":
        # IEEE dots run on the CUDA cores, each thread's share of the tile unrolled into FMAs: at 4
        # warps they spilled 1-13 KB a thread (d64-d256), compiled 2-3x slower and ran 1.03-6.6x
        # slower than at 8 on the H200 (docs/build-time.md, "Spilling tiles"). Head dim 32 (no
        # spills; 8 warps ran 4-13 % slower) and TF32 dots (tensor cores) keep 4.
        warps = 8 if v.precision == "ieee" and v.head_dim >= 64 else 4
        if v.head_dim >= 256:
            return TileConfig(32, 32, warps, 1)
        return TileConfig(64, 32, warps, 2 if v.head_dim <= 64 else 1)
    if v.head_dim >= 256:
        return TileConfig(64, 32, 4, 1 if arch < 90 else 2)
    if v.kind == "fwd_tma":  # tuned by experiments/tune.py --tma / --masked on the H200 (docs/perf-notes.md)
        if v.mask == "none":
            if v.extras:
                return tma_tile(v.head_dim, False, 0)
            for causal, min_len, tile in TMA_TILES[v.head_dim]:
                if (causal, min_len) == (v.tile_causal, v.tile_min_len):
                    return TileConfig(*tile)
            raise ValueError(f"{v.name}: no TMA_TILES entry for causal={v.tile_causal}, "
                             f"min length {v.tile_min_len}")
        return TileConfig(64, 64, 4, 2) if v.head_dim <= 64 else TileConfig(64, 64, 4, 3)
    if spilling_full_mask(v):
        return TileConfig(128, 64, 8, 3)
    if arch >= 90:  # tuned by experiments/tune.py on the H200 (docs/perf-notes.md, 2026-11-29)
        if v.head_dim <= 64:
            return TileConfig(128, 64, 4, 3)
        return TileConfig(128, 64, 8, 3)
    if v.head_dim <= 64:
        return TileConfig(128, 64, 4, 3)
    return TileConfig(128, 32, 8, 2)


def spilling_full_mask(v: Variant) -> bool:
    """A rare-class (superset) forward variant with a full mask tile: at head dims 32 and 64 its
    128-row tile on 4 warps spilled 2-6 KB a thread (the mask tile, the extras and two interior
    loops in registers) and was the slowest compile of the build; on 8 warps it spills a fifth of
    that and compiles 2-3x faster (docs/build-time.md, "Spilling tiles")."""
    return (v.kind == "fwd" and v.dtype != "fp32" and v.head_dim <= 64 and v.mask != "none"
            and not v.mask_keys and not is_hot(v.kind, v.dtype, v.head_dim, v.even_d))


def tma_tile(head_dim: int, causal: bool, length: int, extras: bool = False) -> TileConfig:
    """The tile an unmasked TMA call runs at: the TMA_TILES entry for its causal flag with the
    largest min length <= `length` = min(Sq, Skv) (what cpp/cuda_launch.cc's pick_tile does over
    the generated table); with extras the one tile those variants have."""
    if extras:
        causal, length = False, 0
    entries = [(k, t) for c, k, t in TMA_TILES[head_dim] if c in (-1, int(causal)) and k <= length]
    return TileConfig(*max(entries)[1])


def gluon_module(ws: bool = False):
    """A Gluon kernel's module (GLUON_MODULE, or GLUON_WS_MODULE), imported on first use: it needs
    triton.experimental.gluon, and the table without Gluon variants never imports it."""
    import importlib
    return importlib.import_module(GLUON_WS_MODULE if ws else GLUON_MODULE)


def gluon_tile(dtype: str, head_dim: int, causal: bool) -> TileConfig:
    """The one-partition Gluon kernel's tile for a call, from its module's get_gluon_config
    (BLOCK_M, BLOCK_N, NUM_STAGES and num_warps: the default partition's warps)."""
    c = gluon_module().get_gluon_config(dtype, head_dim, causal)
    return TileConfig(c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["NUM_STAGES"])


def gluon_ws_tile(dtype: str, head_dim: int, causal: bool, tiles: int = 1, mask: str = "none") -> TileConfig:
    """The warp-specialized kernel's tile for a call, from its module's get_ws_config; `tiles`
    query tiles per CTA (block_m counts all of them: the launcher's grid is cdiv(Sq, block_m))."""
    c = gluon_module(ws=True).get_ws_config(dtype, head_dim, causal, mask)
    persistent = c.get("PERSISTENT", 0) if GLUON_WS_PERSISTENT else 0
    dynamic = bool(GLUON_WS_DYNAMIC and causal and mask == "none")
    return TileConfig(c["BLOCK_M"] * tiles, c["BLOCK_N"], c["num_warps"], c["NUM_STAGES"], c["NUM_CONSUMERS"],
                      c["maxnreg"], c["CONSUMER_REGS"], c["PINGPONG"], tiles, c.get("OVERLAP_PV", False),
                      1 if dynamic else persistent, dynamic, GLUON_WS_SKIP and mask == "none")


def gluon_ws_entries(dtype: str, head_dim: int, causal: bool, mask: str = "none") -> list[tuple[int, int, int]]:
    """The warp-specialized kernel's cubins for a call class: (lo, hi, tiles per CTA), GLUON_WS_LENGTHS'
    range split where GLUON_WS_TILES changes the tiles per CTA (unmasked calls: under a key-vector
    mask one tile per CTA measured as fast or faster, docs/measurements/prefill/gluon-v8-mask.json)."""
    rng = GLUON_WS_LENGTHS.get((dtype, head_dim, bool(causal)))
    if rng is None or (mask != "none" and causal and head_dim not in GLUON_WS_MASKED_CAUSAL):
        return []
    lo, hi = rng
    if mask != "none":
        lo = max(lo, GLUON_WS_MASKED_FROM.get(head_dim, 0))
    steps = sorted((GLUON_WS_TILES.get((head_dim, bool(causal)), {0: 1}) if mask == "none" else {0: 1}).items())
    cuts = [lo] + [k for k, _ in steps if lo < k and (hi == 0 or k < hi)]
    # Each cubin's tiles: those of the last step at or below its lower bound (1 before any step).
    return [(a, b, max(((k, t) for k, t in steps if k <= a), default=(0, 1))[1])
            for a, b in zip(cuts, cuts[1:] + [hi])]


def gluon_lengths(dtype: str, head_dim: int, causal: bool, ws: bool = False) -> tuple[int, int] | None:
    """The min(Sq, Skv) range [lo, hi) (hi 0: unbounded) where a Gluon kernel takes a call; None
    where it takes none."""
    ws_range = GLUON_WS_LENGTHS.get((dtype, head_dim, bool(causal)))
    if ws:
        return ws_range
    lo, hi = GLUON_LENGTHS.get((dtype, head_dim, bool(causal)), (0, 0))
    if ws_range is not None:
        if ws_range[0] <= lo:
            return None
        hi = min(hi, ws_range[0]) if hi else ws_range[0]
    return (lo, hi) if hi == 0 or hi > lo else None


def gluon_variants() -> list[Variant]:
    """Per (dtype, head dim) and kernel: cubins for causal and non-causal calls together where
    they share tiles and ranges, else one set per causal flag (tile_causal 0 / 1)."""
    out = []
    for dtype, hd, ws in itertools.product(GLUON_DTYPES, GLUON_HEAD_DIMS, (False, True)):
        # The warp-specialized kernel also takes key-vector masks (GLUON_WS_MASKS) over its range.
        for mask in ("none",) + (GLUON_WS_MASKS.get(hd, ()) if ws else ()):
            per = {}
            for c in (0, 1):
                if ws:
                    entries = [(lo, hi, gluon_ws_tile(dtype, hd, bool(c), t, mask))
                               for lo, hi, t in gluon_ws_entries(dtype, hd, bool(c), mask)]
                else:
                    r = gluon_lengths(dtype, hd, bool(c))
                    entries = [] if r is None else [(r[0], r[1], gluon_tile(dtype, hd, bool(c)))]
                if entries:
                    per[c] = entries
            shared = len(per) == 2 and per[0] == per[1]
            for causal in ((-1,) if shared else sorted(per)):
                for lo, hi, _ in per[max(causal, 0)]:
                    out.append(Variant(dtype, hd, True, mask, False, "tf32", "fwd_gluon", mask != "none",
                                       tile_causal=causal, tile_min_len=lo, tile_max_len=hi, ws=ws))
    return out


# Shape classes compiled as one superset variant instead of one per combination, so that a cold
# build takes minutes (docs/build-time.md: what each class costs to compile, and which ones the
# model families, the rewriter's coverage and the benchmarks run). The extras variant serves the
# class's calls without extras too (no window, softcap 0, no key lengths: the same scores), the
# masked-head-dim variant its calls at the exact head dim (all of D in bounds); the C++ dispatcher
# takes them where the exact variant is missing (cpp/cuda_launch.cc find_superset). The hot shapes
# (fp16/bf16 at exact head dims 64 and 128: every model family, every benchmark), every TMA
# variant and the combine kernels keep a variant per combination, their code unchanged.
def is_hot(kind: str, dtype: str, head_dim: int, even_d: bool) -> bool:
    return kind in ("fwd_tma", "fwd_gluon", "combine") or (
        dtype != "fp32" and head_dim in (64, 128) and even_d)


def superset_only(kind: str, dtype: str, head_dim: int, even_d: bool) -> tuple[bool, bool]:
    """(only the extras variant, only the masked-head-dim variant) for a shape class: fp32 (the
    slowest to compile: dots on CUDA cores, or TF32) prefill also as masked head dims only; fp16
    and bf16 at head dims 32 and 256 and the inexact ones (D = 80, 96, ...) extras only."""
    if is_hot(kind, dtype, head_dim, even_d):
        return False, False
    return True, dtype == "fp32" and kind == "fwd"


def kept_exact(v: Variant) -> bool:
    """Rare-class prefill variants compiled as before the merge all the same: fp16/bf16 without
    extras, unmasked at every head dim and masked at head dim 256 (Gemma). Their superset
    measured 1.05-1.83x their time on the H200 (experiments/merged_variants.py:
    docs/measurements/build/merged-variants-gpu.json, -after.json), against 0.93-1.03x for the
    other merged calls (fp32, decode, masks at head dims 32-128)."""
    return (v.kind == "fwd" and v.dtype != "fp32" and not v.extras and not v.mask_keys
            and (v.mask == "none" or (v.head_dim == 256 and v.even_d)))


def edge_loop(v: Variant) -> bool:
    """Whether v compiles its two boundary key ranges through one loop (the kernels' EDGE_LOOP):
    every shape class but the hot ones, for about half their compile time (the interior loop, and
    so the speed, as before; the same scores summed in another order)."""
    return (v.kind in ("fwd", "decode") and not is_hot(v.kind, v.dtype, v.head_dim, v.even_d)
            and not kept_exact(v))


def _merged(v: Variant) -> bool:
    """Whether a superset variant serves v's calls (so v is not compiled)."""
    if kept_exact(v) or v.kind in GQA_KINDS:
        return False
    only_extras, only_masked = superset_only(v.kind, v.dtype, v.head_dim, v.even_d)
    return (only_extras and not v.extras) or (only_masked and v.even_d)


def all_variants() -> list[Variant]:
    return [v for v in all_combinations() if not _merged(v)]


def all_combinations() -> list[Variant]:
    out = []
    for (dtype, prec), (hd, has_even), mask, extras in itertools.product(
            DTYPE_PRECISIONS, HEAD_DIMS, MASK_KINDS, (False, True)):
        for even in ((True, False) if has_even else (False,)):
            out.append(Variant(dtype, hd, even, mask, extras, prec))
    for dtype, (hd, has_even), mask, extras in itertools.product(
            DECODE_DTYPES, DECODE_HEAD_DIMS, MASK_KINDS, (False, True)):
        for even in ((True, False) if has_even else (False,)):
            out.append(Variant(dtype, hd, even, mask, extras, "ieee" if dtype == "fp32" else "tf32",
                               "decode"))
            if dtype != "fp32" and even:
                out.append(Variant(dtype, hd, even, mask, extras, "tf32", "decode",
                                   tile_min_len=DECODE_WIDE_WAVES))
    # Key-vector masks (a (B, 1, 1, S) padding mask, what the rewriter emits for BERT-style
    # models): one row of BLOCK_N mask values per key block instead of a BLOCK_M x BLOCK_N tile,
    # so they stay off the register-spilling full-mask path. fp16/bf16, head-dim buckets 64, 128.
    for dtype, hd, even, mask, extras in itertools.product(
            MASK_KEYS_DTYPES, MASK_KEYS_HEAD_DIMS, (True, False), ("bool", "add"), (False, True)):
        out.append(Variant(dtype, hd, even, mask, extras, "tf32", "fwd", True))
    # Full masks stay on the pointer kernels: with a mask tile both kinds spill registers, and the
    # TMA cubins measured 0.38-0.84x the pointer ones on the H200 (tools/ab_tma.py, perf-notes v3).
    for dtype, hd, extras in itertools.product(TMA_DTYPES, TMA_HEAD_DIMS, (False, True)):
        for causal, min_len, _ in (((-1, 0, None),) if extras else TMA_TILES[hd]):
            out.append(Variant(dtype, hd, True, "none", extras, "tf32", "fwd_tma",
                               tile_causal=causal, tile_min_len=min_len))
        for mask in ("bool", "add"):
            out.append(Variant(dtype, hd, True, mask, extras, "tf32", "fwd_tma", True))
    for dtype, (hd, _) in itertools.product(DECODE_DTYPES, DECODE_HEAD_DIMS):
        out.append(Variant(dtype, hd, False, "none", False, "ieee" if dtype == "fp32" else "tf32",
                           "combine"))
    if GLUON_ENABLED:
        out += gluon_variants()
    return out + gqa_variants()


def gqa_variants() -> list[Variant]:
    """GroupQueryAttention's prepare kernels (no mask, extras or precision: those fields keep
    their defaults)."""
    return [Variant(dtype, GQA_HEAD_DIM, False, "none", False, "ieee" if dtype == "fp32" else "tf32", kind)
            for kind in GQA_KINDS for dtype in GQA_DTYPES]
