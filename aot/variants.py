"""The variant table: which specializations of aot/flash_fwd.py get compiled, and their tiles.

This file is the single source of the kernel family's shape. aot/build.py compiles the product
below for each target arch and generates the C++ table (`kernel_table.gen.cc`) that the runtime
dispatcher (cpp/kernel_registry.cc) searches by `VariantKey`; tile sizes reach C++ through that
table, so the launcher never restates them.

Tiles were picked for Triton 3.6 (the pinned version); retune with aot/tune.py when that changes.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

TRITON_VERSION = "3.6.0"

DTYPES = ("fp16", "bf16", "fp32")
HEAD_DIM_BUCKETS = (64, 128)
MASK_KINDS = {"none": 0, "bool": 1, "add": 2}
FP32_PRECISIONS = ("ieee", "tf32x3", "tf32")
DTYPE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}  # mirrors ort_flash::DType


@dataclass(frozen=True)
class Variant:
    dtype: str
    head_dim: int          # BLOCK_D == BLOCK_DV bucket (power of two)
    even_d: bool           # D == Dv == head_dim: no head-dim masking, 16-aligned strides
    causal: bool
    mask: str              # key of MASK_KINDS
    extras: bool           # windows, softcap, nonpad_kv_seqlen
    precision: str         # dot precision for fp32; "tf32" (unused) for fp16/bf16

    @property
    def name(self) -> str:
        return (f"flash_fwd_{self.dtype}_d{self.head_dim}{'' if self.even_d else 'm'}"
                f"_{'c' if self.causal else 'n'}_{self.mask}{'_x' if self.extras else ''}"
                f"{'_' + self.precision if self.dtype == 'fp32' else ''}")


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def get_fwd_config(arch: int, v: Variant) -> TileConfig:
    """Tile table per (arch, dtype, head dim, causal)."""
    if v.dtype == "fp32":
        return TileConfig(64, 32, 4, 2)
    if arch >= 90:
        if v.head_dim <= 64:
            return TileConfig(128, 64, 4, 3)
        return TileConfig(128, 64, 8, 2)
    if v.head_dim <= 64:
        return TileConfig(128, 64, 4, 3)
    return TileConfig(128, 32, 8, 2)


def all_variants() -> list[Variant]:
    out = []
    for dtype, hd, causal, mask in itertools.product(
            DTYPES, HEAD_DIM_BUCKETS, (False, True), ("none", "add")):
        precisions = ("tf32x3",) if dtype == "fp32" else ("tf32",)
        for prec in precisions:
            out.append(Variant(dtype, hd, True, causal, mask, False, prec))
    return out
