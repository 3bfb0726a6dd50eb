"""The variant table: which specializations of aot/flash_fwd.py get compiled, and their tiles.

This file is the single source of the kernel family's shape. aot/build.py compiles the product
below for each target arch and generates the C++ table (`kernel_table.gen.cc`) that the runtime
dispatcher (cpp/cuda_launch.cc, select_variant) searches by `VariantKey`; tile sizes reach C++
through that table, so the launcher never restates them.

Tiles are for Triton 3.6 (the pinned version). The sm_90 fp16/bf16 tiles for head dims 64 and
128 come from aot/tune.py on the H200 (docs/perf-notes.md); the rest are chosen by hand to fit
shared memory and have not been tuned.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

TRITON_VERSION = "3.6.0"

# (dtype, dot precision). fp32 defaults to exact IEEE dots; TF32 is an explicit opt-in.
DTYPE_PRECISIONS = (("fp16", "tf32"), ("bf16", "tf32"), ("fp32", "ieee"), ("fp32", "tf32"))
# Head-dim buckets (BLOCK_D == BLOCK_DV) and whether an exact-size ("even") variant exists.
HEAD_DIMS = ((32, False), (64, True), (128, True), (256, True))
MASK_KINDS = {"none": 0, "bool": 1, "add": 2}
DTYPE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}    # mirrors ort_flash::DType
PRECISION_CODES = {"ieee": 0, "tf32x3": 1, "tf32": 2}  # mirrors ort_flash::Fp32Precision


@dataclass(frozen=True)
class Variant:
    dtype: str
    head_dim: int          # BLOCK_D == BLOCK_DV bucket (power of two)
    even_d: bool           # D == Dv == head_dim: no head-dim masking, 16-aligned strides
    mask: str              # key of MASK_KINDS
    extras: bool           # windows, softcap, nonpad_kv_seqlen
    precision: str         # dot precision; "tf32" (ignored by Triton) for fp16/bf16

    @property
    def name(self) -> str:
        prec = f"_{self.precision}" if self.dtype == "fp32" else ""
        return (f"flash_fwd_{self.dtype}{prec}_d{self.head_dim}{'' if self.even_d else 'm'}"
                f"_{self.mask}{'_x' if self.extras else ''}")


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def get_fwd_config(arch: int, v: Variant) -> TileConfig:
    """Tile table per (arch, dtype, head dim)."""
    if v.dtype == "fp32":
        if v.head_dim >= 256:
            return TileConfig(32, 32, 4, 1)
        return TileConfig(64, 32, 4, 2 if v.head_dim <= 64 else 1)
    if v.head_dim >= 256:
        return TileConfig(64, 32, 4, 1 if arch < 90 else 2)
    if arch >= 90:  # tuned by aot/tune.py on the H200 (docs/perf-notes.md, 2026-11-29)
        if v.head_dim <= 64:
            return TileConfig(128, 64, 4, 3)
        return TileConfig(128, 64, 8, 3)
    if v.head_dim <= 64:
        return TileConfig(128, 64, 4, 3)
    return TileConfig(128, 32, 8, 2)


def all_variants() -> list[Variant]:
    out = []
    for (dtype, prec), (hd, has_even), mask, extras in itertools.product(
            DTYPE_PRECISIONS, HEAD_DIMS, MASK_KINDS, (False, True)):
        for even in ((True, False) if has_even else (False,)):
            out.append(Variant(dtype, hd, even, mask, extras, prec))
    return out
