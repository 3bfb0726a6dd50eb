"""The AOT kernel table and its launch ABI, checked without a GPU: the TMA-descriptor variants
(aot/build.py's signatures and recorded boxes, the table compiled into the library) agree with
what cpp/cuda_launch.cc encodes and passes."""
from __future__ import annotations

import dataclasses
import itertools
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def build():
    pytest.importorskip("triton", reason="aot/build.py imports the kernel sources (Triton)")
    sys.path.insert(0, str(ROOT / "aot"))
    import build as b
    return b


def _cxx_constants() -> dict[str, int]:
    text = (ROOT / "cpp" / "kernel_table.h").read_text()
    base = dict(re.findall(r"constexpr int (k\w+) = (\d+);", text))
    out = {k: int(v) for k, v in base.items()}
    m = re.search(r"kTmaLaunchArgCount = kLaunchArgCount \+ kTmaDescriptors \* (\d+);", text)
    out["kTmaLaunchArgCount"] = out["kLaunchArgCount"] + out["kTmaDescriptors"] * int(m.group(1))
    return out


def test_launch_abi_counts_match_the_launcher(build):
    consts = _cxx_constants()
    for kind, name in build.ARG_COUNT_NAMES.items():
        assert build._runtime_arg_count(kind) == consts[name], kind
    # Each descriptor is the map, then rank dims and rank strides.
    assert consts["kTmaDescriptors"] == len(build.TMA_ARGS)
    assert build._runtime_arg_count("fwd_tma") - build._runtime_arg_count("fwd") == 4 * 2 * build.TMA_RANK


def test_tma_variants_and_signatures(build):
    from variants import TMA_MIN_ARCH, all_variants, get_fwd_config

    tma = [v for v in all_variants() if v.kind == "fwd_tma"]
    assert tma and all(v.dtype in ("fp16", "bf16") and v.head_dim in (64, 128) and v.even_d
                       and (v.mask == "none") != v.mask_keys for v in tma)  # no full-mask TMA cubins
    assert all(v.min_arch == TMA_MIN_ARCH for v in tma)
    for v in tma:
        cfg = get_fwd_config(90, v)
        sig, attrs, names = build.signature(v, cfg)
        assert sig["Q"] == sig["Y"] == f"tensordesc<{v.dtype}[1,1,{cfg.block_m},{v.head_dim}]>"
        assert sig["K"] == sig["V"] == f"tensordesc<{v.dtype}[1,1,{cfg.block_n},{v.head_dim}]>"
        assert not any((names.index(n),) in attrs for n in build.TMA_ARGS)  # no pointer hints


def test_tma_boxes_refuse_what_the_launcher_cannot_encode(build):
    from variants import Variant

    v = Variant("fp16", 128, True, "none", False, "tf32", "fwd_tma")
    good = dict(swizzle=3, elem_size=2, elem_type=6, block_size=[1, 1, 64, 64], fp4_padded=False)
    boxes = build._tma_boxes(v, SimpleNamespace(tensordesc_meta=[good] * 4))
    assert [b["arg"] for b in boxes] == ["Q", "K", "V", "Y"] and boxes[0]["rows"] == 64
    for bad in (dict(good, block_size=[2, 1, 64, 64]), dict(good, elem_type=10), dict(good, elem_size=4)):
        with pytest.raises(RuntimeError, match="descriptor Q"):
            build._tma_boxes(v, SimpleNamespace(tensordesc_meta=[bad] + [good] * 3))
    with pytest.raises(RuntimeError, match="expected 4"):
        build._tma_boxes(v, SimpleNamespace(tensordesc_meta=[good] * 3))


def test_library_table_has_tma_kernels_for_sm90_only():
    from ort_flash import _C

    kernels = _C.kernels()
    if not kernels:
        pytest.skip("a CPU-only build (ORT_FLASH_CUDA_ARCHS empty) has no kernel table")
    tma = [k for k in kernels if k["kind"] == "fwd_tma"]
    archs = {k["arch"] for k in kernels}
    assert {k["arch"] for k in tma} == ({a for a in archs if a >= 90})
    for k in tma:
        assert k["dtype"] in ("float16", "bfloat16") and k["head_dim"] in (64, 128) and k["even_d"]
        assert (k["mask"] == "none") != k["mask_keys"]
        rows = [k["block_m"], k["block_n"], k["block_n"], k["block_m"]]
        for (swizzle, box_rows, box_cols), r in zip(k["tma"], rows):
            # 128-byte swizzle: a box row is at most 128 bytes, and the boxes tile the head dim.
            assert swizzle == 3 and box_rows == r and box_cols * 2 <= 128 and k["head_dim"] % box_cols == 0


def test_key_vector_mask_variants(build):
    """Every key-vector-mask variant is a masked forward variant, a pointer one with a full-mask
    twin (the launcher's fallback), and is named apart from its twin."""
    import dataclasses

    from variants import all_variants

    vs = all_variants()
    names = {v.name for v in vs}
    keys = [v for v in vs if v.mask_keys]
    assert {(v.kind, v.mask) for v in keys} == {(k, m) for k in ("fwd", "fwd_tma") for m in ("bool", "add")}
    assert len(names) == len(vs)
    for v in keys:
        if v.kind == "fwd":
            assert dataclasses.replace(v, mask_keys=False) in vs
        assert v.name.endswith(("_addk", "_boolk", "_addk_x", "_boolk_x"))


def _variants():
    sys.path.insert(0, str(ROOT / "aot"))
    import variants
    return variants


def test_tma_tile_table_is_a_partition():
    """For each head dim and causal flag the unmasked TMA tiles' ranges start at length 0 and
    never tie, each has one cubin per dtype (the extras variants one tile), and tma_tile (what the
    C++ pick_tile does) takes the long-sequence tiles only when both Sq and Skv are long."""
    v = _variants()
    for hd, entries in v.TMA_TILES.items():
        for causal in (0, 1):
            starts = [k for c, k, _ in entries if c in (-1, causal)]
            assert 0 in starts and len(starts) == len(set(starts)), (hd, causal, starts)
    tma = [x for x in v.all_variants() if x.kind == "fwd_tma" and x.mask == "none"]
    for dtype, hd in itertools.product(v.TMA_DTYPES, v.TMA_HEAD_DIMS):
        plain = [x for x in tma if (x.dtype, x.head_dim, x.extras) == (dtype, hd, False)]
        assert sorted((x.tile_causal, x.tile_min_len) for x in plain) == sorted(
            (c, k) for c, k, _ in v.TMA_TILES[hd])
        for x in plain:
            assert v.get_fwd_config(90, x) == v.TileConfig(*next(
                t for c, k, t in v.TMA_TILES[hd] if (c, k) == (x.tile_causal, x.tile_min_len)))
        extras = [x for x in tma if (x.dtype, x.head_dim, x.extras) == (dtype, hd, True)]
        assert len(extras) == 1 and v.get_fwd_config(90, extras[0]) == v.tma_tile(hd, False, 0)
    assert len({x.name for x in v.all_variants()}) == len(v.all_variants())
    T = v.TileConfig
    assert v.tma_tile(64, True, 512) == T(64, 64, 4, 2) and v.tma_tile(64, False, 512) == T(128, 64, 8, 3)
    assert v.tma_tile(64, True, 16384) == v.tma_tile(64, False, 8192) == T(64, 128, 4, 2)
    assert v.tma_tile(128, False, 1024) == v.tma_tile(128, True, 4096) == T(64, 64, 4, 3)
    assert v.tma_tile(128, False, 2048) == v.tma_tile(128, True, 8192) == T(128, 128, 8, 3)
    assert v.tma_tile(128, True, 8192, extras=True) == T(64, 64, 4, 3)


def test_decode_wide_tiles_twin_their_base():
    """Each decode tile for grids past one CTA per SM has a base variant that differs only in
    tile_min_len, with the same BLOCK_M and BLOCK_N (the base plans the splits), on sm_90 only."""
    v = _variants()
    decode = [x for x in v.all_variants() if x.kind == "decode"]
    wide = [x for x in decode if x.tile_min_len]
    assert wide and all(x.tile_min_len == v.DECODE_WIDE_WAVES and x.min_arch == 90 for x in wide)
    assert {x.dtype for x in wide} == {"fp16", "bf16"} and all(x.even_d for x in wide)
    for x in wide:
        base = dataclasses.replace(x, tile_min_len=0)
        assert base in decode and base.name != x.name and x.name.endswith(("_w2", "_w2_x")), x.name
        b, w = v.get_fwd_config(90, base), v.get_fwd_config(90, x)
        assert (b.block_m, b.block_n) == (w.block_m, w.block_n) and b != w, (b, w)


def test_library_table_mirrors_the_tile_table():
    """The compiled table (what the C++ dispatcher searches) carries each TMA cubin's tile and
    its range as aot/variants.py states them."""
    from ort_flash import _C

    kernels = [k for k in _C.kernels() if k["kind"] == "fwd_tma"]
    if not kernels:
        pytest.skip("this build has no sm_90 kernels (ORT_FLASH_CUDA_ARCHS without 90)")
    v = _variants()
    by_name = {x.name: x for x in v.all_variants()}
    for k in kernels:
        x = by_name[k["variant"]]
        cfg = v.get_fwd_config(k["arch"], x)
        assert (k["block_m"], k["block_n"], k["num_warps"]) == (cfg.block_m, cfg.block_n, cfg.num_warps)
        assert (k["tile_causal"], k["tile_min_len"]) == (x.tile_causal, x.tile_min_len), k["variant"]
    assert {k["tile_min_len"] for k in kernels if k["mask"] == "none" and not k["extras"]} > {0}
    decode = [k for k in _C.kernels() if k["kind"] == "decode" and k["arch"] == 90]
    for k in decode:
        x = by_name[k["variant"]]
        cfg = v.get_fwd_config(90, x)
        assert (k["block_m"], k["block_n"], k["num_warps"], k["tile_min_len"]) == (
            cfg.block_m, cfg.block_n, cfg.num_warps, x.tile_min_len), k["variant"]
    assert {k["tile_min_len"] for k in decode} == {0, v.DECODE_WIDE_WAVES}


def test_only_decode_kernels_from_sm90_wait_for_the_grid_before(build):
    """KernelEntry::pdl (programmatic dependent launch) is set exactly on the decode split
    kernels of sm_90 and later: those cubins wait (griddepcontrol.wait) before touching memory,
    so the launcher may start them while the grid before them drains; sm_80 has no such wait."""
    from ort_flash import _C

    kernels = _C.kernels()
    if not kernels:
        pytest.skip("a CPU-only build (ORT_FLASH_CUDA_ARCHS empty) has no kernel table")
    for k in kernels:
        assert k["pdl"] == (k["kind"] == "decode" and k["arch"] >= build.PDL_MIN_ARCH), k["variant"]
        if k["kind"] == "decode":
            assert build.decode_pdl(k["arch"]) == int(k["pdl"])
    assert any(k["pdl"] for k in kernels) == any(k["arch"] >= 90 for k in kernels)
