"""What the GPU would receive, checked with no GPU: the launcher's grids, blocks, shared memory,
TMA descriptors and every kernel parameter, by name, against the call.

cpp/cuda_launch.cc runs here over a fake CUDA driver (tests/fake_cuda/fake_libcuda.c, via
tests/_fake_cuda.py). The fake loads this build's real cubins, lays each launch's parameters
out by the cubin's own parameter table (offsets and sizes from its .nv.info section, as the
driver does) and refuses what the driver would refuse (a cubin for another SM, a block other
than the kernel's required one, a grid or shared memory over the limits). The tests decode
that buffer by the kernels' signatures (aot/build.py's launch ABI) and compare each value with
what the call asks for, for every kind of forward kernel this build has (the Gluon ones, TMA,
pointer, split-KV decode and its merge; the entries aot/variants.py's candidate grids would add,
launched with this build's cubins), the per-stream counters, the errors the launcher
gives instead of launching, and which compiled arch serves which device (the loader and
`ort-flash info` alike). The GPU suite checks that the kernels compute the right thing
from these arguments; this checks the arguments on every CI run.
"""
from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

import _fake_cuda  # noqa: E402
from _paths import child_env  # noqa: E402

from aot import contract  # noqa: E402

_C = pytest.importorskip("ort_flash._C", reason="the native module is not built")
KERNELS = _C.kernels()
ARCHS = sorted({e["arch"] for e in KERNELS})
pytestmark = [
    pytest.mark.skipif(not KERNELS, reason="a CPU-only build (ORT_FLASH_CUDA_ARCHS empty): no CUDA kernels to launch"),
    pytest.mark.skipif(_fake_cuda.compiler() is None, reason="no C compiler to build the fake CUDA driver"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fake driver is an ELF shared library"),
]
ARCH = 90 if 90 in ARCHS else (ARCHS[-1] if ARCHS else 0)
SMS = 132
CALLS_STREAM = 7  # the stream the calls run on where a test names none
COUNTER_SLOT = contract.COUNTER_SLOT_BYTES
TILE_COUNTERS = contract.TILE_COUNTER_OFFSET
TMA_KINDS = contract.TMA_KINDS


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return _fake_cuda.build(tmp_path_factory.mktemp("fake_cuda"))


def _run(driver, tmp_path, calls, rows=None, **env):
    env = {"FAKE_CUDA_ARCH": str(ARCH), "FAKE_CUDA_SMS": str(SMS), **env}
    return _fake_cuda.run(driver, tmp_path / "cuda.log", calls, env, rows)


def params(b=2, hq=8, hkv=2, sq=1000, skv=1000, d=128, dv=None, dtype="float16", layout="bhsd", **kw) -> dict:
    """A call's FlashParams fields, with distinct 256-byte aligned fake device pointers."""
    dv = d if dv is None else dv
    if layout == "bshd":
        qs, ys = [sq * hq * d, d, hq * d], [sq * hq * dv, dv, hq * dv]
        ks, vs = [skv * hkv * d, d, hkv * d], [skv * hkv * dv, dv, hkv * dv]
    else:
        qs, ys = [hq * sq * d, sq * d, d], [hq * sq * dv, sq * dv, dv]
        ks, vs = [hkv * skv * d, skv * d, d], [hkv * skv * dv, skv * dv, dv]
    p = dict(dtype=dtype, batch=b, hq=hq, hkv=hkv, sq=sq, skv=skv, d=d, dv=dv, q_stride=qs, k_stride=ks,
             v_stride=vs, y_stride=ys, q=0x10000000, k=0x20000000, v=0x30000000, y=0x40000000,
             lse=0x50000000, scale=0.0883883)
    p.update(kw)
    return p


def key_mask(p: dict, kind: str) -> dict:
    """A (B, 1, 1, S) padding mask: one key vector per batch."""
    return dict(p, mask_kind=kind, mask=0x60000000, mask_stride=[p["skv"], 0, 0, 1], mask_len=p["skv"])


def bounded(p: dict, bound: int = 0x70000000) -> dict:
    """A GroupQueryAttention first prompt's rows: a key bound per batch row (FlashParams::key_bound,
    positions kept) beside the bool key mask that states the same keys."""
    return dict(key_mask(p, "bool"), key_bound=bound)


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def abi_names(kind: str) -> list[tuple[str, str]]:
    """A kind's launch parameters as aot/contract.py states them, (name, type) in launch order: each
    TMA tensor as its map, TMA_RANK dims and TMA_RANK strides, then Triton's two scratch pointers."""
    rank = contract.TMA_RANK
    names = []
    for name, typ in contract.ABIS[contract.KIND_ABIS[kind]]:
        if kind in TMA_KINDS and name in contract.TMA_ARGS:
            names += ([(f"{name}.map", "map")] + [(f"{name}.dim{i}", "i32") for i in range(rank)]
                      + [(f"{name}.stride{i}", "i64") for i in range(rank)])
        else:
            names.append((name, typ))
    return names + [("global_scratch", "ptr"), ("profile_scratch", "ptr")]


def decode_params(names: list[tuple[str, str]], raw: list[bytes]) -> dict:
    """Each parameter's value by its contract type; fails where the cubin's size is not the type's."""
    assert len(names) == len(raw), f"the launcher's ABI has {len(names)} parameters, the cubin {len(raw)}"
    out = {}
    for (name, typ), b in zip(names, raw):
        if typ == "map":
            size, (magic, index) = contract.TMA_MAP_BYTES, struct.unpack_from("<QQ", b)
            assert magic == _fake_cuda.MAP_MAGIC, f"{name} is not a map cuTensorMapEncodeTiled wrote"
            value = ("map", index)
        elif typ.startswith("ptr") or typ == "i64":
            size, value = 8, struct.unpack("<q", b)[0]
        elif typ == "f32":
            size, value = 4, struct.unpack("<f", b)[0]
        else:
            size, value = 4, struct.unpack("<i", b)[0]
        assert len(b) == size, f"parameter {name}: the cubin takes {len(b)} bytes, its ABI type {size}"
        out[name] = value
    return out


def table_entries(arch: int) -> list[dict]:
    """The entries a device of `arch` loads, in load order (cpp/kernel_registry.cc)."""
    return [e for e in KERNELS if e["arch"] == arch]


class Log:
    """One child's driver log: its modules, functions and each call's events."""

    def __init__(self, events: list[dict], arch: int = ARCH):
        assert not [e for e in events if e["ev"] == "error"], [e for e in events if e["ev"] == "error"]
        loads = [e for e in events if e["ev"] == "load"]
        entries = table_entries(arch)
        if loads:
            assert len(loads) == len(entries) and all(m["arch"] == arch for m in loads)
        self.entry_of_module = {m["module"]: entries[i] for i, m in enumerate(loads)}
        self.functions = {e["function"]: e for e in events if e["ev"] == "function"}
        self.encodes = {e["index"]: e for e in events if e["ev"] == "encode"}
        self.attrs = [e for e in events if e["ev"] == "attr"]
        self.calls = _fake_cuda.per_call(events)
        allocs = [e for e in events if e["ev"] == "alloc" and e["stream"] is None]
        self.counters = allocs[0]["ptr"] if allocs else 0
        # Each stream's counter set: the one zeroed on it (cpp/cuda_launch.cc stream_counters).
        self.slots = {}
        for e in events:
            if e["ev"] == "memset" and e["bytes"] == COUNTER_SLOT:
                assert e["stream"] not in self.slots, f"stream {e['stream']}'s counters zeroed twice"
                assert e["value"] == 0 and (e["dst"] - self.counters) % COUNTER_SLOT == 0
                self.slots[e["stream"]] = e["dst"]

    def launches(self, i: int) -> list[tuple[dict, dict, dict]]:
        """Call i's launches: (launch, the entry whose cubin it ran, its parameters by name)."""
        out = []
        for ev in self.calls[i]:
            if ev["ev"] != "launch":
                continue
            fn = self.functions[ev["function"]]
            entry = self.entry_of_module[fn["module"]]
            names = abi_names(entry["kind"])
            out.append((ev, entry, decode_params(names, _fake_cuda.param_bytes(ev, fn))))
        return out


def _fwd_expected(p: dict, e: dict, counters: int, bounded: bool | None = None) -> dict:
    """The parameters entry `e` must get for call `p`. A call with a key bound runs bounded (the
    unmasked twin, has_seqlens 2) on an unmasked Gluon entry, else with its mask (`bounded`: which,
    where `e` is not the entry that ran)."""
    b, hq, hkv, sq, skv = (p[k] for k in ("batch", "hq", "hkv", "sq", "skv"))
    seqlens, lse = p.get("seqlens_k", 0), p.get("lse", 0)
    has_seqlens = int(bool(seqlens))
    if bounded is None:
        bounded = e["kind"] == "fwd_gluon" and e["mask"] == "none"
    if p.get("key_bound"):
        if bounded:  # the unmasked twin, bounded per row
            p = {k: v for k, v in p.items() if k not in ("mask", "mask_kind", "mask_stride", "mask_len")}
            seqlens, has_seqlens = p["key_bound"], 2
        else:  # any other kernel reads the mask, without the bound
            assert not seqlens
    x = {"Lse": lse, "Mask": p.get("mask", 0), "SeqlensK": seqlens, "scale": f32(p["scale"]),
         "softcap": f32(p.get("softcap", 0.0)), "Hq": hq, "group": hq // hkv, "Sq": sq, "Skv": skv,
         "D": p["d"], "Dv": p["dv"], "offset": p.get("offset", 0), "causal": int(p.get("causal", False)),
         "window_left": p.get("window_left", -1), "window_right": p.get("window_right", -1),
         "mask_len": p["mask_len"] if p.get("mask_kind", "none") != "none" else skv,
         "has_seqlens": has_seqlens, "store_lse": int(bool(lse)), "global_scratch": 0, "profile_scratch": 0}
    ms = p.get("mask_stride", [0, 0, 0, 1])
    for t, s in zip("qkvy", ("q_stride", "k_stride", "v_stride", "y_stride")):
        for j, dim in enumerate(("b", "h", "m" if t in "qy" else "n")):
            x[f"stride_{t}{dim}"] = p[s][j]
    x.update(stride_mb=ms[0], stride_mh=ms[1], stride_mm=ms[2])
    # The Gluon kernels' own argument (the FwdGluon ABI's): a dynamic-tile kernel's counter pair,
    # its stream's (none on a stream without a set: it then takes its tiles round robin).
    x["TileCounter"] = counters + TILE_COUNTERS if e["dynamic"] and counters else 0
    # and Q's rotary, applied as Q loads (FlashParams::rotary_half; 0 and null pointers without it)
    x.update(Cos=p.get("rotary_cos", 0), Sin=p.get("rotary_sin", 0), rotary_half=p.get("rotary_half", 0),
             max_position=p.get("max_position", 0))
    views = {"Q": (p["q"], hq, sq, p["d"], p["q_stride"]), "K": (p["k"], hkv, skv, p["d"], p["k_stride"]),
             "V": (p["v"], hkv, skv, p["dv"], p["v_stride"]), "Y": (p["y"], hq, sq, p["dv"], p["y_stride"])}
    for i, (t, (ptr, h, s, d, st)) in enumerate(views.items()):
        if e["kind"] not in TMA_KINDS:
            x[t] = ptr
            continue
        x.update({f"{t}.dim{j}": v for j, v in enumerate((b, h, s, d))})
        x.update({f"{t}.stride{j}": v for j, v in enumerate((*st, 1))})
        swizzle, rows, cols = e["tma"][i]
        x[f"{t}.map"] = {"dtype": 9 if p["dtype"] == "bfloat16" else 6, "rank": 4, "address": ptr,
                         "dims": [d, s, h, b], "strides": [st[2] * 2, st[1] * 2, st[0] * 2],
                         "box": [cols, rows, 1, 1], "elem_strides": [1, 1, 1, 1], "interleave": 0,
                         "swizzle": swizzle, "l2": 2, "oob": 0}
    return x


def check_fwd_launch(p: dict, log: Log, i: int, stream: int = CALLS_STREAM, entry: dict | None = None) -> dict:
    """Call i ran one forward kernel with exactly the arguments `p` asks for; returns its entry
    (`entry`: the table entry it ran, where the table is not the build's: launched with the
    cubin of the build's entry of the same name as its "cubin_of")."""
    (ev, e, got), = log.launches(i)
    if entry is not None:
        assert e["variant"] == entry["cubin_of"]
        e = entry
    want = _fwd_expected(p, e, log.slots.get(stream, 0))
    for name, value in got.items():
        if name.endswith(".map"):
            enc = {k: v for k, v in log.encodes[value[1]].items() if k != "index" and k != "ev"}
            assert enc == want[name], f"{e['variant']}: the {name[0]} descriptor"
        else:
            assert value == want[name], f"{e['variant']}: parameter {name} is {value}, expected {want[name]}"
    tiles_m = math.ceil(p["sq"] / e["block_m"])
    bh = p["batch"] * p["hq"]
    grid = [min(tiles_m * bh, e["persistent"] * SMS), 1, 1] if e["persistent"] else [tiles_m, bh, 1]
    assert ev["grid"] == grid and ev["block"] == [32 * e["num_warps"], 1, 1] and ev["shared"] == e["shared"]
    assert ev["stream"] == stream and ev["call"] == "cuLaunchKernel"
    return e


# (what the call is, its FlashParams, the kind of kernel it must run on sm_90 / sm_80 builds)
FWD_CALLS = [
    ("gqa d128 fp16", params(), "fwd_gluon"),
    ("bf16 d64", params(dtype="bfloat16", d=64), "fwd_gluon"),
    ("odd lengths causal d64", params(sq=113, skv=203, d=64, causal=True), "fwd_gluon"),
    ("causal offset", params(sq=1000, skv=1300, causal=True, offset=300), "fwd_gluon"),
    ("mqa d64 N4096", params(hq=8, hkv=1, sq=4096, skv=4096, d=64), "fwd_gluon"),
    ("long causal bf16", params(b=1, hq=16, hkv=16, sq=16384, skv=16384, dtype="bfloat16", causal=True), "fwd_gluon"),
    ("long d128 N16k", params(b=1, hq=16, hkv=16, sq=16384, skv=16384), "fwd_gluon"),
    ("bshd causal", params(layout="bshd", sq=300, skv=333, causal=True), "fwd_gluon"),
    ("no lse", params(lse=0), "fwd_gluon"),
    ("bool key mask d128", key_mask(params(), "bool"), "fwd_gluon"),
    ("additive key mask d64", key_mask(params(d=64, sq=3000, skv=3000), "add"), "fwd_gluon"),
    # A GroupQueryAttention first prompt of several rows: the unmasked Gluon kernel bounding each
    # row's keys (one-partition at d128 below 1024 keys, the dynamic warp-specialized grid from
    # 2048 at d64), the mask where no Gluon kernel takes the call.
    ("key bound d128 causal", bounded(params(b=3, sq=700, skv=900, causal=True)), "fwd_gluon"),
    ("key bound d64 causal N3000", bounded(params(b=3, d=64, sq=3000, skv=3100, causal=True)), "fwd_gluon"),
    ("key bound bf16 d128 N2000", bounded(params(b=2, dtype="bfloat16", sq=2000, skv=2048, causal=True)),
     "fwd_gluon"),
    ("key bound fp32", bounded(params(b=3, d=64, sq=100, skv=128, dtype="float32", causal=True)), "fwd"),
    ("key bound d80", bounded(params(b=3, d=80, sq=100, skv=128, causal=True)), "fwd"),
    ("softcap", params(softcap=30.0), "fwd_tma"),
    ("window", params(window_left=64, window_right=0), "fwd_tma"),
    ("nonpad_kv_seqlen", params(seqlens_k=0x70000000, causal=True), "fwd_tma"),
    ("full additive mask", dict(params(), mask_kind="add", mask=0x60000000, mask_stride=[8000000, 0, 1000, 1],
                                mask_len=1000), "fwd"),
    ("fp32", params(dtype="float32"), "fwd"),
    ("head dim 80", params(d=80), "fwd"),
    ("d128 dv64", params(d=128, dv=64), "fwd"),
    ("unaligned base", params(q=0x10000008), "fwd"),
]


@pytest.fixture(scope="module")
def fwd_run(driver, tmp_path_factory):
    calls = [{"params": p, "stream": CALLS_STREAM} for _, p, _ in FWD_CALLS]
    results, events = _run(driver, tmp_path_factory.mktemp("fwd"), calls)
    return results, Log(events)


@pytest.mark.parametrize("i", range(len(FWD_CALLS)), ids=[c[0] for c in FWD_CALLS])
def test_forward_launch_arguments(fwd_run, i):
    """Each forward call launches the planned variant's cubin with its grid, block and shared
    memory, and every parameter (descriptors included) as the call asks."""
    results, log = fwd_run
    what, p, kind = FWD_CALLS[i]
    r = results[i]
    assert r["error"] is None, r["error"]
    want_kind = kind if ARCH == 90 else "fwd"
    assert r["plan"][0] == want_kind, f"{what}: planned {r['plan']}"
    e = check_fwd_launch(p, log, i)
    assert e["variant"] == r["variant"] and e["kind"] == want_kind
    if p.get("key_bound") and want_kind == "fwd_gluon":  # bounded: the unmasked cubin
        assert e["mask"] == "none", f"{what}: ran {e['variant']}"


def _entry_call(e: dict) -> dict:
    """A call inside a Gluon entry's table range (its mask, dtype, head dim, causal flag, lengths)."""
    n = e["tile_min_len"] + 333 if e["tile_min_len"] else (e["tile_max_len"] - 333 if e["tile_max_len"] else 1500)
    p = params(b=1, hq=6, hkv=2, sq=n, skv=n, d=e["head_dim"], dtype=e["dtype"], causal=bool(e["tile_causal"]))
    return key_mask(p, e["mask"]) if e["mask"] != "none" else p


GLUON_ENTRIES = [e for e in KERNELS if e["arch"] == ARCH and e["kind"] == "fwd_gluon"]


@pytest.fixture(scope="module")
def gluon_run(driver, tmp_path_factory):
    calls = [{"params": _entry_call(e), "stream": CALLS_STREAM} for e in GLUON_ENTRIES]
    results, events = _run(driver, tmp_path_factory.mktemp("gluon"), calls)
    return results, Log(events)


@pytest.mark.parametrize("i", range(len(GLUON_ENTRIES)), ids=[e["variant"] for e in GLUON_ENTRIES])
def test_every_gluon_entry(gluon_run, i):
    """Each Gluon entry of the table runs the calls of its range, with their arguments."""
    results, log = gluon_run
    e = GLUON_ENTRIES[i]
    assert results[i]["error"] is None, results[i]["error"]
    assert results[i]["variant"] == e["variant"], f"a call in {e['variant']}'s range planned {results[i]['variant']}"
    assert check_fwd_launch(_entry_call(e), log, i)["variant"] == e["variant"]


def test_module_load(fwd_run):
    """Every cubin of the device's arch loads (the fake checks the ELF and its SM), its kernel is
    found by name (with its parameter table), and each one over 48 KiB of shared memory is allowed
    exactly what its entry says it uses."""
    _, log = fwd_run
    assert len(log.functions) == len(log.entry_of_module) == len(table_entries(ARCH))
    for fn in log.functions.values():
        e = log.entry_of_module[fn["module"]]
        assert fn["params"], e["variant"]
        attrs = [a["value"] for a in log.attrs if a["function"] == fn["function"] and a["attr"] == 8]
        assert attrs == ([e["shared"]] if e["shared"] > 48 * 1024 else []), e["variant"]


DECODE_CALLS = [
    ("split gqa", params(b=1, hq=32, hkv=8, sq=1, skv=8192)),
    ("split mqa sq4", params(sq=4, skv=3000, hq=8, hkv=1, d=64)),
    ("split bf16 no lse", params(b=3, hq=16, hkv=4, sq=1, skv=20000, dtype="bfloat16", lse=0)),
]


@pytest.mark.parametrize("streams,pdl_env", [((11, 11, 12, 13), None), ((21, 21, 21, 13), "0")],
                         ids=["three streams", "one stream, ORT_FLASH_PDL=0"])
def test_decode_launch_arguments(driver, tmp_path, streams, pdl_env):
    """The split-KV decode: its partials in the workspace run_cuda allocates on the stream, each
    stream's merge counters (zeroed on the stream before its first use), and the merge: fused
    into the split kernel where the plan says so, else (the plan's choice, or a stream first
    seen capturing a graph, 13, which has no counters) the combine kernel's own launch on the
    same outputs."""
    calls = [{"params": p, "stream": s} for (_, p), s in zip(DECODE_CALLS + DECODE_CALLS[:1], streams)]
    results, events = _run(driver, tmp_path, calls, FAKE_CUDA_CAPTURING="13",
                           **({"ORT_FLASH_PDL": pdl_env} if pdl_env else {}))
    log = Log(events)
    seen = set()
    for i, ((what, p), s) in enumerate(zip(DECODE_CALLS + DECODE_CALLS[:1], streams)):
        assert results[i]["error"] is None and results[i]["plan"][0] == "decode", (what, results[i])
        _, splits, ws_bytes, fused_plan = results[i]["plan"]
        assert splits > 1, f"{what}: expected a split-KV plan"
        fused = fused_plan and s != 13
        evs = log.calls[i]
        launches = log.launches(i)
        ev, e, got = launches[0]
        assert e["kind"] == "decode" and e["variant"] == results[i]["variant"]
        alloc, = [x for x in evs if x["ev"] == "alloc"]
        assert alloc["bytes"] == ws_bytes and alloc["stream"] == s
        parts = p["batch"] * p["hq"] * p["sq"] * splits
        assert got["OPart"] == alloc["ptr"] and got["LsePart"] == alloc["ptr"] + -(-parts * p["dv"] * 4 // 256) * 256
        memsets = [x["stream"] for x in evs if x["ev"] == "memset"]
        assert memsets == ([s] if fused and s not in seen else []), f"{what}: a stream's counters are zeroed once"
        seen |= {s} if fused else set()
        assert got["Counter"] == (log.slots[s] if fused else 0) and got["fused"] == int(fused)
        assert got["num_splits"] == splits
        common = _fwd_expected(p, dict(e, persistent=0, dynamic=False, kind="fwd"), 0)
        for name in set(got) & set(common):
            assert got[name] == common[name], f"{what}: {name}"
        m_blocks = math.ceil(p["sq"] * (p["hq"] // p["hkv"]) / e["block_m"])
        assert ev["grid"] == [splits, p["batch"] * p["hkv"], m_blocks] and ev["stream"] == s
        assert ev["block"] == [32 * e["num_warps"], 1, 1] and ev["shared"] == e["shared"]
        # Programmatic dependent launch where the cubin waits for it (sm_90 decode), unless turned off.
        pdl = e["pdl"] and pdl_env != "0"
        assert (ev["call"], ev["pdl"]) == (("cuLaunchKernelEx", 1) if pdl else ("cuLaunchKernel", 0))
        # The workspace is freed on the stream after the last kernel that reads it.
        assert [x["ev"] for x in evs if x["ev"] in ("launch", "free")][-1] == "free"
        if fused:
            assert len(launches) == 1
            continue
        (cev, ce, cgot), = launches[1:]
        assert ce["kind"] == "combine" and cev["grid"] == [p["batch"] * p["hq"] * p["sq"], 1, 1] and cev["stream"] == s
        assert cev["block"] == [32 * ce["num_warps"], 1, 1] and (cev["call"], cev["pdl"]) == ("cuLaunchKernel", 0)
        assert (cgot["OPart"], cgot["LsePart"], cgot["Y"], cgot["Lse"]) == (got["OPart"], got["LsePart"], p["y"], p.get("lse", 0))
        assert (cgot["Hq"], cgot["Sq"], cgot["Dv"], cgot["num_splits"], cgot["store_lse"]) == (
            p["hq"], p["sq"], p["dv"], splits, int(bool(p.get("lse", 0))))
        assert [cgot[f"stride_y{x}"] for x in "bhm"] == p["y_stride"]
    assert 13 not in log.slots and len(set(log.slots.values())) == len(log.slots)


def test_sm80_device(driver, tmp_path):
    """An sm_80 device loads the sm_80 cubins only (the fake refuses others) and runs the pointer
    kernels, with the same arguments."""
    if 80 not in ARCHS:
        pytest.skip("no sm_80 kernels in this build")
    calls = [{"params": p, "stream": CALLS_STREAM} for _, p, _ in FWD_CALLS[:4]]
    results, events = _run(driver, tmp_path, calls, FAKE_CUDA_ARCH="80", FAKE_CUDA_SMS="108")
    log = Log(events, arch=80)
    for i, (_, p, _) in enumerate(FWD_CALLS[:4]):
        assert results[i]["error"] is None and results[i]["plan"][0] == "fwd"
        e = check_fwd_launch(p, log, i)
        assert e["arch"] == 80


@pytest.mark.parametrize("env,call,message", [
    ({"FAKE_CUDA_ARCH": "75"}, params(), "has no FlashAttention kernels in this build"),
    ({"FAKE_CUDA_SMEM": str(99 * 1024)}, params(), "bytes of shared memory, the device allows 101376"),
    ({}, params(b=1, hq=65536, hkv=1, sq=1000, skv=64, d=64), "exceeds the CUDA grid limit of 65535"),
    ({"FAKE_CUDA_CAPTURING": "7"}, params(), "cannot be loaded during CUDA graph capture"),
], ids=["sm75", "small shared memory", "grid y", "first use while capturing"])
def test_launch_errors(driver, tmp_path, env, call, message):
    """What the launcher refuses, it refuses with a message and launches nothing."""
    if env.get("FAKE_CUDA_SMEM") and ARCH != 90:
        pytest.skip("the sm_90 table's shared memory")
    # No plan first: prepare_device would load the kernels outside the capture.
    results, events = _run(driver, tmp_path, [{"params": call, "stream": CALLS_STREAM, "plan": False}], **env)
    err = results[0]["error"] or ""
    assert message in err, err
    assert not [e for e in events if e["ev"] == "launch"]


@pytest.mark.parametrize("env,kind", [({"ORT_FLASH_GLUON": "0"}, "fwd_tma"), ({"ORT_FLASH_TMA": "0"}, "fwd")],
                         ids=["ORT_FLASH_GLUON=0", "ORT_FLASH_TMA=0"])
def test_kernel_switches(driver, tmp_path, env, kind):
    """The environment switches that keep a call off the Gluon (or every TMA) kernel: the call
    then runs that kernel, with its own arguments."""
    if ARCH != 90:
        pytest.skip("no sm_90 kernels in this build")
    calls = [{"params": p, "stream": CALLS_STREAM} for _, p, k in FWD_CALLS[:3]]
    results, events = _run(driver, tmp_path, calls, **env)
    log = Log(events)
    for i, (_, p, _) in enumerate(FWD_CALLS[:3]):
        assert results[i]["error"] is None and results[i]["plan"][0] == kind
        assert check_fwd_launch(p, log, i)["kind"] == kind


@pytest.mark.parametrize("env,kind,mask", [({"ORT_FLASH_GLUON": "0"}, "fwd_tma", "bool"),
                                           ({"ORT_FLASH_KEY_BOUND": "0"}, "fwd_gluon", "bool"),
                                           ({}, "fwd_gluon", "none")],
                         ids=["gluon off", "switch 0", "switch unset"])
def test_key_bound_takes_the_mask_elsewhere(driver, tmp_path, env, kind, mask):
    """A key-bound call reads its mask, with no key lengths (a kernel's has_seqlens 1 would shift
    the positions), where the Gluon kernels are off (the key-masked TMA kernel) or the key bound's
    switch is "0" (the key-masked warp-specialized kernel); unset, the unmasked Gluon kernel with
    the bound; a key bound without its mask is refused, launching nothing."""
    if ARCH != 90:
        pytest.skip("no sm_90 kernels in this build")
    call = bounded(params(b=3, sq=700, skv=900, causal=True))
    results, events = _run(driver, tmp_path, [{"params": call, "stream": CALLS_STREAM}], **env)
    assert results[0]["error"] is None and results[0]["plan"][0] == kind
    e = check_fwd_launch(call, Log(events), 0)
    assert e["kind"] == kind and e["mask"] == mask
    lone = dict(params(b=3, sq=700, skv=900, causal=True), key_bound=0x70000000)
    (tmp_path / "lone").mkdir()
    results, events = _run(driver, tmp_path / "lone", [{"params": lone, "stream": CALLS_STREAM, "plan": False}])
    assert "a key bound needs the key mask" in (results[0]["error"] or "")
    assert not [ev for ev in events if ev["ev"] == "launch"]


def test_launch_switches_listed():
    """tests/_fake_cuda.py keeps the caller's launcher switches out of the child: it names every
    ORT_FLASH_* variable the CUDA launcher reads (cpp/launch_switches.cc reads them all)."""
    import re
    read = set(re.findall(r'getenv\("(ORT_FLASH_\w+)"\)', (ROOT / "cpp" / "launch_switches.cc").read_text()))
    assert read and read <= set(_fake_cuda.LAUNCH_SWITCHES), read - set(_fake_cuda.LAUNCH_SWITCHES)


@pytest.mark.parametrize("arch", [75, 80, 86, 89, 90, 100])
def test_info_verdict_matches_loader(driver, tmp_path, arch):
    """`ort-flash info`'s GPU line and the loader agree on every device: the kernels of the
    highest compiled arch of the device's major version not above it, or the same refusal."""
    code = ("from ort_flash import _C\n"
            "from ort_flash.info import format_info\n"
            "print([l for l in format_info().splitlines() if l.startswith('GPU:')][0])\n"
            "try:\n    print(_C.prepare_device(0))\nexcept RuntimeError as e:\n    print('error:', e)\n")
    out = _fake_cuda.run_python(driver, tmp_path / "cuda.log", code,
                                env={"FAKE_CUDA_ARCH": str(arch), "FAKE_CUDA_SMS": str(SMS)})
    gpu, loaded = out.strip().splitlines()[-2:]
    served = max((a for a in ARCHS if a // 10 == arch // 10 and a <= arch), default=None)
    assert gpu.startswith(f"GPU:          fake sm_{arch}, sm_{arch}: ")
    if served is None:
        assert "NOT supported by this build" in gpu and loaded.startswith("error:")
        assert f"sm_{arch}) has no FlashAttention kernels in this build" in loaded
    else:
        assert f"supported (runs the sm_{served} kernels)" in gpu
        assert loaded == str((arch, served, SMS, len(table_entries(served))))


# The table a build with candidate grids of aot/variants.py makes (aot/build.py --gluon-ws-on,
# variants.with_candidates), launched with this build's cubins (_C.launch_with_table): the
# candidates' entries reach the launcher on every CI run, while the shipped table lacks them.
CANDIDATES = "d128-persistent,short-two-slots"
DTYPES = {0: "float32", 1: "float16", 2: "bfloat16"}
MASKS = {0: "none", 1: "bool", 2: "add"}


@pytest.fixture(scope="module")
def switched_table():
    """(rows, the Gluon ones as entries): every row with "cubin_of", its own cubin where this
    build has the variant, else a Gluon cubin of the same kernel (warp-specialized or not),
    dtype, head dim and mask: the same launch ABI (its block and shared memory come with it)."""
    if ARCH != 90:
        pytest.skip("no sm_90 kernels in this build")
    # tests/_table_rows.py reads the table's module state: the candidates' grids put in its place.
    code = ("import json; from aot import variants as v; import _table_rows; "
            f"g = v.with_candidates({CANDIDATES!r}); v.GLUON_WS_GRIDS, v.GLUON_WS_LENGTHS = g, v.ws_lengths(g); "
            "print(json.dumps(_table_rows.table_rows(90)))")
    out = subprocess.run([sys.executable, "-c", code], check=True, env=child_env(), cwd=ROOT / "tests",
                         capture_output=True, text=True)
    rows = json.loads(out.stdout)
    shipped = {e["variant"]: e for e in table_entries(90)}
    entries = []
    for r in rows:
        if r["variant"] in shipped:
            r["cubin_of"] = r["variant"]
        else:
            like = [e for e in shipped.values() if e["kind"] == "fwd_gluon"
                    and ("_ws_" in e["variant"]) == ("_ws_" in r["variant"]) and e["dtype"] == DTYPES[r["dtype"]]
                    and (e["head_dim"], e["mask"]) == (r["head_dim"], MASKS[r["mask"]])]
            assert like, f"no cubin of this build has {r['variant']}'s launch ABI"
            r["cubin_of"] = like[0]["variant"]
        if r["kind"] == 4:  # fwd_gluon (aot/variants.py KIND_CODES)
            src = shipped[r["cubin_of"]]
            entries.append(dict(src, variant=r["variant"], cubin_of=r["cubin_of"], block_m=r["block_m"],
                                tile_causal=r["tile_causal"], tile_min_len=r["tile_min_len"],
                                tile_max_len=r["tile_max_len"], persistent=r["persistent"], dynamic=r["dynamic"]))
    if all(e["variant"] == e["cubin_of"] for e in entries):  # a build with these candidates (lab/gpu/gpu_release.sh try)
        pytest.skip(f"this build's table has the {CANDIDATES} entries itself: the tests above launch them")
    assert any(e["variant"] != e["cubin_of"] and e["persistent"] for e in entries)
    # short-two-slots: the one-partition kernel's d64 cubins below 1024 keys on 64-row tiles.
    assert any("_ws_" not in e["variant"] and e["head_dim"] == 64 and e["block_m"] == 64
               and e["tile_max_len"] == 1024 for e in entries), [e["variant"] for e in entries]
    return rows, entries


def test_switched_table(driver, tmp_path, switched_table):
    """Every Gluon entry of the switched table runs a call of its range with its arguments: the
    persistent ones on min(SMs, tiles) CTAs, the dynamic ones with their stream's tile counter pair
    (zeroed on the stream once, before its first launch)."""
    rows, entries = switched_table
    calls = [{"params": _entry_call(e), "stream": CALLS_STREAM} for e in entries]
    results, events = _run(driver, tmp_path, calls, rows=rows)
    log = Log(events)
    for i, e in enumerate(entries):
        assert results[i]["error"] is None, results[i]["error"]
        assert results[i]["variant"] == e["variant"], f"a call in {e['variant']}'s range planned {results[i]['variant']}"
        check_fwd_launch(_entry_call(e), log, i, entry=e)
    assert list(log.slots) == [CALLS_STREAM]


def test_dynamic_streams(driver, tmp_path):
    """Dynamic tiles on several streams: each its own counter set, zeroed once before its first
    launch; a stream first seen capturing a graph gets none (TileCounter 0: the kernel's
    round-robin order)."""
    e = next((x for x in GLUON_ENTRIES if x["dynamic"] and x["head_dim"] == 128), None)
    if e is None:
        pytest.skip("no dynamic-tile cubin in this build")
    p = _entry_call(e)
    streams = (41, 41, 42, 43)
    results, events = _run(driver, tmp_path, [{"params": p, "stream": s} for s in streams],
                           FAKE_CUDA_CAPTURING="43")
    log = Log(events)
    for i, s in enumerate(streams):
        assert results[i]["error"] is None and results[i]["variant"] == e["variant"]
        memsets = [x["stream"] for x in log.calls[i] if x["ev"] == "memset"]
        assert memsets == ([s] if s not in streams[:i] and s != 43 else [])
        check_fwd_launch(p, log, i, stream=s)
    assert 43 not in log.slots and log.slots[41] != log.slots[42]


def test_persistent_tile_numbers_fit_int32(driver, tmp_path):
    """A persistent kernel numbers the call's tiles in int32, and each CTA's next one past the
    last: the launcher refuses a call whose tiles plus CTAs would not fit, and launches one below."""
    e = next((x for x in GLUON_ENTRIES if x["persistent"] and x["head_dim"] == 128 and x["dtype"] == "float16"
              and x["mask"] == "none" and x["tile_causal"] == 1), None)
    if e is None:
        pytest.skip("no persistent d128 causal cubin in this build")
    bm = e["block_m"]
    # B 128 x Hq 1 (every TMA stride below 2^40 bytes) x 2^31 / block_m tiles: 128 tiles under 2^31.
    over = params(b=128, hq=1, hkv=1, sq=(2**31 // bm - 1) * bm, skv=(2**31 // bm - 1) * bm, causal=True)
    under = params(b=128, hq=1, hkv=1, sq=(2**31 // bm - 2) * bm, skv=(2**31 // bm - 2) * bm, causal=True)
    results, events = _run(driver, tmp_path, [{"params": over, "stream": 51}, {"params": under, "stream": 51}])
    assert results[0]["variant"] == results[1]["variant"] == e["variant"]
    assert "is too many for " + e["variant"] in (results[0]["error"] or ""), results[0]
    log = Log(events)
    assert not log.launches(0) and results[1]["error"] is None
    check_fwd_launch(under, log, 1, stream=51)


# ---------------------------------------------------------------- the FP8 prefill path

# (what the call is, its FlashParams with fp8 set): calls the FP8 path takes on sm_90.
FP8_CALLS = [
    ("gqa d128 causal bshd", params(sq=1000, skv=1000, causal=True, layout="bshd", fp8=True)),
    ("mha d64 bhsd", params(b=3, hq=4, hkv=4, sq=300, skv=300, d=64, fp8=True)),
    ("bf16 mqa d128 no lse", params(b=1, hq=6, hkv=1, sq=4096, skv=4096, dtype="bfloat16", causal=True, lse=0,
                                    fp8=True)),
]


def _fp8_expected(p: dict, rows: dict, sms: int, scratch: int) -> dict:
    """The three launches' parameters and grids by kind: aot/fp8_prepare.py's buffers, in its
    buffer_specs order, each 256-byte aligned in the one scratch block."""
    from aot.fp8_prepare import buffer_specs, padded_len, stats_splits

    b, hq, hkv, n, d = p["batch"], p["hq"], p["hkv"], p["sq"], p["d"]
    bm, bn = rows["fwd_fp8"]["block_m"], rows["fwd_fp8"]["block_n"]
    splits = stats_splits(b, hkv, n, bn, sms)
    at, buf = scratch, {}
    for name, (shape, dt) in buffer_specs(b, hq, hkv, n, d, bm, bn, splits).items():
        buf[name] = at
        at += (math.prod(shape) * (1 if dt == "fp8e4nv" else 4) + 255) // 256 * 256
    strides = {f"stride_{t}{x}": p[f"{t}_stride"][i] for t in "qkvy" for i, x in enumerate(
        ("b", "h", "m" if t in "qy" else "n"))}
    group = hq // hkv
    stats = dict(K=p["k"], V=p["v"], Part=buf["Part"], H=hkv, N=n, splits=splits,
                 **{k: v for k, v in strides.items() if k[7] in "kv"})
    quant = dict(Q=p["q"], K=p["k"], V=p["v"], **{k: buf[k] for k in buf}, Hq=hq, group=group, N=n, splits=splits,
                 **{k: v for k, v in strides.items() if k[7] in "qkv"})
    attn = dict(**{k: buf[k] for k in buf if k != "Part"}, Y=p["y"], Lse=p["lse"], softmax_scale=f32(p["scale"]),
                Hq=hq, group=group, N=n, store_lse=int(p["lse"] != 0), **{k: v for k, v in strides.items() if k[7] == "y"})
    for a in (stats, quant, attn):
        a.update(global_scratch=0, profile_scratch=0)
    np_ = padded_len(n, bm, bn)
    grids = {"fp8_stats": [splits, b * hkv, 1], "fp8_quantize": [np_ // min(bm, bn), b * hq, 2],
             "fwd_fp8": [math.ceil(n / bm), b * hq, 1]}
    return {"fp8_stats": stats, "fp8_quantize": quant, "fwd_fp8": attn}, grids


@pytest.mark.skipif(ARCH != 90, reason="the FP8 kernels are built for sm_90 only")
def test_fp8_launch_arguments(driver, tmp_path):
    """A call with fp8 set that the FP8 path takes launches its three kernels on the call's stream,
    in order (statistics, quantization, attention), the attention's cubin of the call's causal
    flag, with every parameter as the call and aot/fp8_prepare.py's buffer layout ask: the one
    scratch block the launcher asks for holds every FP8 buffer."""
    pytest.importorskip("triton", reason="aot/fp8_prepare.py's buffer layout imports Triton")
    calls = [{"params": p, "stream": CALLS_STREAM, "plan": False} for _, p in FP8_CALLS]
    results, events = _run(driver, tmp_path, calls)
    log = Log(events)
    for i, (what, p) in enumerate(FP8_CALLS):
        assert results[i]["error"] is None, (what, results[i]["error"])
        # The stream-ordered scratch (the first call also allocates the counters as the kernels load).
        allocs = [e for e in log.calls[i] if e["ev"] == "alloc" and e["stream"] is not None]
        assert len(allocs) == 1 and allocs[0]["stream"] == CALLS_STREAM, (what, allocs)
        launches = log.launches(i)
        assert [e["kind"] for _, e, _ in launches] == ["fp8_stats", "fp8_quantize", "fwd_fp8"], what
        rows = {e["kind"]: e for _, e, _ in launches}
        want, grids = _fp8_expected(p, rows, SMS, allocs[0]["ptr"])
        for ev, e, got in launches:
            assert e["dtype"] == p["dtype"] and e["head_dim"] == p["d"], (what, e["variant"])
            assert got == want[e["kind"]], (what, e["variant"], {k: (v, want[e["kind"]].get(k)) for k, v in got.items()
                                                                 if v != want[e["kind"]].get(k)})
            assert ev["grid"] == grids[e["kind"]] and ev["block"] == [32 * e["num_warps"], 1, 1], (what, e["variant"])
            assert ev["shared"] == e["shared"] and ev["stream"] == CALLS_STREAM
        assert rows["fwd_fp8"]["tile_causal"] == int(bool(p.get("causal"))), what


# Calls the FP8 path declines: (what, FlashParams, the reason the notice gives, env).
FP8_DECLINED = [
    ("key mask", key_mask(params(fp8=True), "bool"), "calls with a mask or key lengths", {}),
    ("kv cache", params(sq=16, skv=1016, offset=1000, causal=True, fp8=True),
     "calls with a KV cache (decode, continued prompts): the FP8 path is for prefill", {}),
    ("head dim 80", params(d=80, fp8=True), "head sizes other than 64 and 128", {}),
    ("window", params(window_left=64, window_right=0, fp8=True), "calls with a window, softcap or attention sinks", {}),
    ("fp32", params(dtype="float32", fp8=True), "float32 attention (the FP8 path takes float16 and bfloat16)", {}),
    ("sm_80", params(fp8=True), "this GPU is sm_80; the FP8 kernels run on sm_90 (H100, H200)",
     {"FAKE_CUDA_ARCH": "80", "FAKE_CUDA_SMS": "108"}),
]


@pytest.mark.parametrize("i", range(len(FP8_DECLINED)), ids=[c[0] for c in FP8_DECLINED])
def test_fp8_declined_calls_run_in_their_dtype_and_say_so_once(driver, tmp_path, i):
    """A call the FP8 path does not take runs the kernel it runs without fp8 (the same launch as
    the same call without it), and the process says why on standard error once, however many such
    calls run: here the same call three times, one notice line."""
    what, p, reason, env = FP8_DECLINED[i]
    if env.get("FAKE_CUDA_ARCH") == "80" and 80 not in ARCHS:
        pytest.skip("no sm_80 kernels in this build")
    if not env and ARCH != 90:
        pytest.skip("the FP8 kernels are built for sm_90 only")
    plain = {k: v for k, v in p.items() if k != "fp8"}
    calls = [{"params": x, "stream": CALLS_STREAM, "plan": False} for x in (p, p, p, plain)]
    stderr: list[str] = []
    full_env = {"FAKE_CUDA_ARCH": str(ARCH), "FAKE_CUDA_SMS": str(SMS), **env}
    results, events = _fake_cuda.run(driver, tmp_path / "cuda.log", calls, full_env, stderr=stderr)
    assert all(x["error"] is None for x in results), results
    notices = [line for line in stderr[0].splitlines() if line.startswith("ort_flash: ")]
    dtype = p["dtype"]
    assert notices == [f"ort_flash: attention_precision=fp8: attention runs in {dtype} here, not FP8: {reason}"], notices
    calls_ev = _fake_cuda.per_call(events)
    functions = {e["function"]: e for e in events if e["ev"] == "function"}
    ran = [[functions[e["function"]]["module"] for e in calls_ev[k] if e["ev"] == "launch"] for k in range(4)]
    assert ran[0] == ran[1] == ran[2] == ran[3] and ran[0], (what, ran)
