"""The variant table: which specializations of the kernels get compiled, and their tiles.

The kernel kinds (KIND_CODES): "fwd" (aot/flash_fwd.py, every shape), "fwd_tma" (the same kernel
with Q/K/V/Y as TMA tensor descriptors: sm_90+, fp16/bf16, exact head dims 64 and 128, no mask or a
key-vector mask), "fwd_gluon" (the Gluon Hopper kernels, aot/flash_fwd_gluon.py and the
warp-specialized aot/gluon_ws/, with the same arguments and descriptors: sm_90, the calls GLUON_*
below allow), "decode" (aot/flash_decode.py's split-KV kernel, few query rows against a long cache)
and "combine" (its merge step); and outside attention "gqa_prepare", "gqa_past", "gqa_compact" and
"gqa_shift" (aot/gqa_prepare.py: GroupQueryAttention's rotary, KV-cache writes and lengths before
its attention, a windowed cache's compaction after it, and the in-place move of a full windowed
cache's kept rows before a decode step; one per dtype). The opt-in FP8 prefill path (sm_90, fp16/bf16 in and out, head dims 64
and 128) adds "fp8_stats" and "fp8_quantize" (aot/fp8_prepare.py: the e4m3 operands and their
scales) and "fwd_fp8" (aot/flash_fwd_fp8.py: the attention on e4m3 tensor cores). "sink_rescale"
(aot/sink_rescale.py) applies GroupQueryAttention's attention sinks to the attention's output from
its log-sum-exp. Forward variants with `mask_keys` read a mask whose query stride is 0
(a (B, 1, 1, S) padding mask) as one key vector per (batch, head) instead of a BLOCK_M x BLOCK_N
tile (the full-mask kernels spill registers).

This file is the single source of the kernel family's shape. aot/build.py compiles the product
below for each target arch and generates the C++ table (`kernel_table.gen.cc`) that the runtime
dispatcher (cpp/kernel_select.cc) searches by `VariantKey`; tiles (aot/tiles.py) and length ranges
reach C++ through that table, so the launcher never restates them. The codes shared with C++ are
aot/contract.py's.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from .contract import DTYPE_CODES, KIND_CODES, MASK_KINDS, PRECISION_CODES  # noqa: F401 (the table's codes)
from .tiles import GLUON_WS_CANDIDATES, GLUON_WS_GRIDS  # noqa: F401 (the table's grids, named here too)
from .tiles import TMA_TILES, TileConfig, WsGrid, gluon_config, gqa_tile, ws_config  # noqa: F401 (TileConfig: the table's type)

TRITON_VERSION = "3.6.0"

# (dtype, dot precision). fp32 defaults to exact IEEE dots; TF32 is an explicit opt-in.
DTYPE_PRECISIONS = (("fp16", "tf32"), ("bf16", "tf32"), ("fp32", "ieee"), ("fp32", "tf32"))
# Head-dim buckets (BLOCK_D == BLOCK_DV) and whether an exact-size ("even") variant exists.
HEAD_DIMS = ((32, False), (64, True), (128, True), (256, True))
# TMA descriptors (Hopper's bulk-copy engine): compiled for these archs and shapes only.
TMA_MIN_ARCH = 90
TMA_DTYPES = ("fp16", "bf16")
TMA_HEAD_DIMS = (64, 128)
# The Gluon forward kernels (FA3's Hopper design): sm_90 only, fp16/bf16, D == Dv in
# GLUON_HEAD_DIMS with 16-aligned strides, no mask (the warp-specialized one: a key-vector mask
# too), no extras; causal or not, any GQA group and offset. Every other call keeps the kinds
# above. GLUON_ENABLED False builds no such cubin (the dispatch is then exactly the one without
# it). GLUON_MODULE / GLUON_WS_MODULE: the modules build.py compiles them from (tests point the
# first at a stand-in).
GLUON_ENABLED = True
GLUON_MODULE = f"{__package__}.flash_fwd_gluon"
GLUON_WS_MODULE = f"{__package__}.flash_fwd_gluon_ws"
GLUON_MIN_ARCH = 90
GLUON_DTYPES = ("fp16", "bf16")
GLUON_HEAD_DIMS = (64, 128)
# Where the Gluon kernels take a call: min(Sq, Skv) in [lo, hi) (hi 0: unbounded), per (dtype,
# head dim, causal). GLUON_WS_LENGTHS: the warp-specialized kernel (a TMA producer warp and two or
# three consumer warpgroups), listed only where it takes calls (from GLUON_WS_GRIDS); GLUON_LENGTHS:
# the one-partition kernel, (0, 0) where not listed, cut below the warp-specialized kernel's lower
# bound (none where that is 0); elsewhere the TMA_TILES kernels run. Each cubin carries its range
# as tile_min_len / tile_max_len, which the C++ pick_tile reads from the generated table, so it is
# stated here only.
#
# The warp-specialized kernel's grids (GLUON_WS_GRIDS) and the candidate tables of a development
# build (GLUON_WS_CANDIDATES): aot/tiles.py.


def with_candidates(names: str | Iterable[str]) -> dict:
    """GLUON_WS_GRIDS with the entries of the named GLUON_WS_CANDIDATES in their place (a later
    name's over an earlier one's): the grids of a development build. `names`: names, or one
    comma-separated string of them (blanks ignored); none gives a copy of GLUON_WS_GRIDS. A name
    that is not a candidate is a ValueError that lists the candidates."""
    if isinstance(names, str):
        names = names.replace(" ", "").split(",")
    grids = dict(GLUON_WS_GRIDS)
    for name in filter(None, names):
        if name not in GLUON_WS_CANDIDATES:
            raise ValueError(f"unknown candidate {name!r} ({', '.join(GLUON_WS_CANDIDATES)})")
        grids.update(GLUON_WS_CANDIDATES[name])
    return grids


def ws_lengths(grids: dict) -> dict:
    """GLUON_WS_LENGTHS for a GLUON_WS_GRIDS (with_candidates' grids, tests' own): per (dtype, head
    dim, causal) the warp-specialized kernel's range, from its grids' first length on."""
    return {(dt, hd, c): (min(steps), 0) for dt in GLUON_DTYPES for (hd, c), steps in grids.items()
            if hd != "one"}


GLUON_WS_LENGTHS = ws_lengths(GLUON_WS_GRIDS)


def ws_tables(grids: dict | None = None) -> tuple[dict, dict]:
    """(grids, lengths) of the warp-specialized kernel that a table is built from: GLUON_WS_GRIDS
    and GLUON_WS_LENGTHS for None, else `grids` (with_candidates') and its ws_lengths."""
    return (GLUON_WS_GRIDS, GLUON_WS_LENGTHS) if grids is None else (grids, ws_lengths(grids))


# Key-vector masks (a (B, 1, 1, S) padding mask: padded batches) in the warp-specialized kernel,
# per head dim, over the same length range as its unmasked cubins; below it, at other head dims
# and for full masks, the TMA and pointer kernels take them. One query tile per CTA
# (gluon_ws_entries: under a mask two are no faster). Every masked cubin checks whether the keys a
# tile sees show one visible run (right padding, none, or left padding without causal) and then
# runs unmasked over it (MASK_PREFIX, aot/gluon_ws/mask_prefix.py). perf-notes prefill v8, v10
# (which also states the one regression, a mask with holes at d64, as does the README).
GLUON_WS_MASKS = {128: ("bool", "add"), 64: ("bool", "add")}
# Head dims whose masked cubins also take causal calls, each from which min(Sq, Skv) (a masked call
# has no one-partition Gluon kernel: below that length the TMA kernel takes it; GroupQueryAttention's
# first prompt is always such a call). d128 from 0: the warp-specialized cubin is at least even with
# the TMA one from 128 keys; d64 from 2048: below it the TMA kernel is faster (GroupQueryAttention
# prefill on an H100, 16k tokens: 0.70x the time at 128 keys, 0.91x at 512, 1.23x at 2048;
# perf-notes "GroupQueryAttention prefill against the plain op").
GLUON_WS_MASKED_CAUSAL = {128: 0, 64: 2048}
# The masked cubins' lower bound where it lies above the unmasked ones' (GLUON_WS_LENGTHS): d64's
# masked kernel was measured from 2048 keys only (perf-notes prefill v10).
GLUON_WS_MASKED_FROM = {64: 2048}
GLUON_LENGTHS: dict = {}
# Split-KV decode: memory-bound, so fp32 always uses IEEE dots (TF32 would gain nothing); head
# dims 64 and 128 (exact and masked) and 256 (masked). Shapes outside it use the "fwd" kernel.
DECODE_DTYPES = ("fp16", "bf16", "fp32")
DECODE_HEAD_DIMS = ((64, True), (128, True), (256, False))
DECODE_BLOCK_M = 16         # packed rows (query heads of a GQA group x query positions) per CTA
# The decode tile for grids of more CTAs than SMs (sm_90, fp16/bf16, exact head dims 64/128): a
# variant of it per decode variant, with tile_min_len = DECODE_WIDE_WAVES (for the decode kind
# tile_min_len counts the grid's CTAs per SM, rounded up; the C++ plan_decode picks it). One
# pipeline stage fewer (70 KB of shared memory, not 102), faster wherever the grid has more CTAs
# than SMs and slower at one CTA per SM (perf-notes decode v6). Same BLOCK_M and BLOCK_N as the
# base tile, which plans the splits.
DECODE_WIDE_WAVES = 2
DECODE_WIDE_MIN_ARCH = 90
# GroupQueryAttention's prepare kernels (aot/gqa_prepare.py): one cubin per (kind, dtype, BLOCK_D),
# BLOCK_D 64, 128 and the largest head size the CUDA op takes (cpp/gqa_shapes.cc); the launcher
# takes the smallest that holds the call's head size, columns masked past D.
GQA_KINDS = ("gqa_prepare", "gqa_past", "gqa_compact", "gqa_shift")
GQA_DTYPES = ("fp16", "bf16", "fp32")
GQA_HEAD_DIMS = (64, 128, 256)
# The FP8 prefill path's kernels (aot/fp8_prepare.py, aot/flash_fwd_fp8.py): sm_90 (e4m3 wgmma),
# fp16/bf16 inputs and output, exact head dims 64 and 128; the attention one cubin per causal flag.
# All three kinds of a (dtype, head dim) share BLOCK_M and BLOCK_N (the FP8 buffers' padding and
# blocks of scales), (BLOCK_M, BLOCK_N, num_warps, num_stages) per head dim; the attention's
# measured by lab/experiments/fp8_kernel_bench.py.
FP8_KINDS = ("fp8_stats", "fp8_quantize", "fwd_fp8")
FP8_MIN_ARCH = 90
FP8_DTYPES = ("fp16", "bf16")
FP8_HEAD_DIMS = (64, 128)
FP8_TILES = {64: (128, 128, 8, 3), 128: (128, 128, 8, 3)}
# (num_warps, num_stages) of the two prepare kernels.
FP8_PREPARE_WARPS = {"fp8_stats": (4, 2), "fp8_quantize": (8, 2)}
# GroupQueryAttention's attention sinks (aot/sink_rescale.py): one cubin per (dtype, BLOCK_D), every
# arch; the launcher takes the smallest BLOCK_D that holds the head size, as for GQA_KINDS. A
# program rescales SINK_ELEMENTS // BLOCK_D query rows of one head.
SINK_KINDS = ("sink_rescale",)
SINK_DTYPES = ("fp16", "bf16", "fp32")
SINK_HEAD_DIMS = (64, 128, 256)
SINK_ELEMENTS = 2048
# Key-vector mask variants (MASK_KEYS) of the forward kinds.
MASK_KEYS_DTYPES = ("fp16", "bf16")
MASK_KEYS_HEAD_DIMS = (64, 128)
# The unmasked TMA kernels have a cubin per TMA_TILES entry (aot/tiles.py) and dtype; the extras
# variants (windows, softcap, nonpad_kv_seqlen) keep one tile, the short non-causal one: d128's
# (128, 128) tile spills with them.


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
        if self.kind in FP8_KINDS:
            return FP8_MIN_ARCH
        return TMA_MIN_ARCH if self.kind == "fwd_tma" else 0

    @property
    def name(self) -> str:
        if self.kind in GQA_KINDS or self.kind in FP8_KINDS or self.kind in SINK_KINDS:
            causal = "" if self.tile_causal < 0 else ("_c" if self.tile_causal else "_nc")
            return f"{'flash_' if self.kind == 'fwd_fp8' else ''}{self.kind}_{self.dtype}_d{self.head_dim}{causal}"
        if self.kind == "combine":
            return f"flash_combine_{self.dtype}_d{self.head_dim}"
        prec = f"_{self.precision}" if self.dtype == "fp32" and self.kind == "fwd" else ""
        tile = ("" if self.tile_causal < 0 else ("_c" if self.tile_causal else "_nc")) + (
            (f"_w{self.tile_min_len}" if self.kind == "decode" else f"_k{self.tile_min_len}")
            if self.tile_min_len else "") + (f"_lt{self.tile_max_len}" if self.tile_max_len else "")
        kind = self.kind + ("_ws" if self.ws else "")
        return (f"flash_{kind}_{self.dtype}{prec}_d{self.head_dim}{'' if self.even_d else 'm'}"
                f"_{self.mask}{'k' if self.mask_keys else ''}{tile}{'_x' if self.extras else ''}")


def get_fwd_config(arch: int, v: Variant, grids: dict | None = None) -> TileConfig:
    """Tile table per (arch, kind, dtype, head dim), and for the unmasked TMA kernels per causal
    flag and sequence length (TMA_TILES); a warp-specialized variant's grid from `grids` (ws_tables:
    None, the shipped GLUON_WS_GRIDS)."""
    if v.kind in GQA_KINDS:
        return TileConfig(*gqa_tile(v.head_dim, v.kind))
    if v.kind in SINK_KINDS:  # block_m: query rows a program (block_n unused)
        return TileConfig(SINK_ELEMENTS // v.head_dim, 1, 4, 1)
    if v.kind in FP8_KINDS:
        block_m, block_n, warps, stages = FP8_TILES[v.head_dim]
        if v.kind != "fwd_fp8":
            warps, stages = FP8_PREPARE_WARPS[v.kind]
        return TileConfig(block_m, block_n, warps, stages)
    if v.kind == "combine":
        return TileConfig(1, 16, 4 if v.head_dim >= 128 else 2, 1)  # block_n: splits per step
    if v.kind == "decode":
        # Streams K/V: a small row tile, deep enough pipelining to keep loads in flight. On sm_90
        # 4 stages (102 KB of shared memory) for the one CTA per SM per wave the launcher's split
        # count plans for (lab/experiments/tune_decode.py, perf-notes decode v3).
        if v.dtype == "fp32" or v.head_dim >= 256:
            return TileConfig(DECODE_BLOCK_M, 32, 4, 2)
        if v.tile_min_len >= DECODE_WIDE_WAVES:
            return TileConfig(DECODE_BLOCK_M, 64, 4, 3)
        return TileConfig(DECODE_BLOCK_M, 64, 4, 4 if arch >= 90 else 3)
    if v.kind == "fwd_gluon":
        if v.ws:
            mine = [g for lo, _, g in gluon_ws_entries(v.dtype, v.head_dim, v.tile_causal == 1, v.mask, grids)
                    if lo == v.tile_min_len]
            return gluon_ws_tile(v.dtype, v.head_dim, v.tile_causal == 1, mine[0] if mine else WsGrid(), v.mask)
        return gluon_tile(v.dtype, v.head_dim, v.tile_causal == 1, v.tile_min_len, grids)
    if v.dtype == "fp32":
        # IEEE dots run on the CUDA cores, each thread's share of the tile unrolled into FMAs: at 4
        # warps they spilled from d64 on, so those take 8 (docs/build-time.md, "Spilling tiles").
        # Head dim 32 (no spills, faster on 4) and TF32 dots (tensor cores) keep 4.
        warps = 8 if v.precision == "ieee" and v.head_dim >= 64 else 4
        if v.head_dim >= 256:
            return TileConfig(32, 32, warps, 1)
        return TileConfig(64, 32, warps, 2 if v.head_dim <= 64 else 1)
    if v.head_dim >= 256:
        return TileConfig(64, 32, 4, 1 if arch < 90 else 2)
    if v.kind == "fwd_tma":  # lab/experiments/tune.py --tma / --masked (perf-notes v5)
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
    if arch >= 90:  # lab/experiments/tune.py (perf-notes v2)
        if v.head_dim <= 64:
            return TileConfig(128, 64, 4, 3)
        return TileConfig(128, 64, 8, 3)
    if v.head_dim <= 64:
        return TileConfig(128, 64, 4, 3)
    return TileConfig(128, 32, 8, 2)


def spilling_full_mask(v: Variant) -> bool:
    """A rare-class (superset) forward variant with a full mask tile: at head dims 32 and 64 its
    128-row tile on 4 warps spills (the mask tile, the extras and two interior loops in registers)
    and was the slowest compile of the build; 8 warps spill far less and compile faster
    (docs/build-time.md, "Spilling tiles")."""
    return (v.kind == "fwd" and v.dtype != "fp32" and v.head_dim <= 64 and v.mask != "none"
            and not v.mask_keys and not is_hot(v.kind, v.dtype, v.head_dim, v.even_d))


def tma_tile(head_dim: int, causal: bool, length: int, extras: bool = False) -> TileConfig:
    """The tile an unmasked TMA call runs at: the TMA_TILES entry for its causal flag with the
    largest min length <= `length` = min(Sq, Skv) (what the C++ pick_tile does over the generated
    table); with extras the one tile those variants have."""
    if extras:
        causal, length = False, 0
    entries = [(k, t) for c, k, t in TMA_TILES[head_dim] if c in (-1, int(causal)) and k <= length]
    return TileConfig(*max(entries)[1])


def gluon_tile(dtype: str, head_dim: int, causal: bool, length: int = 0, grids: dict | None = None) -> TileConfig:
    """The one-partition Gluon kernel's tile for a call of min(Sq, Skv) = `length`: aot/tiles.py
    gluon_config's (BLOCK_M, BLOCK_N, NUM_STAGES and num_warps), or that of the last of `grids`'
    ("one", head dim) steps at or below `length` (a candidate's; GLUON_WS_GRIDS' for None)."""
    tile = max(((k, t) for k, t in one_partition_steps(head_dim, grids) if k <= length), key=lambda kt: kt[0])[1]
    if tile is not None:
        return tile
    c = gluon_config(dtype, head_dim, causal)
    return TileConfig(c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["NUM_STAGES"])


def one_partition_steps(head_dim: int, grids: dict | None = None) -> tuple:
    """The one-partition kernel's (min length, tile) steps at `head_dim` (a tile None: aot/tiles.py's)."""
    return (GLUON_WS_GRIDS if grids is None else grids).get(("one", head_dim), ((0, None),))


def gluon_ws_tile(dtype: str, head_dim: int, causal: bool, grid: WsGrid = WsGrid(), mask: str = "none") -> TileConfig:
    """The warp-specialized kernel's tile for a call (aot/tiles.py ws_config) on `grid`: block_m
    counts all of a CTA's query tiles (the launcher's per-tile grid is cdiv(Sq, block_m)), a
    persistent grid one CTA per SM."""
    c = ws_config(dtype, head_dim, causal, mask)
    return TileConfig(c["BLOCK_M"] * grid.tiles, c["BLOCK_N"], c["num_warps"], c["NUM_STAGES"], c["NUM_CONSUMERS"],
                      c["maxnreg"], c["CONSUMER_REGS"], c["PINGPONG"], grid.tiles, c.get("OVERLAP_PV", False),
                      1 if grid.persistent else 0, grid.dynamic, grid.skip)


def gluon_ws_entries(dtype: str, head_dim: int, causal: bool, mask: str = "none",
                     grids: dict | None = None) -> list[tuple[int, int, WsGrid]]:
    """The warp-specialized kernel's cubins for a call class: (lo, hi, grid), GLUON_WS_LENGTHS' range
    split where GLUON_WS_GRIDS changes the grid (both of `grids`, ws_tables; unmasked calls; under a
    key-vector mask a CTA per query tile, perf-notes prefill v8: masked cubins never skip rows, their
    consumers spill with it)."""
    grids, lengths = ws_tables(grids)
    rng = lengths.get((dtype, head_dim, bool(causal)))
    if rng is None or (mask != "none" and causal and head_dim not in GLUON_WS_MASKED_CAUSAL):
        return []
    lo, hi = rng
    if mask != "none":
        lo = GLUON_WS_MASKED_CAUSAL[head_dim] if causal else max(lo, GLUON_WS_MASKED_FROM.get(head_dim, 0))
    steps = sorted(grids[(head_dim, bool(causal))].items() if mask == "none" else [(0, WsGrid())])
    cuts = [lo] + [k for k, _ in steps if lo < k and (hi == 0 or k < hi)]
    # Each cubin's grid: that of the last step at or below its lower bound (the first step's below it).
    return [(a, b, max(((k, g) for k, g in steps if k <= a), default=steps[0], key=lambda kg: kg[0])[1])
            for a, b in zip(cuts, cuts[1:] + [hi])]


def gluon_lengths(dtype: str, head_dim: int, causal: bool, ws: bool = False,
                  grids: dict | None = None) -> tuple[int, int] | None:
    """The min(Sq, Skv) range [lo, hi) (hi 0: unbounded) where a Gluon kernel takes a call; None
    where it takes none (the warp-specialized kernel's from `grids`, ws_tables)."""
    ws_range = ws_tables(grids)[1].get((dtype, head_dim, bool(causal)))
    if ws:
        return ws_range
    lo, hi = GLUON_LENGTHS.get((dtype, head_dim, bool(causal)), (0, 0))
    if ws_range is not None:
        if ws_range[0] <= lo:
            return None
        hi = min(hi, ws_range[0]) if hi else ws_range[0]
    return (lo, hi) if hi == 0 or hi > lo else None


def gluon_variants(grids: dict | None = None) -> list[Variant]:
    """Per (dtype, head dim) and kernel: cubins for causal and non-causal calls together where
    they share tiles and ranges, else one set per causal flag (tile_causal 0 / 1); the
    warp-specialized kernel's on `grids` (ws_tables: None, the shipped GLUON_WS_GRIDS)."""
    out = []
    for dtype, hd, ws in itertools.product(GLUON_DTYPES, GLUON_HEAD_DIMS, (False, True)):
        # The warp-specialized kernel also takes key-vector masks (GLUON_WS_MASKS) over its range.
        for mask in ("none",) + (GLUON_WS_MASKS.get(hd, ()) if ws else ()):
            per = {}
            for c in (0, 1):
                if ws:
                    entries = [(lo, hi, gluon_ws_tile(dtype, hd, bool(c), g, mask))
                               for lo, hi, g in gluon_ws_entries(dtype, hd, bool(c), mask, grids)]
                else:  # its range, split where the tile steps change
                    r = gluon_lengths(dtype, hd, bool(c), grids=grids)
                    cuts = [] if r is None else [r[0]] + [k for k, _ in one_partition_steps(hd, grids)
                                                          if r[0] < k and (r[1] == 0 or k < r[1])]
                    entries = [(a, b, gluon_tile(dtype, hd, bool(c), a, grids))
                               for a, b in zip(cuts, cuts[1:] + [r[1] if r else 0])]
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
# variant and the combine kernels keep a variant per combination and two boundary loops (edge_loop).
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
    """Rare-class prefill variants compiled one per combination all the same, with no superset
    serving them: fp16/bf16 without extras, unmasked at every head dim and masked at head dim 256
    (Gemma): their superset ran clearly slower, the other merged calls about as fast
    (lab/experiments/merged_variants.py, docs/build-time.md)."""
    return (v.kind == "fwd" and v.dtype != "fp32" and not v.extras and not v.mask_keys
            and (v.mask == "none" or (v.head_dim == 256 and v.even_d)))


def edge_loop(v: Variant) -> bool:
    """Whether v compiles its two boundary key ranges through one loop (the kernels' EDGE_LOOP):
    every shape class but the hot ones, for about half their compile time (the interior loop, and
    so the speed, is the same with one boundary loop or two; the same scores summed in another order)."""
    return (v.kind in ("fwd", "decode") and not is_hot(v.kind, v.dtype, v.head_dim, v.even_d)
            and not kept_exact(v))


def _merged(v: Variant) -> bool:
    """Whether a superset variant serves v's calls (so v is not compiled)."""
    if kept_exact(v) or v.kind in GQA_KINDS or v.kind in FP8_KINDS or v.kind in SINK_KINDS:
        return False
    only_extras, only_masked = superset_only(v.kind, v.dtype, v.head_dim, v.even_d)
    return (only_extras and not v.extras) or (only_masked and v.even_d)


def all_variants(grids: dict | None = None) -> list[Variant]:
    """The variants the build compiles: all_combinations' but those a superset variant serves; the
    warp-specialized kernel's on `grids` (ws_tables: None, the shipped GLUON_WS_GRIDS)."""
    return [v for v in all_combinations(grids) if not _merged(v)]


def all_combinations(grids: dict | None = None) -> list[Variant]:
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
    # TMA cubins ran slower than the pointer ones (lab/experiments/ab_tma.py, perf-notes v3).
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
        out += gluon_variants(grids)
    return out + gqa_variants() + fp8_variants() + sink_variants()


def gqa_variants() -> list[Variant]:
    """GroupQueryAttention's prepare kernels (no mask, extras or precision: those fields keep
    their defaults)."""
    return [Variant(dtype, hd, False, "none", False, "ieee" if dtype == "fp32" else "tf32", kind)
            for kind in GQA_KINDS for dtype in GQA_DTYPES for hd in GQA_HEAD_DIMS]


def fp8_variants() -> list[Variant]:
    """The FP8 prefill path's kernels (FP8_KINDS): per dtype and head dim the two prepare kernels and
    the attention for causal and non-causal calls (tile_causal 0 / 1)."""
    out = []
    for dtype, hd in itertools.product(FP8_DTYPES, FP8_HEAD_DIMS):
        for kind in FP8_KINDS:
            for causal in ((0, 1) if kind == "fwd_fp8" else (-1,)):
                out.append(Variant(dtype, hd, True, "none", False, "tf32", kind, tile_causal=causal))
    return out


def sink_variants() -> list[Variant]:
    """The attention sinks' rescale kernel per dtype and BLOCK_D (other fields: their defaults)."""
    return [Variant(dtype, hd, False, "none", False, "ieee" if dtype == "fp32" else "tf32", kind)
            for kind in SINK_KINDS for dtype in SINK_DTYPES for hd in SINK_HEAD_DIMS]
