"""The AOT kernel table and its launch ABI, checked without a GPU: the TMA-descriptor variants
(aot/build.py's signatures and recorded boxes, the table compiled into the library) agree with
what cpp/cuda_launch.cc encodes and passes."""
from __future__ import annotations

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
