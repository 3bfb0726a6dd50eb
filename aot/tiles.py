"""Tile policy as data: the tiles the kernels compile at, for the variant table (aot/variants.py,
get_fwd_config) and the kernels that need a number of them. Plain data and lookups: it imports
neither Triton nor a kernel module, so the table reads it without the kernels.

Tiles are for the pinned Triton and tuned offline on the H200 (lab/experiments/tune.py,
lab/experiments/gluon_attn.py, lab/experiments/gluon_mask.py); docs/perf-notes.md has the measurements,
cited here by version. Nothing is autotuned at run time.
"""
from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass(frozen=True)
class WsGrid:
    """How the warp-specialized kernel walks a call's query tiles (aot/gluon_ws/scheduler.py; the
    launcher's grid is cpp/launch_plan.cc fwd_grid's): a CTA per `tiles` consecutive query tiles of
    one (batch, head), or a persistent grid (one CTA per SM over all of the call's tiles, with two Q
    buffers), its CTAs claiming tiles through the stream's counter as they free up where `dynamic`.
    `skip`: a consumer whose rows of a tile all lie past Sq passes the tile's barriers without its
    GEMMs (aot/gluon_ws/mainloop.py _consumer_pass)."""
    tiles: int = 1
    persistent: bool = False
    dynamic: bool = False
    skip: bool = False

    def __post_init__(self):
        if (self.dynamic and not self.persistent) or (self.persistent and self.tiles != 1) or self.tiles < 1:
            raise ValueError(f"{self}: dynamic tiles need the persistent grid, which runs one tile at a time")


# GLUON_WS_GRIDS: per (head dim, causal flag) of unmasked calls, the grid the warp-specialized
# kernel runs (WsGrid) from which min(Sq, Skv) on; its first length is where the kernel
# takes over from the one-partition kernel, each later one starts a cubin of its own.
# - d128 non-causal: a CTA per two query tiles (the next tile's Q and K/V loads under the last one's
#   epilogue) below 8192 keys, one from 8192 (perf-notes prefill v7). The persistent grid is the
#   candidate below, measured in JIT only.
# - Causal, and d64 non-causal: the persistent grid, its CTAs claiming tiles through the stream's
#   counter as they free up (DYNAMIC_TILES: heads in groups that share L2, each group's longest
#   tiles first), where JIT on an H100 measured it the fastest kernel: causal from 1024 keys at
#   d128 (+3-10 % over a CTA per tile), 2048 at d64, d64 non-causal from 1024 (+3-15 %). At d64
#   (192-row tiles) consumers without rows in a tile skip its GEMMs (SKIP_PAST_ROWS), as measured;
#   d128's dynamic cubins were measured without. perf-notes "Prefill v15 in JIT".
_DYNAMIC = WsGrid(persistent=True, dynamic=True)
GLUON_WS_GRIDS = {
    (128, False): {0: WsGrid(tiles=2), 8192: WsGrid()},
    (128, True): {1024: _DYNAMIC},
    (64, False): {1024: WsGrid(persistent=True, dynamic=True, skip=True)},
    (64, True): {2048: WsGrid(persistent=True, dynamic=True, skip=True)},
}
# Candidate grids: entries a development build may put in place of GLUON_WS_GRIDS' own, by name
# (aot/variants.py with_candidates; aot/build.py --gluon-ws-on), so that one GPU build measures
# what they would ship. d128-persistent: d128 non-causal calls on the dynamic persistent grid at
# every length, in place of the two-tile cubins below 8192 keys (perf-notes "Prefill v15 in JIT").
# d128-causal-tile-8192: d128 causal calls on a CTA per tile from 8192 keys, dynamic tiles below
# (perf-notes "Prefill v15 and prepare v2 from the AOT build").
# A candidate may also set the one-partition kernel's tiles by length, under the key ("one", head
# dim): (min length, TileConfig) steps over that kernel's range (None: GLUON_TILES').
# short-two-slots: a two-slot K/V ring and more CTAs an SM below 1024 keys (d128 BLOCK_N 32: four
# CTAs; d64 BLOCK_M 64 on one warpgroup: four), the shipped tile from 1024 (perf-notes "The append
# in the attention's load path and a two-slot ring").
GLUON_WS_CANDIDATES = {"d128-persistent": {(128, False): {0: _DYNAMIC}},
                       "d128-causal-tile-8192": {(128, True): {1024: _DYNAMIC, 8192: WsGrid()}},
                       "short-two-slots": {("one", 128): ((0, TileConfig(64, 32, 4, 2)), (1024, None)),
                                           ("one", 64): ((0, TileConfig(64, 64, 4, 2)), (1024, None))}}


# The unmasked TMA kernels' tiles per head dim: (causal, min length, (BLOCK_M, BLOCK_N, warps,
# stages)). An entry serves calls with that causal flag (-1: either) and min(Sq, Skv) from its min
# length up to the next matching entry's (the shorter side, so a short chunk against a long cache
# keeps the small-BLOCK_M tile and its larger grid). lab/experiments/tune.py --tma (perf-notes v5). The
# C++ dispatcher reads the ranges from the generated table (KernelEntry::tile_causal, tile_min_len).
TMA_TILES = {
    64: ((0, 0, (128, 64, 8, 3)), (1, 0, (64, 64, 4, 2)), (-1, 8192, (64, 128, 4, 2))),
    128: ((-1, 0, (64, 64, 4, 3)), (0, 2048, (128, 128, 8, 3)), (1, 8192, (128, 128, 8, 3))),
}

# GroupQueryAttention's prepare kernels (aot/gqa_prepare.py), memory-bound, 4 warps a CTA.
# gqa_prepare: GQA_ELEMENTS elements a CTA, as rows ((token, head) pairs) of BLOCK_D; its general
# path gathers GQA_GATHER_ELEMENTS at a time. Reasoned, not measured (perf-notes "Prepare v2"):
# the fast path's CTA moves 4096 elements (8 KB in and 8 KB out at fp16; cos/sin mostly from
# L1/L2), each thread with two 16-byte vectors of each half, of cos and of sin in flight. One
# register count serves both paths, and the general path's gathers cost 12-25 registers per
# element a thread (a 64-bit address per load): chunks of 512 elements (4 a thread) keep sm_90 at
# 72-127 registers, 4-7 CTAs (16-28 warps) an SM, so 32-56 KB of reads in flight per SM at fp16,
# where about 10-20 KB keep HBM at the copy rate (Little: ~1.5 TB/s of reads x ~1 us / 132 SMs);
# the whole tile at once took 186-255 registers (2 CTAs an SM, or spills). gqa_past and gqa_compact
# (copies) and gqa_shift (a copy in each of its two launches): 2048 elements a CTA (4096 took 232
# registers).
GQA_ELEMENTS = 4096
GQA_GATHER_ELEMENTS = 512
GQA_PAST_ELEMENTS = 2048


def gqa_tile(head_dim: int, kind: str = "gqa_prepare") -> tuple[int, int, int, int]:
    """(rows per CTA, rows per chunk of gqa_prepare's general path, num_warps, stages) of a prepare
    kernel of `kind` compiled for `head_dim`."""
    rows = (GQA_PAST_ELEMENTS if kind in ("gqa_past", "gqa_compact", "gqa_shift") else GQA_ELEMENTS) // head_dim
    return (rows, min(rows, GQA_GATHER_ELEMENTS // head_dim), 4, 1)

# The one-partition Gluon kernel (aot/flash_fwd_gluon.py) per head dim (perf-notes prefill v6):
# d128 one warpgroup per CTA and two CTAs per SM (115 KB of shared memory each).
GLUON_TILES = {128: dict(BLOCK_M=64, BLOCK_N=64, NUM_STAGES=3, num_warps=4),
               64: dict(BLOCK_M=128, BLOCK_N=64, NUM_STAGES=4, num_warps=8)}

# The warp-specialized kernel (aot/gluon_ws/): the default partition is one consumer warpgroup
# (wgmma's M is 64 rows per warpgroup); the producer is one more warp.
WS_CONSUMER_WARPS = 4
WS_PRODUCER_REGS = 24
# Per (head dim, key-vector mask): d128 two consumers of 64 rows, BLOCK_N 128, two slots (164 KB);
# d64 three consumers (192 rows), three slots (123 KB), under a mask BLOCK_N 64 and four slots (its
# fastest spill-free tile: at BLOCK_N 128 the mask row's registers spilled). Registers: maxnreg a
# thread outside the partitions (one CTA per SM), CONSUMER_REGS per consumer thread, the producer's
# WS_PRODUCER_REGS. perf-notes prefill v7 (unmasked), v8 (masked).
WS_TILES = {
    (128, False): dict(BLOCK_M=128, BLOCK_N=128, NUM_STAGES=2, maxnreg=168, NUM_CONSUMERS=2, CONSUMER_REGS=240),
    (128, True): dict(BLOCK_M=128, BLOCK_N=128, NUM_STAGES=2, maxnreg=168, NUM_CONSUMERS=2, CONSUMER_REGS=240),
    (64, False): dict(BLOCK_M=192, BLOCK_N=128, NUM_STAGES=3, maxnreg=128, NUM_CONSUMERS=3, CONSUMER_REGS=160),
    (64, True): dict(BLOCK_M=192, BLOCK_N=64, NUM_STAGES=4, maxnreg=128, NUM_CONSUMERS=3, CONSUMER_REGS=160),
}


def gluon_config(dtype: str, head_dim: int, causal: bool) -> dict:
    """The one-partition Gluon kernel's BLOCK_M, BLOCK_N, NUM_STAGES and num_warps for a call."""
    del dtype, causal
    return dict(GLUON_TILES[head_dim])


def ws_config(dtype: str, head_dim: int, causal: bool, mask: str = "none") -> dict:
    """The warp-specialized kernel's tile for a call (its constexprs, num_warps and maxnreg); its grid
    (tiles per CTA, persistent, dynamic, skipped rows) is the variant table's (aot/variants.py
    GLUON_WS_GRIDS)."""
    del dtype, causal
    return dict(WS_TILES[(head_dim, mask != "none")], num_warps=WS_CONSUMER_WARPS, PINGPONG=True)


def ws_desc_rows(cfg: dict) -> tuple:
    """The box rows of the warp-specialized kernel's Q, K, V and Y descriptors for a ws_config."""
    half = cfg["BLOCK_M"] // cfg.get("NUM_CONSUMERS", 2)
    return half, cfg["BLOCK_N"], cfg["BLOCK_N"], half
