"""The Gluon Hopper kernel's place in the AOT pipeline, checked without a GPU (Gluon has no
interpreter): its variants, their AOT compile for sm_90 (signature strings with the shared layout,
the metadata the launcher reads: total warps, shared memory, TMA boxes), the launch ABI count, the
generated table rows, and the dispatcher over a table (ort_flash._C.plan_with_table): the Gluon
kind exactly where aot/variants.py says, never otherwise, and ORT_FLASH_GLUON=0.

Table and dispatch tests run against tests/_gluon_fixture.py (the real kernel's interface, no
attention) so that they do not depend on the kernel's tiles; the compile tests also compile the
shipped aot/flash_fwd_gluon.py where it exists."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("triton.experimental.gluon", reason="the Gluon kernels compile with Triton's Gluon")

from _paths import child_env  # noqa: E402
from _table_rows import table_rows as _rows  # noqa: E402

from aot import build, variants  # noqa: E402

SHIPPED = importlib.util.find_spec(variants.GLUON_MODULE) is not None


@pytest.fixture
def fixture_gluon(monkeypatch):
    """The variant table with Gluon variants from the stand-in kernel, taking every length."""
    import _gluon_fixture
    monkeypatch.setattr(variants, "GLUON_ENABLED", True)
    monkeypatch.setattr(variants, "GLUON_MODULE", "_gluon_fixture")
    monkeypatch.setattr(variants, "gluon_config", _gluon_fixture.get_gluon_config)
    monkeypatch.setattr(variants, "GLUON_LENGTHS", {})
    monkeypatch.setattr(variants, "GLUON_WS_LENGTHS", {})
    return variants


def _gluon(vs):
    return [v for v in vs if v.kind == "fwd_gluon"]


def test_gluon_variants_are_the_calls_it_takes(fixture_gluon):
    v = fixture_gluon
    g = _gluon(v.all_variants())
    assert {(x.dtype, x.head_dim) for x in g} == {(d, h) for d in v.GLUON_DTYPES for h in v.GLUON_HEAD_DIMS}
    for x in g:
        assert x.min_arch == v.GLUON_MIN_ARCH == 90 and x.even_d and x.mask == "none"
        assert not x.extras and not x.mask_keys and x.name.startswith("flash_fwd_gluon_")
    # The stand-in's causal d64 tile differs: one cubin per causal flag there, one otherwise.
    assert sorted(x.tile_causal for x in g if (x.dtype, x.head_dim) == ("fp16", 64)) == [0, 1]
    assert [x.tile_causal for x in g if (x.dtype, x.head_dim) == ("fp16", 128)] == [-1]
    for x in g:
        assert v.get_fwd_config(90, x) == v.gluon_tile(x.dtype, x.head_dim, x.tile_causal == 1)
        assert (x.tile_min_len, x.tile_max_len) == v.gluon_lengths(x.dtype, x.head_dim, x.tile_causal == 1) == (0, 0)
    names = [x.name for x in v.all_variants()]
    assert len(names) == len(set(names))


def test_shipped_table_keeps_gluon_small_and_sm90_only():
    """What the build compiles as committed: no Gluon variant unless GLUON_ENABLED, and then at
    most two unmasked ones per (kernel, dtype, head dim, causal flag) (the build-time budget, docs/build-time.md),
    each range of GLUON_LENGTHS and GLUON_WS_LENGTHS non-empty; key-vector-masked ones only in the
    warp-specialized kernel at GLUON_WS_MASKS' head dims, within the unmasked cubins' range, one
    query tile per CTA."""
    g = _gluon(variants.all_variants())
    for (dtype, hd, causal), (lo, hi) in variants.GLUON_LENGTHS.items():
        assert dtype in variants.GLUON_DTYPES and hd in variants.GLUON_HEAD_DIMS and causal in (False, True)
        assert lo >= 0 and (hi == 0 or hi > lo)
    for (dtype, hd, causal), (lo, hi) in variants.GLUON_WS_LENGTHS.items():
        assert dtype in variants.GLUON_DTYPES and hd in variants.GLUON_HEAD_DIMS and causal in (False, True)
        assert lo >= 0 and (hi == 0 or hi > lo)
    assert bool(g) == variants.GLUON_ENABLED
    plain = [x for x in g if x.mask == "none"]
    assert len(plain) <= 2 * 2 * len(variants.GLUON_DTYPES) * len(variants.GLUON_HEAD_DIMS)
    for x in g:
        if x.mask != "none":
            assert x.ws and x.mask_keys and x.mask in variants.GLUON_WS_MASKS.get(x.head_dim, ()), x
            for causal in ((0, 1) if x.tile_causal == -1 else (x.tile_causal,)):
                twins = [y for y in plain if y.ws and (y.dtype, y.head_dim) == (x.dtype, x.head_dim)
                         and y.tile_causal in (-1, causal)]
                # non-causal: within the unmasked cubins' range (from GLUON_WS_MASKED_FROM at the
                # least); causal: from GLUON_WS_MASKED_CAUSAL's length, below them too
                lo = (variants.GLUON_WS_MASKED_CAUSAL[x.head_dim] if causal else
                      max(min(y.tile_min_len for y in twins), variants.GLUON_WS_MASKED_FROM.get(x.head_dim, 0)))
                assert twins and x.tile_min_len == lo, x
                assert x.tile_max_len == (0 if any(y.tile_max_len == 0 for y in twins) else max(y.tile_max_len for y in twins))
            assert variants.get_fwd_config(90, x).tiles == 1, x
            assert x.tile_causal == 0 or x.head_dim in variants.GLUON_WS_MASKED_CAUSAL, x
    assert all(x.min_arch == 90 for x in g)
    jobs80 = [x for x in variants.all_variants() if 80 >= x.min_arch]
    assert not _gluon(jobs80)


def test_gluon_runtime_parameters_are_flash_fwds(fixture_gluon):
    """The launcher passes either Gluon kernel one argument list (aot/contract.py's FwdGluon ABI:
    the forward kernel's, the descriptors as fwd_tma's, then the tile counter and Q's rotary): the stand-in takes
    it too, so the pipeline tests below are the real kernels'. The Triton kinds keep the forward
    ABI."""
    import inspect

    from aot import contract

    fn = build.kernel_fn("fwd_gluon")
    runtime = [n for n, p in inspect.signature(fn.fn).parameters.items() if "constexpr" not in str(p.annotation)]
    assert tuple(runtime) == contract.runtime_args("fwd_gluon") == contract.runtime_args("fwd") + (
        "TileCounter", "Cos", "Sin", "rotary_half", "max_position")
    assert contract.runtime_args("fwd_tma") == contract.runtime_args("fwd")
    assert contract.launch_arg_count("fwd_gluon") == contract.launch_arg_count("fwd_tma") + 5


@pytest.mark.parametrize("module", ["_gluon_fixture"] + (["aot.flash_fwd_gluon"] if SHIPPED else []))
def test_gluon_signature_is_the_jit_paths(monkeypatch, module):
    """AOT names each descriptor's type as the JIT does for a host TensorDescriptor of the same
    block with the default 128-byte-swizzle layout (the type carries the NVMMASharedLayout): rows
    BLOCK_M for Q/Y (a consumer warpgroup's rows in the warp-specialized kernel), BLOCK_N for K/V;
    for the stand-in and the shipped kernels."""
    import triton.language as tl
    from triton.experimental.gluon.language import NVMMASharedLayout
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    monkeypatch.setattr(variants, "GLUON_ENABLED", True)
    monkeypatch.setattr(variants, "GLUON_MODULE", module)

    class Base:  # what TensorDescriptor reads of a tensor
        def __init__(self, dtype):
            self.dtype = dtype

        def data_ptr(self):
            return 0

    for x in variants.gluon_variants():
        cfg = variants.get_fwd_config(90, x)
        sig, attrs, names = build.signature(x, cfg)
        dtype = {"fp16": tl.float16, "bf16": tl.bfloat16}[x.dtype]
        for name in build.TMA_ARGS:
            block = [1, 1, cfg.desc_rows[name in "KV"], x.head_dim]
            layout = NVMMASharedLayout.get_default_for(block, dtype)
            assert layout.swizzle_byte_width == 128
            d = x.head_dim
            host = TensorDescriptor(Base(dtype), [2, 3, 100, d], [300 * d, 100 * d, d, 1], block, layout)
            assert tl.str_to_ty(sig[name], None).mangle() == tl.str_to_ty(mangle_type(host), None).mangle(), name
            assert (names.index(name),) not in attrs
        assert sig["Lse"] == "*fp32" and sig["BLOCK_M"] == "constexpr"


def _compiled(v, cfg, cache: Path):
    return build._compile_one((v, 90, cfg, str(cache)))


def _check_meta(m, v, cfg):
    from aot import contract

    rows = {"Q": cfg.desc_rows[0], "K": cfg.block_n, "V": cfg.block_n, "Y": cfg.desc_rows[0]}
    assert [b["arg"] for b in m["tma"]] == list(build.TMA_ARGS)
    for b in m["tma"]:
        assert b["swizzle"] == 3 and b["rows"] == rows[b["arg"]] and v.head_dim % b["cols"] == 0
    assert 0 < m["shared"] <= build.SMEM_LIMIT[90]
    assert m["num_warps"] >= cfg.num_warps and m["num_warps"] % 4 == 0  # whole warpgroups
    assert len(m["args"]) + 4 * (2 * build.TMA_RANK) == contract.launch_arg_count("fwd_gluon")


def _compiled_table(out: Path) -> list[dict]:
    """The table aot/build.py wrote into `out` (kernel_table.gen.cc, kernels.gen.S) compiled against
    cpp/ and the contract header, read back through kernel_table(): each entry as C++ sees it."""
    from aot import contract_header

    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if not cxx:
        pytest.skip("no C++ compiler")
    contract_header.write(out)
    fields = ("variant", "kind", "num_warps", "block_m", "block_n", "tile_causal", "tile_min_len", "tile_max_len",
              "persistent", "dynamic", "q_rows", "kv_rows")
    (out / "main.cc").write_text(
        '#include <cstdio>\n#include "kernel_table.h"\nusing namespace ort_flash;\nint main() {\n'
        "  size_t n = 0;\n  const KernelEntry* t = kernel_table(&n);\n  for (size_t i = 0; i < n; ++i) {\n"
        "    const KernelEntry& e = t[i];\n"
        '    std::printf("%s %s %d %d %d %d %d %d %d %d %d %d\\n", e.variant_name, code_name(e.key.kind), e.num_warps,'
        " e.block_m, e.block_n, e.tile_causal, e.tile_min_len, e.tile_max_len, e.persistent, int(e.dynamic),"
        " e.tma[0].rows, e.tma[1].rows);\n  }\n}\n")
    r = subprocess.run([cxx, "-std=c++17", "-Wall", "-I", str(ROOT / "cpp"), "-I", str(out), str(out / "main.cc"),
                        str(out / "kernel_table.gen.cc"), str(out / "kernels.gen.S"), "-o", str(out / "table")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = subprocess.run([str(out / "table")], capture_output=True, text=True, check=True).stdout.splitlines()
    return [dict(zip(fields, [x[0], x[1]] + [int(c) for c in x[2:]])) for x in map(str.split, lines)]


def test_fixture_variant_compiles_and_its_table_row(fixture_gluon, tmp_path):
    """The stand-in (4 default warps and a 1-warp TMA producer) through build.py's compile and
    table writer: the generated table, compiled, has a fwd_gluon entry with the launch's total warps
    (8: whole warpgroups), its tile and its four boxes."""
    v = next(x for x in _gluon(variants.all_variants()) if (x.dtype, x.head_dim) == ("bf16", 128))
    cfg = variants.get_fwd_config(90, v)
    m = _compiled(v, cfg, tmp_path / "cache")
    _check_meta(m, v, cfg)
    assert m["num_warps"] == 8 and m["kernel_name"] == "flash_fwd_gluon"
    m.pop("cached")
    out = tmp_path / "out"
    build.write_outputs(out, [m], {v.name: v})
    assert json.loads((out / "manifest.json").read_text())["kernels"][0]["variant"] == v.name
    e, = _compiled_table(out)
    assert (e["variant"], e["kind"], e["num_warps"], e["block_m"], e["block_n"]) == (
        v.name, "fwd_gluon", 8, cfg.block_m, cfg.block_n)
    assert (e["q_rows"], e["kv_rows"]) == cfg.desc_rows


def test_gluon_cache_key_follows_the_gluon_sources_only(fixture_gluon, monkeypatch):
    v = _gluon(variants.all_variants())[0]
    cfg = variants.get_fwd_config(90, v)
    key = build.cache_key(v, 90, cfg)
    fwd = variants.Variant("fp16", 128, True, "none", False, "tf32", "fwd_tma")
    fwd_key = build.cache_key(fwd, 90, variants.tma_tile(128, False, 0))
    assert key != build.cache_key(dataclasses.replace(v, dtype="bf16"), 90, cfg)
    # Another kernel file for the Gluon kind changes its key and no other.
    monkeypatch.setattr(build, "gluon_sources", lambda: [build.flash_decode.__file__])
    assert build.cache_key(v, 90, cfg) != key
    assert build.cache_key(fwd, 90, variants.tma_tile(128, False, 0)) == fwd_key


@pytest.mark.skipif(not SHIPPED, reason="aot/flash_fwd_gluon.py is not in this tree")
@pytest.mark.parametrize("pick", [("fp16", 128, 0, True), ("bf16", 64, 1, False), ("bf16", 64, 0, True),
                                  ("bf16", 128, 1, True, "add"), ("fp16", 128, 0, True, "bool"),
                                  ("bf16", 64, 0, True, "add")],
                         ids=lambda p: f"{p[0]}-d{p[1]}-c{p[2]}-{'ws' if p[3] else 'one'}" + "".join(f"-{m}" for m in p[4:]))
def test_shipped_gluon_kernel_compiles_for_sm90(monkeypatch, tmp_path, pick):
    """Representative shipped Gluon variants (the one-partition and the warp-specialized kernel)
    compile for sm_90 on this GPU-less machine, with metadata the launcher can use (every variant
    compiles in the full build; these quickly): the warp-specialized one launches its consumer
    warpgroups and the producer warp's warpgroup (12 or 16 warps), its Q/Y boxes one consumer's rows."""
    monkeypatch.setattr(variants, "GLUON_ENABLED", True)
    dtype, hd, causal, ws, mask = pick + ("none",) * (5 - len(pick))
    g = [x for x in variants.gluon_variants() if (x.dtype, x.head_dim, x.ws, x.mask) == (dtype, hd, ws, mask)
         and x.tile_causal in (-1, causal)]
    assert 1 <= len(g) <= 2  # the warp-specialized d128 kernel: one or two query tiles per CTA
    for x in g:
        cfg = variants.get_fwd_config(90, x)
        m = _compiled(x, cfg, tmp_path)
        _check_meta(m, x, cfg)
        if ws:
            assert m["kernel_name"] == "flash_fwd_gluon_ws" and cfg.consumers in (2, 3)
            assert m["num_warps"] == 4 * (cfg.consumers + 1) and cfg.block_m == 64 * cfg.consumers * cfg.tiles
            assert {b["rows"] for b in m["tma"] if b["arg"] in "QY"} == {64}


def _gluon_sass(v, cfg, tiles=None, unnamed=()) -> tuple:
    """Gluon variant v (warp-specialized or one-partition) compiled as aot/build.py compiles it
    (build.triton_source: its signature, hints, constexprs and options), TILES_PER_CTA set to
    `tiles` when given and the constexprs in `unnamed` left out (the kernel's defaults): (shared
    bytes, cuobjdump -res-usage, SASS)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    src, options, _, sig, constexprs = build.triton_source(v, 90, cfg)
    constexprs = {k: val for k, val in dict(constexprs, **({} if tiles is None else {"TILES_PER_CTA": tiles})).items()
                  if k not in unnamed}
    src = GluonASTSource(fn=build.kernel_fn(v.kind, v.ws), signature=sig, constexprs=constexprs, attrs=src.attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        pytest.skip("no cuobjdump in the triton wheel")
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(ck.asm["cubin"])
        res, sass = (subprocess.run([str(tool), flag, str(cubin)], capture_output=True, text=True, check=True).stdout
                     for flag in ("-res-usage", "--dump-sass"))
    return ck.metadata.shared, res, sass


@pytest.mark.skipif(not SHIPPED, reason="aot/flash_fwd_gluon.py is not in this tree")
@pytest.mark.parametrize("hd", [128, 64])
def test_ws_tiles_per_cta_compiles_for_sm90(monkeypatch, hd):
    """TILES_PER_CTA = 2 (two query tiles per CTA of a per-tile grid, the second's loads under the
    first's epilogue; what the persistent grid's CTAs run too) compiles for sm_90 at the shipped
    tile with no spills (cuobjdump -res-usage: no local memory, no stack) and within the
    shared-memory limit; naming TILES_PER_CTA and MASK_KIND unnamed (the kernel's defaults, 1 and
    0) gives the same SASS as the shipped variant, which names them (d128)."""
    monkeypatch.setattr(variants, "GLUON_ENABLED", True)
    v = next(x for x in variants.gluon_variants() if (x.dtype, x.head_dim, x.ws, x.mask) == ("fp16", hd, True, "none")
             and variants.get_fwd_config(90, x).tiles == 1)
    shipped = variants.get_fwd_config(90, v)
    # d64's unmasked cubins all run the persistent grid: the same tile on a per-tile grid
    cfg = dataclasses.replace(shipped, persistent=0, dynamic=False, skip=False)
    shared, res, sass = _gluon_sass(v, cfg, 2)
    assert re.search(r"STACK:0 ", res) and re.search(r"LOCAL:0 ", res), res
    assert 0 < shared <= build.SMEM_LIMIT[90]
    assert sass.count("HGMMA") > 0 and "STL" not in sass
    if hd == 128:
        assert cfg == shipped
        assert _gluon_sass(v, cfg, unnamed=("TILES_PER_CTA", "MASK_KIND"))[2] == _gluon_sass(v, cfg)[2]


def _grids(monkeypatch, grids: dict):
    """The tables as the build makes them from `grids` in place of variants.GLUON_WS_GRIDS."""
    monkeypatch.setattr(variants, "GLUON_ENABLED", True)
    monkeypatch.setattr(variants, "GLUON_WS_GRIDS", grids)
    monkeypatch.setattr(variants, "GLUON_WS_LENGTHS", variants.ws_lengths(grids))


def _candidates(monkeypatch, *names):
    """The tables of a development build with the candidate grids `names` (aot/build.py --gluon-ws-on)."""
    _grids(monkeypatch, variants.with_candidates(names))


def _table_entry(tmp_path, x) -> dict:
    """The generated kernel table's entry of warp-specialized variant x, compiled (a stand-in
    cubin, the metadata aot/build.py records for its tile)."""
    cfg = variants.get_fwd_config(90, x)
    tmp_path.mkdir(parents=True, exist_ok=True)
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\0")
    meta = dict(variant=x.name, arch=90, kernel_name="flash_fwd_gluon_ws", num_warps=12, shared=0,
                block_m=cfg.block_m, block_n=cfg.block_n, num_stages=cfg.num_stages, cubin=str(cubin), tma=[],
                pdl=False, persistent=cfg.persistent, dynamic=cfg.dynamic)
    build.write_outputs(tmp_path / "out", [meta], {x.name: x})
    e, = _compiled_table(tmp_path / "out")
    assert e["variant"] == x.name
    return e


def _want_grid(x, grids: dict):
    """The grid GLUON_WS_GRIDS gives warp-specialized variant x (a CTA per tile under a mask)."""
    if x.mask != "none":
        return variants.WsGrid()
    steps = grids[(x.head_dim, x.tile_causal == 1)]
    return steps[max(k for k in steps if k <= x.tile_min_len)]


@pytest.mark.skipif(not SHIPPED, reason="aot/flash_fwd_gluon.py is not in this tree")
@pytest.mark.parametrize("candidates", [(), ("d128-persistent",), ("d128-causal-tile-8192",)],
                         ids=["shipped", "d128-persistent", "d128-causal-tile-8192"])
def test_ws_grids_of_the_table(monkeypatch, tmp_path, candidates):
    """Each warp-specialized cubin runs the grid GLUON_WS_GRIDS states for its range: the persistent
    grid with dynamic tiles for causal calls from 1024 keys at d128 (no skipped rows) and 2048 at d64,
    and for d64 non-causal ones from 1024 (both with skipped rows); d128 non-causal two tiles per CTA
    below 8192 keys and one from there, or with the d128-persistent candidate the dynamic persistent
    grid at every length; with the d128-causal-tile-8192 candidate d128 causal calls dynamic below 8192
    keys and a CTA per tile from there; key-vector-masked cubins a CTA per tile, no skipped rows. The build names
    PERSISTENT_GRID, DYNAMIC_TILES and SKIP_PAST_ROWS for every one of them (the compile cache keys
    constexprs by value and position), their cache keys differ by each, and the generated table's
    entry, compiled, carries the grid (KernelEntry::persistent and ::dynamic: the launcher's grid
    and tile counters)."""
    _candidates(monkeypatch, *candidates)
    ws = [x for x in variants.gluon_variants() if x.ws]
    dynamic = {(x.head_dim, x.tile_causal, x.tile_min_len) for x in ws if x.mask == "none" and x.dtype == "fp16"
               and variants.get_fwd_config(90, x).dynamic}
    assert dynamic == {(128, 1, 1024), (64, 1, 2048), (64, 0, 1024)} | (
        {(128, 0, 0)} if "d128-persistent" in candidates else set())
    tile_8192 = "d128-causal-tile-8192" in candidates
    for x in ws:
        cfg, want = variants.get_fwd_config(90, x), _want_grid(x, variants.GLUON_WS_GRIDS)
        assert (cfg.tiles, cfg.persistent, cfg.dynamic, cfg.skip) == (want.tiles, int(want.persistent), want.dynamic,
                                                                     want.skip), (x, cfg)
        assert cfg.block_m == variants.ws_config(x.dtype, x.head_dim, x.tile_causal == 1, x.mask)["BLOCK_M"] * cfg.tiles
        assert not (x.mask != "none" and (cfg.persistent or cfg.skip)), x
        constexprs = build.triton_source(x, 90, cfg)[4]
        assert (constexprs["PERSISTENT_GRID"], constexprs["DYNAMIC_TILES"], constexprs["SKIP_PAST_ROWS"]) == (
            want.persistent, want.dynamic, want.skip), x
        if cfg.dynamic:
            capped = tile_8192 and (x.head_dim, x.tile_causal) == (128, 1)
            assert x.tile_max_len == (8192 if capped else 0) and cfg.skip is (x.head_dim == 64), (x, cfg)
            for off in (dataclasses.replace(cfg, persistent=0), dataclasses.replace(cfg, dynamic=False),
                        dataclasses.replace(cfg, skip=not cfg.skip)):
                assert build.cache_key(x, 90, off) != build.cache_key(x, 90, cfg)
    for x in (y for y in ws if y.dtype == "bf16" and y.mask == "none"):
        cfg = variants.get_fwd_config(90, x)
        e = _table_entry(tmp_path / x.name, x)
        assert (e["tile_min_len"], e["tile_max_len"], e["persistent"], e["dynamic"]) == (
            x.tile_min_len, x.tile_max_len, cfg.persistent, int(cfg.dynamic)), e


@pytest.mark.skipif(not SHIPPED, reason="aot/flash_fwd_gluon.py is not in this tree")
@pytest.mark.parametrize("hd,causal,candidate", [(128, 1, ()), (64, 1, ()), (64, 0, ()), (128, 0, ("d128-persistent",))])
def test_dynamic_ws_kernels_compile_for_sm90(monkeypatch, hd, causal, candidate):
    """The dynamic persistent cubins (the shipped ones and the d128 candidate) compile for sm_90 at
    their tile with no spills (the registers each partition is given: maxnreg 168 at d128, 128 at
    d64), within the shared-memory limit (two Q buffers and the tile ids); they claim tiles with
    64-bit atomics, each issued by one thread: the two claims, the count of CTAs done, and the
    two resets."""
    _candidates(monkeypatch, *candidate)
    v = next(x for x in variants.gluon_variants() if (x.dtype, x.head_dim, x.ws, x.mask, x.tile_causal)
             == ("fp16", hd, True, "none", causal))
    cfg = variants.get_fwd_config(90, v)
    assert cfg.persistent == 1 and cfg.dynamic and cfg.skip is (hd == 64)
    shared, res, sass = _gluon_sass(v, cfg)
    assert re.search(r"STACK:0 ", res) and re.search(r"LOCAL:0 ", res), res
    assert re.search(rf"REG:{cfg.maxnreg} ", res), res
    assert 0 < shared <= build.SMEM_LIMIT[90]
    assert sass.count("HGMMA") > 0 and "STL" not in sass
    assert sass.count("ATOMG.E.ADD.64") == 3 and sass.count("ATOMG.E.EXCH.64") == 2


@pytest.mark.skipif(not SHIPPED, reason="aot/flash_fwd_gluon.py is not in this tree")
@pytest.mark.parametrize("d,causal,sq", [(128, True, 512), (128, True, 1000), (128, True, 1024), (64, True, 2000),
                                         (64, True, 4096), (64, False, 1000), (64, False, 1024), (128, False, 4096)])
def test_dispatch_over_the_shipped_grids(monkeypatch, d, causal, sq):
    """The shipped table: unmasked causal calls take the warp-specialized cubin (its dynamic
    persistent grid) from 1024 keys at d128 and 2048 at d64, d64 non-causal ones from 1024, and
    below that the one-partition Gluon kernel; d128 non-causal calls the two-tile cubin below 8192
    keys. The table's row says how the launcher runs it (persistent, dynamic)."""
    from ort_flash import _C
    monkeypatch.setattr(variants, "GLUON_ENABLED", True)
    p = _params(b=2, hq=8, hkv=2, sq=sq, skv=sq, d=d, causal=causal)
    rows = _rows(90)
    kind, name, _, _ = _C.plan_with_table(p, rows)
    lo = variants.GLUON_WS_LENGTHS[("fp16", d, causal)][0]
    assert kind == "fwd_gluon" and ("_ws_" in name) is (sq >= lo), (kind, name)
    row = next(r for r in rows if r["variant"] == name)
    grid = (row["persistent"], row["dynamic"], row["block_m"])
    if "_ws_" not in name:
        assert grid == (0, False, variants.gluon_tile("fp16", d, causal).block_m), row
    elif d == 128 and not causal:
        assert grid == (0, False, 256), row
    else:
        assert grid == (1, True, 128 if d == 128 else 192), row


def _ws_summary(grids) -> str:
    """d128's grids in a table built on `grids`: the non-causal one from 0 keys, the d128 fp16
    non-causal range, the causal steps, and the d128 causal cubins' ranges."""
    tables, lengths = variants.ws_tables(grids)
    x = tables[(128, False)][0]
    cubins = sorted((v.tile_min_len, v.tile_max_len) for v in variants.all_variants(grids) if v.ws
                    and (v.dtype, v.head_dim, v.tile_causal, v.mask) == ("fp16", 128, 1, "none"))
    causal = sorted(tables[(128, True)])
    return f"{x.persistent} {x.dynamic} {x.tiles} {lengths[('fp16', 128, False)]} {causal} {cubins}"


SHIPPED_WS = "False False 2 (0, 0) [1024] [(1024, 0)]"
CANDIDATE_WS = {"d128-persistent": "True True 1 (0, 0) [1024] [(1024, 0)]",
                "d128-causal-tile-8192": "False False 2 (0, 0) [1024, 8192] [(1024, 8192), (8192, 0)]",
                "d128-persistent,d128-causal-tile-8192": "True True 1 (0, 0) [1024, 8192] [(1024, 8192), (8192, 0)]"}


def test_gluon_ws_candidates_only_when_asked():
    """The variant table is data: importing aot.variants gives the shipped grids whatever
    ORT_FLASH_GLUON_WS_ON says (it is aot/build.py's option, read when the build starts), and so do
    the table functions without `grids`; with_candidates puts the named candidate grids in place of
    the shipped ones and the table built on them follows (ranges, cubins, tiles); an unknown name is
    a ValueError that names the valid ones, in the build an argument error."""
    assert _ws_summary(None) == SHIPPED_WS
    code = ("import sys; sys.path.insert(0, 'tests'); from test_gluon_aot import _ws_summary; "
            "from aot import variants as v; print(_ws_summary(None)); print(_ws_summary(v.GLUON_WS_GRIDS)); "
            "print(v.GLUON_WS_LENGTHS == v.ws_lengths(v.GLUON_WS_GRIDS))")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(ORT_FLASH_GLUON_WS_ON="d128-persistent"),
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.split("\n")[:3] == [SHIPPED_WS, SHIPPED_WS, "True"], out.stderr
    for names, want in CANDIDATE_WS.items():
        for value in (names, f" {names.replace(',', ' , ')}, ", names.split(",")):
            grids = variants.with_candidates(value)
            assert _ws_summary(grids) == want, value
            assert build.candidate_grids(names) == grids
            assert grids is not variants.GLUON_WS_GRIDS
    assert variants.with_candidates("") == variants.with_candidates([]) == variants.GLUON_WS_GRIDS
    assert build.candidate_grids("") is None and build.candidate_grids(" , ") is None
    assert _ws_summary(None) == SHIPPED_WS  # the shipped table left as it was
    for bad in ("persistent,dynamic,skip", ["d128-persistent", "persistent"]):
        with pytest.raises(ValueError) as e:
            variants.with_candidates(bad)
        assert str(e.value) == ("unknown candidate 'persistent' (d128-persistent, d128-causal-tile-8192, "
                                "short-two-slots)")


def test_build_reads_candidates_from_its_option(monkeypatch, tmp_path, capsys):
    """aot/build.py takes the candidate names from --gluon-ws-on, by default ORT_FLASH_GLUON_WS_ON
    (what `pip install` passes through the CMake step), and compiles the table built on them: the
    d128 fp16 warp-specialized jobs (not compiled here) carry the candidate's ranges and grids; an
    unknown name stops the build with an argument error that names the valid ones."""
    jobs = []
    monkeypatch.setattr(build.compile_pool, "compile_all", lambda js, *a: jobs.append(js) or [])
    # main points TRITON_CACHE_DIR at a folder of its own: restored after the test.
    monkeypatch.setenv("TRITON_CACHE_DIR", os.environ.get("TRITON_CACHE_DIR", str(tmp_path / "triton")))

    def d128_ws(*extra) -> list[tuple]:
        jobs.clear()
        args = ["--archs", "90", "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache"),
                "--only", "^flash_fwd_gluon_ws_fp16_d128_none_"]
        assert build.main(args + list(extra)) == 0
        return sorted((v.tile_causal, v.tile_min_len, v.tile_max_len, cfg.tiles, cfg.persistent, cfg.dynamic)
                      for v, arch, cfg, _ in jobs[0])

    shipped = [(0, 0, 8192, 2, 0, False), (0, 8192, 0, 1, 0, False), (1, 1024, 0, 1, 1, True)]
    monkeypatch.delenv("ORT_FLASH_GLUON_WS_ON", raising=False)
    assert d128_ws() == shipped
    assert "candidate grids" not in capsys.readouterr().out
    monkeypatch.setenv("ORT_FLASH_GLUON_WS_ON", "d128-persistent")
    assert d128_ws() == [(0, 0, 0, 1, 1, True), (1, 1024, 0, 1, 1, True)]
    assert "candidate grids d128-persistent in place of the shipped ones" in capsys.readouterr().out
    assert d128_ws("--gluon-ws-on", "d128-causal-tile-8192") == [
        (0, 0, 8192, 2, 0, False), (0, 8192, 0, 1, 0, False), (1, 1024, 8192, 1, 1, True), (1, 8192, 0, 1, 0, False)]
    assert d128_ws("--gluon-ws-on", "") == shipped
    monkeypatch.setenv("ORT_FLASH_GLUON_WS_ON", "persistent")
    with pytest.raises(SystemExit) as e:
        d128_ws()
    assert e.value.code == 2 and not jobs
    assert ("--gluon-ws-on / ORT_FLASH_GLUON_WS_ON: unknown candidate 'persistent' "
            "(d128-persistent, d128-causal-tile-8192, short-two-slots)") in capsys.readouterr().err


def test_shipped_gluon_ranges_split_the_lengths():
    """Per (dtype, head dim, causal flag) the shipped Gluon cubins' min(Sq, Skv) ranges do not
    overlap, and together with the TMA kernel's they cover every length once (pick_tile takes the
    entry whose range holds the call)."""
    g = _gluon(variants.all_variants())
    for dtype, hd, causal, mask in [(d, h, c, m) for d in variants.GLUON_DTYPES for h in variants.GLUON_HEAD_DIMS
                                    for c in (0, 1) for m in ("none",) + variants.GLUON_WS_MASKS.get(h, ())]:
        g_m = [x for x in g if x.mask == mask]
        spans = sorted((x.tile_min_len, x.tile_max_len or 1 << 40) for x in g_m
                       if (x.dtype, x.head_dim) == (dtype, hd) and x.tile_causal in (-1, causal))
        if mask != "none":  # the warp-specialized kernel's range only, one cubin (one tile per CTA);
            # causal masked calls only at GLUON_WS_MASKED_CAUSAL's head dims (elsewhere the TMA kernel)
            if causal and hd not in variants.GLUON_WS_MASKED_CAUSAL:
                assert spans == [], (dtype, hd, causal, mask, spans)
                continue
            ws = variants.gluon_lengths(dtype, hd, causal, ws=True)
            lo = variants.GLUON_WS_MASKED_CAUSAL[hd] if causal else max(ws[0], variants.GLUON_WS_MASKED_FROM.get(hd, 0))
            assert spans == [(lo, ws[1] or 1 << 40)], (dtype, hd, causal, mask, spans)
            continue
        assert spans, (dtype, hd, causal)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
        ws = variants.gluon_lengths(dtype, hd, causal, ws=True)
        if ws is not None:  # its cubins (split by tiles per CTA) cover its range, one after another
            mine = sorted((x.tile_min_len, x.tile_max_len or 1 << 40) for x in g_m if x.ws
                          and (x.dtype, x.head_dim) == (dtype, hd) and x.tile_causal in (-1, causal))
            assert mine[0][0] == ws[0] and mine[-1][1] == (ws[1] or 1 << 40), mine
            assert all(a[1] == b[0] for a, b in zip(mine, mine[1:])), mine


# The dispatcher, over tables built from aot/variants.py as the build would compile them
# (tests/_table_rows.py).


def _params(b=2, hq=8, hkv=2, sq=1000, skv=1000, d=128, dtype="float16", layout="bhsd", **kw):
    from ort_flash import _C

    p = _C.FlashParams()
    p.dtype = getattr(_C.DType, dtype)
    p.batch, p.hq, p.hkv, p.sq, p.skv, p.d, p.dv = b, hq, hkv, sq, skv, d, kw.pop("dv", d)
    if layout == "bshd":  # the 3-D layout's storage
        p.q_stride, p.y_stride = [sq * hq * d, d, hq * d], [sq * hq * p.dv, p.dv, hq * p.dv]
        p.k_stride, p.v_stride = [skv * hkv * d, d, hkv * d], [skv * hkv * p.dv, p.dv, hkv * p.dv]
    else:
        p.q_stride, p.y_stride = [hq * sq * d, sq * d, d], [hq * sq * p.dv, sq * p.dv, p.dv]
        p.k_stride, p.v_stride = [hkv * skv * d, skv * d, d], [hkv * skv * p.dv, skv * p.dv, p.dv]
    p.q = p.k = p.v = p.y = 1 << 20
    p.scale = 0.1
    for k, val in kw.items():
        if k == "mask":  # (kind, query stride): 0 is a key vector (B, 1, 1, S)
            p.mask_kind, p.mask_stride, p.mask_len, p.mask = getattr(_C.MaskKind, val[0]), [skv * sq, 0, val[1], 1], skv, 1 << 20
        else:
            setattr(p, k, val)
    return p


# Calls the Gluon kernel takes (given a table entry for them): fp16/bf16, exact D == Dv 64/128,
# no mask, no extras; causal or not, GQA/MQA, offsets, odd lengths, either layout.
GLUON_CALLS = [
    dict(), dict(dtype="bfloat16", d=64), dict(sq=113, skv=203, d=64, causal=True),
    dict(sq=1000, skv=1300, causal=True, offset=300), dict(hq=8, hkv=1, sq=4096, skv=4096, d=64),
    dict(b=1, hq=32, hkv=8, sq=128, skv=4096), dict(layout="bshd", sq=300, skv=333, causal=True),
    dict(b=1, hq=16, hkv=16, sq=16384, skv=16384, dtype="bfloat16", causal=True),
]
# Calls it must never take, and the kind they keep.
OTHER_CALLS = [
    (dict(dtype="float32"), "fwd"), (dict(d=80), "fwd"), (dict(d=256), "fwd"), (dict(d=128, dv=64), "fwd"),
    (dict(mask=("add", 1000)), "fwd"), (dict(mask=("bool", 1000), causal=True), "fwd"),
    (dict(mask=("add", 0)), "fwd_tma"), (dict(mask=("bool", 0), d=64), "fwd_tma"),
    (dict(softcap=30.0), "fwd_tma"), (dict(window_left=64, window_right=0), "fwd_tma"),
    (dict(seqlens_k=1 << 20, causal=True), "fwd_tma"),
    (dict(b=1, hq=32, hkv=8, sq=1, skv=8192), "decode"), (dict(sq=4, skv=3000, hq=8, hkv=1, d=64), "decode"),
    (dict(q=(1 << 20) + 8), "fwd"),  # a base the copy engine cannot address (8-byte aligned)
    (dict(q_stride=[8 * 1000 * 136, 1000 * 136, 136]), "fwd"),  # row stride not 16-aligned: masked head dim
]


def _kind(p, rows, **kw):
    from ort_flash import _C
    return _C.plan_with_table(p, rows, **kw)


def _ids(c):
    return "-".join(f"{k}{v}" for k, v in c.items()) or "default"


@pytest.mark.parametrize("call", GLUON_CALLS, ids=_ids)
def test_dispatch_takes_gluon_where_it_can(fixture_gluon, call):
    p = _params(**call)
    kind, name, fallback, splits = _kind(p, _rows(90))
    dt = {"float16": "fp16", "bfloat16": "bf16"}[str(p.dtype).split(".")[-1]]
    assert kind == "fwd_gluon" and name.startswith(f"flash_fwd_gluon_{dt}_d{p.d}_none"), (kind, name)
    # Where the maps cannot be encoded it runs the pointer kernel of the same call.
    assert fallback == f"flash_fwd_{dt}_d{p.d}_none" and splits == 1
    # The causal flag picks its cubin where the table splits by it (the stand-in's d64).
    if p.d == 64:
        assert name.endswith("_c" if p.causal else "_nc"), name
    # No Gluon entries, sm_80 or no tensor maps: exactly the plans without the Gluon kind.
    assert _kind(p, _rows(90, gluon=False)) == ("fwd_tma", _kind(p, _rows(90, gluon=False))[1], fallback, 1)
    assert _kind(p, _rows(80), arch=80)[0] == "fwd"
    assert _kind(p, _rows(90), tensor_maps=False)[:2] == ("fwd", fallback)


@pytest.mark.parametrize("call,kind", OTHER_CALLS, ids=[_ids(c) for c, _ in OTHER_CALLS])
def test_dispatch_never_takes_gluon_otherwise(fixture_gluon, call, kind):
    p = _params(**call)
    got = _kind(p, _rows(90))
    assert got[0] == kind and "gluon" not in got[1] + got[2], got
    assert got == _kind(p, _rows(90, gluon=False))


def test_dispatch_per_shape_rule(fixture_gluon, monkeypatch):
    """GLUON_LENGTHS (stated once, carried as tile_min_len / tile_max_len): outside [lo, hi) the
    TMA kernel keeps the call; the rule compares min(Sq, Skv), per dtype, head dim and causal flag."""
    monkeypatch.setattr(variants, "GLUON_LENGTHS", {("fp16", 128, True): (2048, 8192)})
    g = [x for x in variants.gluon_variants() if x.head_dim == 128]
    assert sorted(x.tile_causal for x in g if x.dtype == "fp16") == [0, 1]  # ranges differ: split
    assert [x.tile_causal for x in g if x.dtype == "bf16"] == [-1]
    assert {x.name for x in g if x.dtype == "fp16"} == {"flash_fwd_gluon_fp16_d128_none_nc",
                                                        "flash_fwd_gluon_fp16_d128_none_c_k2048_lt8192"}
    rows = _rows(90)
    for sq, skv, causal, dtype, want in [
            (1000, 1000, True, "float16", "fwd_tma"), (2047, 8192, True, "float16", "fwd_tma"),
            (2048, 2048, True, "float16", "fwd_gluon"), (8191, 9000, True, "float16", "fwd_gluon"),
            (8192, 8192, True, "float16", "fwd_tma"), (16384, 16384, True, "float16", "fwd_tma"),
            (16384, 16384, True, "bfloat16", "fwd_gluon"), (1000, 1000, True, "bfloat16", "fwd_gluon"),
            (16384, 16384, False, "float16", "fwd_gluon"), (113, 203, False, "float16", "fwd_gluon")]:
        got = _kind(_params(sq=sq, skv=skv, causal=causal, dtype=dtype), rows)
        assert got[0] == want, (sq, skv, causal, dtype, got)
    # ORT_FLASH_GLUON=1 forces it outside the range, on the calls it can take only.
    calls = [dict(sq=1000, skv=1000, causal=True), dict(sq=17, skv=4000, causal=True),
             dict(sq=16384, skv=16384, causal=True)]
    assert {k for k, *_ in _plans_in_subprocess(rows, calls, ORT_FLASH_GLUON="1")} == {"fwd_gluon"}
    others = [c for c, _ in OTHER_CALLS]
    assert _plans_in_subprocess(rows, others, ORT_FLASH_GLUON="1") == [_kind(_params(**c), rows) for c in others]


@pytest.mark.skipif(not SHIPPED, reason="aot/flash_fwd_gluon.py is not in this tree")
def test_dispatch_key_vector_masks_on_the_shipped_table():
    """The shipped table: a key-vector mask at head dim 128 (bool or additive, causal or not, a
    per-head mask) runs the warp-specialized kernel's masked cubin over its range, causal ones at
    every length; at head dim 64 from 2048 keys, causal or not; at head dim 64 below that, with a
    full mask or with ORT_FLASH_GLUON=0 the TMA or pointer kernels."""
    rows = _rows(90)
    for call, want in [(dict(mask=("bool", 0)), "_boolk"), (dict(mask=("add", 0), dtype="bfloat16"), "_addk"),
                       (dict(mask=("add", 0), causal=True, sq=4096, skv=4096), "_addk"),
                       (dict(mask=("add", 0), causal=True), "_addk"),
                       (dict(mask=("bool", 0), causal=True, d=64, sq=2100, skv=2300), "_boolk"),
                       (dict(mask=("bool", 0), sq=16384, skv=16384), "_boolk")]:
        kind, name, fallback, _ = _kind(_params(**call), rows)
        assert kind == "fwd_gluon" and "gluon_ws" in name and want in name, (call, kind, name)
        assert fallback.startswith("flash_fwd_") and "gluon" not in fallback, fallback
    for call, want in [(dict(mask=("bool", 0), d=64), "fwd_tma"), (dict(mask=("add", 1000)), "fwd"),
                       (dict(mask=("bool", 0), causal=True, d=64, sq=130, skv=300), "fwd_tma"),
                       (dict(mask=("bool", 0), causal=True, d=64, sq=2047, skv=2047), "fwd_tma")]:
        kind, name, *_ = _kind(_params(**call), rows)
        assert kind == want and "gluon" not in name, (call, kind, name)
    off = _plans_in_subprocess(rows, [dict(mask=("bool", 0))], ORT_FLASH_GLUON="0")
    assert off[0][0] == "fwd_tma"


def _plans_in_subprocess(rows, calls, **env) -> list[tuple]:
    """_kind for each call in a fresh Python with `env` (the launcher reads its switches once)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import test_gluon_aot as t; "
            "rows, calls = json.loads(sys.argv[2]), json.loads(sys.argv[3]); "
            "print(json.dumps([list(t._kind(t._params(**{k: tuple(v) if k == 'mask' else v "
            "for k, v in c.items()}), rows)) for c in calls]))")
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests"), json.dumps(rows), json.dumps(calls)],
                       capture_output=True, text=True, env=child_env(**env), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return [tuple(x) for x in json.loads(r.stdout.strip().splitlines()[-1])]


def test_kill_switches(fixture_gluon):
    """ORT_FLASH_GLUON=0: every call plans as in a table without the Gluon kind, from the same
    table. ORT_FLASH_TMA=0 turns off both descriptor kinds: the pointer kernels."""
    calls = GLUON_CALLS + [c for c, _ in OTHER_CALLS]
    rows = _rows(90)
    off = _plans_in_subprocess(rows, calls, ORT_FLASH_GLUON="0")
    assert off == [_kind(_params(**c), _rows(90, gluon=False)) for c in calls]
    assert [k for k, *_ in off[:len(GLUON_CALLS)]] == ["fwd_tma"] * len(GLUON_CALLS)
    no_tma = _plans_in_subprocess(rows, GLUON_CALLS, ORT_FLASH_TMA="0")
    assert {k for k, *_ in no_tma} == {"fwd"}


def test_library_table_gluon_entries():
    """The compiled table's Gluon cubins (none unless the build has sm_90 and GLUON_ENABLED):
    the calls aot/variants.py states, their tile and range, boxes for the launcher to encode,
    whole warpgroups."""
    from ort_flash import _C

    kernels = [k for k in _C.kernels() if k["kind"] == "fwd_gluon"]
    if not any(k["arch"] >= 90 for k in _C.kernels()) or not variants.GLUON_ENABLED:
        assert not kernels
        pytest.skip("this build has no Gluon kernels (no sm_90 or GLUON_ENABLED off)")
    by_name = {x.name: x for x in variants.all_variants()}
    assert {k["variant"] for k in kernels} == {x.name for x in variants.gluon_variants()}
    for k in kernels:
        x = by_name[k["variant"]]
        cfg = variants.get_fwd_config(90, x)
        assert k["arch"] >= 90 and k["dtype"] in ("float16", "bfloat16") and k["even_d"]
        assert not k["extras"] and k["mask_keys"] == (k["mask"] != "none")
        assert k["mask"] == "none" or k["mask"] in variants.GLUON_WS_MASKS.get(k["head_dim"], ())
        assert (k["block_m"], k["block_n"], k["tile_causal"], k["tile_min_len"], k["tile_max_len"]) == (
            cfg.block_m, cfg.block_n, x.tile_causal, x.tile_min_len, x.tile_max_len)
        assert k["num_warps"] % 4 == 0 and k["num_warps"] >= cfg.num_warps
        q_rows, kv_rows = cfg.desc_rows  # a consumer warpgroup's rows in the warp-specialized kernel
        for (swizzle, rows, cols), r in zip(k["tma"], [q_rows, kv_rows, kv_rows, q_rows]):
            assert swizzle == 3 and rows == r and k["head_dim"] % cols == 0


def _one_partition(grids) -> list[tuple]:
    """The one-partition kernel's fp16 cubins in a table built on `grids`: (head dim, causal flag,
    range, BLOCK_M, BLOCK_N, warps, slots)."""
    return sorted((x.head_dim, x.tile_causal, x.tile_min_len, x.tile_max_len, *dataclasses.astuple(
        variants.get_fwd_config(90, x, grids))[:4]) for x in variants.gluon_variants(grids)
        if not x.ws and x.dtype == "fp16")


def test_short_two_slots_candidate():
    """`short-two-slots` splits the one-partition kernel's range at 1024 keys: below it the two-slot
    tiles (d128 64 x 32, d64 64 x 64, one warpgroup), from it the shipped tile; the shipped table and
    the warp-specialized kernel's grids are left as they were, and the candidate's cubin compiles
    for sm_90 without spills in the shared memory of four CTAs an SM."""
    shipped = _one_partition(None)
    assert shipped == [(64, 0, 0, 1024, 128, 64, 8, 4), (64, 1, 0, 2048, 128, 64, 8, 4),
                       (128, 1, 0, 1024, 64, 64, 4, 3)]
    grids = variants.with_candidates("short-two-slots")
    assert _one_partition(grids) == [(64, 0, 0, 1024, 64, 64, 4, 2), (64, 1, 0, 1024, 64, 64, 4, 2),
                                     (64, 1, 1024, 2048, 128, 64, 8, 4), (128, 1, 0, 1024, 64, 32, 4, 2)]
    assert variants.ws_tables(grids)[1] == variants.GLUON_WS_LENGTHS
    assert sorted(x.name for x in variants.gluon_variants(grids) if x.ws) == sorted(
        x.name for x in variants.gluon_variants() if x.ws)
    x = next(x for x in variants.gluon_variants(grids) if not x.ws and (x.dtype, x.head_dim) == ("fp16", 128))
    cfg = variants.get_fwd_config(90, x, grids)
    shared, res, _ = _gluon_sass(x, cfg)
    assert re.search(r"STACK:0 ", res) and re.search(r"LOCAL:0 ", res), res
    # An SM's 228 KB hold four such CTAs (with the 1 KB each the hardware reserves).
    assert cfg.num_warps == 4 and 4 * (shared + 1024) <= 228 * 1024, shared
