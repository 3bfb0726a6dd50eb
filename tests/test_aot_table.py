"""The AOT kernel table and its launch ABI, checked without a GPU: every kernel takes aot/contract.py's
arguments (the generated contract.gen.h packs them for the launcher; tests/test_launch_abi.py checks
them against the cubins), the TMA-descriptor variants (aot/build.py's signatures and recorded boxes,
the table compiled into the library), and the C++ dispatcher over the variant table."""
from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def build():
    pytest.importorskip("triton", reason="aot/build.py imports the kernel sources (Triton)")
    from aot import build as b
    return b


def test_every_kernel_takes_the_contracts_arguments(build):
    """Each kind's kernel function (the Gluon ones too) has aot/contract.py's runtime parameters, in
    order; the build refuses one that has not (its signature says which ABI it breaks)."""
    import inspect

    from aot import contract
    from aot.variants import Variant

    def runtime(fn):
        return tuple(n for n, p in inspect.signature(fn.fn).parameters.items() if "constexpr" not in str(p.annotation))

    for kind in contract.KIND_ABIS:
        fns = [build.kernel_fn(kind)] + ([build.kernel_fn(kind, ws=True)] if kind == "fwd_gluon" else [])
        for fn in fns:
            assert runtime(fn) == contract.runtime_args(kind), (kind, fn)
    v = Variant("fp16", 64, True, "none", False, "tf32", "combine")
    fake = type("Fake", (), {"fn": lambda OPart, Y, LsePart: None})()
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(build.KERNELS, "combine", fake)
        with pytest.raises(RuntimeError, match="not aot/contract.py's Combine ABI"):
            build.signature(v, build.get_fwd_config(90, v))


def test_ordered_args_puts_named_arguments_in_launch_order():
    """aot/contract.py ordered_args (the experiments' launches): a kind's arguments by name in its
    ABI's order; a name it lacks, one left out or None, and one the ABI has not are refused by name."""
    from aot import contract

    names = contract.runtime_args("decode")
    values = {n: i for i, n in enumerate(reversed(names))}
    assert contract.ordered_args("decode", values) == [values[n] for n in names]
    assert contract.stride_args("k", (7, 8, 9, 1)) == dict(stride_kb=7, stride_kh=8, stride_kn=9)
    with pytest.raises(ValueError, match=r"no value for OPart, fused; no parameter Hk"):
        contract.ordered_args("decode", dict({n: 1 for n in names if n != "fused"}, OPart=None, Hk=2))


def test_contract_header_packs_each_abi(tmp_path):
    """contract.gen.h (aot/contract_header.py) compiles on its own, and each ABI struct's pointers()
    is the address of each field in the contract's order, then the two scratch pointers; with
    descriptors the forward ABIs (Fwd, FwdGluon) have each one's map, dims and strides in its
    tensor's place."""
    import shutil
    import subprocess

    from aot import contract, contract_header

    cxx = shutil.which("c++") or shutil.which("g++")
    if not cxx:
        pytest.skip("no C++ compiler")
    contract_header.write(tmp_path)
    lines = ["#include <cstddef>", "#include <cstdio>", '#include "contract.gen.h"', "using namespace ort_flash;",
             "struct Tma { char map[kTmaMapBytes]; int32_t d[kTmaRank]; int64_t s[kTmaRank];",
             "  void push(std::vector<void*>& a) { a.push_back(map); for (auto& x : d) a.push_back(&x);",
             "    for (auto& x : s) a.push_back(&x); } };",
             "template <class A> void show(const char* abi, A& a, const std::vector<void*>& p) {",
             '  std::printf("pack %s", abi);',
             "  for (void* x : p) std::printf(\" %ld\", static_cast<long>(static_cast<char*>(x) - reinterpret_cast<char*>(&a)));",
             '  std::printf("\\n"); }', "int main() {"]
    described = {contract.KIND_ABIS[k] for k in contract.TMA_KINDS}
    assert described == {"Fwd", "FwdGluon"}
    for abi, params in contract.ABIS.items():
        lines += [f"  {{ {abi}Args a; show(\"{abi}\", a, a.pointers({'static_cast<Tma*>(nullptr)' if abi in described else ''}));"]
        lines += [f'    std::printf("field {abi} {n} %ld\\n", static_cast<long>(offsetof({abi}Args, {n})));'
                  for n in [n for n, _ in params] + ["global_scratch", "profile_scratch"]]
        if abi in described:
            lines += [f"    Tma t[kTmaDescriptors]; show(\"{abi}Tma\", a, a.pointers(t));"]
        lines += ["  }"]
    (tmp_path / "t.cc").write_text("\n".join(lines + ["  return 0;", "}"]) + "\n")
    r = subprocess.run([cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-Wno-invalid-offsetof", "-I", str(tmp_path),
                        str(tmp_path / "t.cc"), "-o", str(tmp_path / "t")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    out = [x.split() for x in subprocess.run([str(tmp_path / "t")], capture_output=True, text=True,
                                             check=True).stdout.splitlines()]
    packs = {x[1]: [int(o) for o in x[2:]] for x in out if x[0] == "pack"}
    fields = {(x[1], x[2]): int(x[3]) for x in out if x[0] == "field"}
    for abi, params in contract.ABIS.items():
        names = [n for n, _ in params] + ["global_scratch", "profile_scratch"]
        assert packs[abi] == [fields[(abi, n)] for n in names], abi  # the fields in order, then the scratch
    per_map = 1 + 2 * contract.TMA_RANK
    for abi, kind in (("Fwd", "fwd_tma"), ("FwdGluon", "fwd_gluon")):
        assert len(packs[abi + "Tma"]) == contract.launch_arg_count(kind) + 2
        assert packs[abi + "Tma"][len(contract.TMA_ARGS) * per_map:] == packs[abi][len(contract.TMA_ARGS):]


def test_tma_variants_and_signatures(build):
    from aot.variants import TMA_MIN_ARCH, all_variants, get_fwd_config

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
    from aot.variants import Variant

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

    from aot import variants as variants_mod
    from aot.variants import all_variants

    vs = all_variants()
    names = {v.name for v in vs}
    keys = [v for v in vs if v.mask_keys]
    assert {(v.kind, v.mask) for v in keys} == {(k, m) for k in ("fwd", "fwd_tma") for m in ("bool", "add")} | {
        ("fwd_gluon", m) for ms in variants_mod.GLUON_WS_MASKS.values() for m in ms if variants_mod.GLUON_ENABLED}
    assert len(names) == len(vs)
    for v in keys:
        if v.kind == "fwd":
            assert dataclasses.replace(v, mask_keys=False) in vs
        assert re.search(r"_(add|bool)k(_x)?(_n?c)?(_k\d+|_lt\d+)?$", v.name), v.name


def _variants():
    from aot import variants
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


def test_library_table_carries_the_tile_table():
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


# Every call class the launcher distinguishes, planned by the C++ dispatcher (_C.plan_with_table, no
# GPU) over the full product of the variant table (all_combinations: a variant per combination)
# and over the table the build compiles: merging rare classes into superset variants cost no call
# its kernel, and the hot shapes keep their own.


def _calls():
    """Every forward call class the launcher distinguishes: dtype (fp32: dot precision), head dim
    (exact and not, strides aligned or not), mask kind, key-vector mask, extras."""
    for dtype, prec in (("fp16", "tf32"), ("bf16", "tf32"), ("fp32", "ieee"), ("fp32", "tf32")):
        for d, aligned, mask, keys, extras in itertools.product(
                (16, 32, 48, 64, 80, 128, 160, 256), (True, False), ("none", "bool", "add"),
                (False, True), (False, True)):
            if keys and mask == "none":
                continue
            yield dict(dtype=dtype, prec=prec, d=d, aligned=aligned, mask=mask, keys=keys, extras=extras)


def _plan(call: dict, sq: int, rows: list, arch: int) -> tuple[str, str]:
    """(kind, variant) the dispatcher plans for `call` with `sq` query rows (1: a decode shape)."""
    from ort_flash import _C

    p = _C.FlashParams()
    p.dtype = getattr(_C.DType, {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}[call["dtype"]])
    p.fp32_precision = getattr(_C.Fp32Precision, call["prec"])
    d, row = call["d"], call["d"] if call["aligned"] else call["d"] + 8
    p.batch, p.hq, p.hkv, p.sq, p.skv, p.d, p.dv = 2, 4, 2, sq, 700, d, d
    p.q_stride = p.y_stride = [4 * sq * row, sq * row, row]
    p.k_stride = p.v_stride = [2 * 700 * row, 700 * row, row]
    p.q = p.k = p.v = p.y = 1 << 20
    p.scale = 0.1
    p.mask_kind = getattr(_C.MaskKind, call["mask"])
    if call["mask"] != "none":
        p.mask, p.mask_len = 1 << 20, 700
        p.mask_stride = [700 * sq, 0, 0 if call["keys"] else 700, 1]
    if call["extras"]:
        p.softcap = 30.0
    kind, name, *_ = _C.plan_with_table(p, rows, arch=arch, tensor_maps=False)
    return kind, name


@pytest.mark.parametrize("arch", (80, 90))
def test_every_call_class_finds_a_kernel(arch):
    """What a build without merged classes ran on CUDA still runs, as the same kind: every call
    class finds a variant, the same one where it is still compiled; fp16/bf16 at exact head dims 64
    and 128 always their own; a superset otherwise (extras or a masked head dim, never the reverse)."""
    from _table_rows import table_rows

    v = _variants()
    by_name = {x.name: x for x in v.all_combinations()}
    now = table_rows(arch, gluon=False)
    before = table_rows(arch, gluon=False, combinations=True)
    compiled = {r["variant"] for r in now}
    assert compiled < {r["variant"] for r in before}  # merging removed variants and added none
    checked = 0
    for call in _calls():
        for sq in (300, 1):
            (kind_old, old), (kind_new, new) = _plan(call, sq, before, arch), _plan(call, sq, now, arch)
            assert old and new and kind_old == kind_new, (call, sq, old, new)
            old, new = by_name[old], by_name[new]
            if old.name in compiled or (call["dtype"] != "fp32" and call["d"] in (64, 128) and call["aligned"]):
                assert new == old, (call, sq, old.name, new.name)
            assert (new.extras or not call["extras"]) and (new.even_d <= old.even_d), (call, new)
            assert (new.dtype, new.head_dim, new.mask) == (old.dtype, old.head_dim, old.mask)
            checked += 1
    assert checked > 1000


def _decode_call(b: int, hq: int, hkv: int, sq: int, skv: int):
    """FlashParams of an fp16 d128 causal decode call on contiguous (B, H, S, D) tensors."""
    from ort_flash import _C

    p = _C.FlashParams()
    p.dtype, p.causal, p.scale = _C.DType.float16, True, 0.1
    p.batch, p.hq, p.hkv, p.sq, p.skv, p.d, p.dv = b, hq, hkv, sq, skv, 128, 128
    p.q_stride = p.y_stride = [hq * sq * 128, sq * 128, 128]
    p.k_stride = p.v_stride = [hkv * skv * 128, skv * 128, 128]
    p.q = p.k = p.v = p.y = 1 << 20
    return p


def test_the_dispatcher_fuses_the_merge_by_merge_round_trips():
    """Whether the split kernel merges its own partials (cpp/decode_heuristics.cc fuse_combine, which
    counts round trips with its own formula over contract.gen.h's merge tiles) is decided by
    aot/flash_decode.py's merge_round_trips (the tile the kernel takes, tests/test_kernel_interpreter.py):
    fused iff 1 < splits <= kMaxFusedSplits (32) and the round trips of a row block (GQA group x Sq
    packed rows, at most the decode tile's block_m) are at most kMaxFusedRoundTrips (2). Over every
    (GQA group, Sq) of a decode call (up to kMaxDecodeRows packed rows) at every KV split count up to
    kMaxSplits (one CTA per SM: the split count is the keys' / 128), and over calls whose splits the
    cost model picks on 132 SMs."""
    import os

    from _table_rows import table_rows

    from aot import contract
    from aot.flash_decode import merge_round_trips
    from ort_flash import _C

    if os.environ.get("ORT_FLASH_DECODE_SPLITS") or os.environ.get("ORT_FLASH_FUSED_COMBINE"):
        pytest.skip("the launcher's decode switches are set in this process")
    rows = [r for r in table_rows(90) if r["kind"] in (contract.KIND_CODES["decode"], contract.KIND_CODES["combine"])]
    block_m = {r["variant"]: r["block_m"] for r in rows}

    def check(b, hq, hkv, sq, skv, sms):
        kind, variant, splits, fused = _C.merge_with_table(_decode_call(b, hq, hkv, sq, skv), rows, sm_count=sms)
        packed = min(block_m[variant], hq // hkv * sq)
        want = 1 < splits <= 32 and merge_round_trips(packed, splits) <= 2
        assert kind == "decode" and fused == want, (b, hq, hkv, sq, skv, splits, fused)
        return splits, fused

    seen = set()
    shapes = [(g, sq) for sq in range(1, contract.MAX_DECODE_SQ + 1) for g in range(1, contract.MAX_DECODE_ROWS // sq + 1)]
    for g, sq in shapes:
        for splits in range(1, 129):
            assert check(1, g, 1, sq, 128 * splits, 1 << 20)[0] == splits, (g, sq, splits)
    for b, hkv, skv in ((1, 8, 4096), (1, 8, 32768), (4, 8, 4096), (8, 2, 20000), (1, 1, 65536), (16, 8, 1000)):
        for g, sq in shapes:
            seen.add(check(b, g * hkv, hkv, sq, skv, 132))
    assert {f for _, f in seen} == {True, False} and len({s for s, _ in seen}) > 10, seen


def test_info_says_when_no_cuda_kernels_are_compiled(monkeypatch):
    """A CPU-only build's `ort-flash info` says in a sentence that no CUDA kernels are compiled
    and how to build them (it stopped mid-sentence at 'for ')."""
    import ort_flash._library as library
    from ort_flash import info

    fake = SimpleNamespace(kernels=lambda: [], triton_version=lambda: "3.6.0")
    monkeypatch.setattr(library, "load_extension", lambda: fake)
    text = info.format_info()
    line = next(x for x in text.splitlines() if x.startswith("kernels:"))
    assert "no CUDA kernels are compiled" in line and "ORT_FLASH_CUDA_ARCHS" in line
    assert line.endswith(".") and "pip install ." in line and "for \n" not in text


def _fake_compile(job):
    import time as _time
    v, arch, cfg, _ = job
    return dict(variant=v.name, arch=arch, cached=job[3] == "cached", stage_s={"cubin": 0.01},
                at=_time.monotonic())


def test_compile_pool_runs_longest_first_and_reports_progress(build, capsys):
    """The build starts the costliest kernels first (so the last to finish are short and no core
    idles at the end), skips cached ones, returns metas in job order, and prints one progress line
    per compiled kernel (done / total, elapsed, estimate)."""
    from aot import compile_pool
    from aot.variants import all_variants, get_fwd_config

    vs = [v for v in all_variants() if v.kind in ("fwd", "combine")][:40]
    fresh = [i % 5 != 0 for i in range(len(vs))]
    jobs = [(v, 80, get_fwd_config(80, v), "new" if f else "cached") for v, f in zip(vs, fresh)]
    metas = compile_pool.compile_all(jobs, fresh, _fake_compile, 1)
    assert [m["variant"] for m in metas] == [v.name for v in vs] and all(m is not None for m in metas)
    ran = sorted((m["at"], compile_pool.estimated_cost(v, 80, jobs[i][2]))
                 for i, (m, v) in enumerate(zip(metas, vs)) if fresh[i])
    assert [c for _, c in ran] == sorted((c for _, c in ran), reverse=True)
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("aot: [")]
    n = sum(fresh)
    assert len(lines) == n and lines[-1].startswith(f"aot: [{n}/{n}]") and "elapsed, ~" in lines[0]
    assert f"compiling {n} CUDA kernels ({len(jobs) - n} cached)" in err
    assert compile_pool.available_cpus() >= 1


def test_hot_variants_keep_their_code():
    """The hot shapes (fp16/bf16 at exact head dims 64 and 128, every TMA variant, the combine
    kernels) are compiled exactly as without merging: every combination, the same tiles, no
    EDGE_LOOP; merged classes are the others only, but for the rare-class variants kept exact
    (variants.kept_exact: fp16/bf16 unmasked, and masked at head dim 256)."""
    v = _variants()
    now = {x.name: x for x in v.all_variants()}
    for x in v.all_combinations():
        if x.kind in v.GQA_KINDS or x.kind in v.SINK_KINDS:  # not attention: test_gqa_prepare_variants,
            continue                                            # test_sink_rescale_kernel
        hot = x.kind in ("fwd_tma", "combine") or (x.dtype != "fp32" and x.head_dim in (64, 128) and x.even_d)
        assert hot <= (x.name in now), x.name
        if hot:
            assert not v.edge_loop(x) and all(v.get_fwd_config(a, x) == v.get_fwd_config(a, now[x.name])
                                              for a in (80, 90))
        elif x.name in now and v.kept_exact(x):
            # Compiled as before the merge (its superset measured slower): own code, no EDGE_LOOP.
            assert not v.edge_loop(x) and not x.extras and x.dtype != "fp32", x.name
            assert x.mask == "none" or (x.head_dim == 256 and x.even_d), x.name
        elif x.name in now:
            assert v.edge_loop(x) and x.extras, x.name


def test_triton_cache_keys_tell_variants_apart():
    """Triton's compile cache keys a source by its constexpr values in argument order, not by
    name: two variants naming different constexprs with the same values share a key, and the
    second compiled in a process (or a machine's shared Triton cache) gets the first one's cubin.
    Every pair of build jobs (variant, arch) with one key compiles the same source: the same
    constexprs by name, signature and options."""
    import collections

    from aot import build, variants

    groups = collections.defaultdict(set)
    for arch in (80, 90):
        for v in variants.all_variants():
            if arch < v.min_arch:
                continue
            src, options, _, sig, constexprs = build.triton_source(v, arch, variants.get_fwd_config(arch, v))
            groups[(arch, src.hash(), tuple(sorted(options.items())))].add(
                (tuple(sorted(constexprs.items())), tuple(sorted(sig.items()))))
    assert groups and all(len(g) == 1 for g in groups.values()), [g for g in groups.values() if len(g) > 1][:2]


def test_gqa_prepare_variants():
    """GroupQueryAttention's prepare kernels: one cubin per (kind, dtype, BLOCK_D) for every arch,
    never merged, BLOCK_D 64, 128 and the CUDA op's largest head size, rows per CTA about
    GQA_ELEMENTS elements, the three kinds one function (one ABI) in three modes."""
    from aot import build
    from aot import variants as v

    g = [x for x in v.all_variants() if x.kind in v.GQA_KINDS]
    assert g == v.gqa_variants() and [x for x in v.all_combinations() if x.kind in v.GQA_KINDS] == g
    assert sorted((x.kind, x.dtype, x.head_dim) for x in g) == sorted(
        (k, t, hd) for k in v.GQA_KINDS for t in v.GQA_DTYPES for hd in (64, 128, 256))
    assert v.GQA_HEAD_DIMS[-1] == 256 and all(x.min_arch == 0 and not v.edge_loop(x) for x in g)
    assert all(build.KERNELS[k] is build.KERNELS["gqa_prepare"] for k in v.GQA_KINDS)
    from aot import contract  # codes are append-only: the compaction came after sink_rescale, the shift after it
    assert contract.KIND_CODES["gqa_compact"] == 11 and contract.KIND_CODES["gqa_shift"] == 12
    assert len(contract.ENUMS["KernelKind"]) == 13
    for x in g:
        src, _, _, sig, constexprs = build.triton_source(x, 90, v.get_fwd_config(90, x))
        cfg = v.get_fwd_config(90, x)
        rows, gather = cfg.block_m, cfg.block_n
        # gqa_prepare: 4096 elements a CTA, its general path 512 at a time; the copies and the
        # shift: 2048
        assert rows * x.head_dim == (4096 if x.kind == "gqa_prepare" else 2048), x.name
        assert gather == min(rows, 512 // x.head_dim) and rows % gather == 0 and cfg.num_warps == 4
        assert x.name == f"{x.kind}_{x.dtype}_d{x.head_dim}" and cfg == v.get_fwd_config(80, x)
        assert constexprs == {"BLOCK_ROWS": rows, "BLOCK_D": x.head_dim, "GATHER_ROWS": gather,
                              "MODE": v.GQA_KINDS.index(x.kind)}
        assert sig["Seqlens"] == "*i32" and sig["Totals"] == sig["PositionIds"] == "*i64" and sig["KeyMask"] == "*i8"
        assert sig["Q"] == sig["PresentK"] == sig["StageK"] == sig["Cos"] == {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}[x.dtype]
