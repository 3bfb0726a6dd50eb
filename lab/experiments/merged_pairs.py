"""The calls lab/experiments/merged_variants.py times, and for each the variant the unmerged build
(`aot/build.py --unmerged`, "before") compiles for it and the one the merged build compiles ("after"),
checked against the variant tables
(aot/variants.py), and compiled exactly as aot/build.py compiles them. No GPU and no torch needed.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root

from aot import build  # noqa: E402
from aot import variants as V  # noqa: E402
from aot.contract import MAX_DECODE_ROWS, MAX_DECODE_SQ  # noqa: E402, F401 (the launcher's decode calls)

ARCH = 90                  # the H200's build


@dataclass(frozen=True)
class Call:
    """One op call: (B, Hq, Sq, D) queries against (B, Hkv, Skv, D) keys, offset Skv - Sq."""
    label: str
    dtype: str
    b: int
    hq: int
    hkv: int
    sq: int
    skv: int
    d: int
    causal: bool = False
    mask: str = "none"        # none / bool / add
    mask_rows: bool = False   # a (B, 1, Sq, Skv) mask; else a (B, 1, 1, Skv) key vector
    layout: str = "bhsd"      # bhsd, bshd (the 3-D layout's storage), pad (rows 8 elements wider)
    prec: str = "ieee"        # fp32 dots: ieee or tf32
    softcap: float = 0.0      # > 0: the call needs an extras variant

    @property
    def kind(self) -> str:
        return "decode" if self.sq <= MAX_DECODE_SQ and self.hq // self.hkv * self.sq <= MAX_DECODE_ROWS else "fwd"

    @property
    def aligned(self) -> bool:
        return self.layout != "pad" or (self.d + 8) % 16 == 0


# Rare-class calls: fp32 (the tiny model families export d32 fp32 with masks), fp16 d32/d256
# (MiniLM, Gemma), inexact head dims, decode steps. Odd lengths, so every boundary range runs.
CALLS = [
    Call("fp32 d64", "fp32", 2, 8, 8, 1000, 1000, 64),
    Call("fp32 d64 causal", "fp32", 2, 8, 8, 1000, 1000, 64, causal=True),
    Call("fp32 tf32 d128 causal gqa", "fp32", 2, 8, 2, 777, 777, 128, causal=True, prec="tf32"),
    Call("fp32 d32 key mask bshd", "fp32", 8, 8, 8, 509, 509, 32, mask="add", layout="bshd"),
    Call("fp32 d32 full mask causal", "fp32", 8, 8, 8, 509, 509, 32, causal=True, mask="add", mask_rows=True),
    Call("fp16 d32", "fp16", 4, 16, 16, 1531, 1531, 32),
    Call("fp16 d32 causal", "fp16", 4, 16, 16, 1531, 1531, 32, causal=True),
    Call("fp16 d32 key mask bshd", "fp16", 4, 16, 16, 1531, 1531, 32, mask="add", layout="bshd"),
    Call("fp16 d256 gqa", "fp16", 2, 8, 4, 1531, 1531, 256),
    Call("fp16 d256 causal chunk", "fp16", 2, 8, 4, 509, 1531, 256, causal=True),
    Call("fp16 d256 bool key mask", "fp16", 2, 8, 4, 1531, 1531, 256, mask="bool"),
    Call("fp16 d80 causal bshd", "fp16", 4, 12, 12, 1531, 1531, 80, causal=True, layout="bshd"),
    Call("fp16 d80 key mask", "fp16", 4, 12, 12, 1531, 1531, 80, mask="add"),
    Call("bf16 d96 pad", "bf16", 4, 8, 8, 1531, 1531, 96, layout="pad"),
    Call("decode fp32 d64", "fp32", 8, 16, 4, 1, 4099, 64, causal=True),
    Call("decode fp16 d32", "fp16", 16, 16, 4, 1, 4099, 32, causal=True),
    Call("decode fp16 d256", "fp16", 8, 16, 4, 1, 4099, 256, causal=True),
    Call("decode fp16 d80 key mask", "fp16", 8, 16, 4, 1, 4099, 80, causal=True, mask="add"),
]


def _table(variant_list, arch: int) -> dict:
    """{(kind, dtype, fp32 precision, head dim, even, mask, mask_keys, extras): Variant}, base tiles."""
    return {(v.kind, v.dtype, v.precision if v.dtype == "fp32" else "", v.head_dim, v.even_d, v.mask,
             v.mask_keys, v.extras): v
            for v in variant_list if v.kind in ("fwd", "decode") and not v.tile_min_len and arch >= v.min_arch}


def pick(call: Call, table: dict):
    """The variant cpp/launch_plan.cc plans for `call` from `table` (select_variant / decode_key,
    find_fwd_kernel, find_superset: exact, with extras, with a masked head dim, with both)."""
    buckets = (32, 64, 128, 256) if call.kind == "fwd" else (64, 128, 256)
    hd = next((b for b in buckets if call.d <= b), 0)
    even = call.d == hd and call.aligned and (call.kind == "decode" or hd != 32)
    prec = "" if call.dtype != "fp32" else (call.prec if call.kind == "fwd" else "ieee")
    keys = call.kind == "fwd" and call.mask != "none" and (not call.mask_rows or call.sq == 1)
    for mk in ((True, False) if keys else (False,)):
        for extras, ev in ((False, even), (True, even), (False, False), (True, False)):
            if call.softcap and not extras:
                continue
            v = table.get((call.kind, call.dtype, prec, hd, ev, call.mask, mk, extras))
            if v is not None:
                return v
    raise ValueError(f"{call.label}: no variant in the table")


@dataclass(frozen=True)
class Pair:
    call: Call
    before: V.Variant
    after: V.Variant
    before_source: str | None = None  # a folder with other versions of aot/'s kernel files (ab_pairs)

    @property
    def jobs(self):
        """(variant, EDGE_LOOP, kernel source folder or None for aot/) per side: the unmerged side
        runs with EDGE_LOOP off; an A/B pair (ab_pairs) compiles one variant from two sources."""
        if self.before_source:
            return [(self.before, V.edge_loop(self.before), self.before_source),
                    (self.after, V.edge_loop(self.after), None)]
        return [(self.before, False, None), (self.after, V.edge_loop(self.after), None)]


def make_pairs(calls=CALLS, arch: int = ARCH) -> list[Pair]:
    """Each call's variant in the unmerged and the merged build, checked: the before one in the
    unmerged product and merged away in the merged table, the after one in the merged table and a
    superset of it; or, for the variants both builds compile (variants.kept_exact), the same one
    twice."""
    before_t, after_t = _table(V.all_combinations(), arch), _table(V.all_variants(), arch)
    now, unmerged = set(V.all_variants()), set(V.all_combinations())
    pairs = []
    for c in calls:
        p = Pair(c, pick(c, before_t), pick(c, after_t))
        b, a = p.before, p.after
        if b in now and a == b and V.kept_exact(b) and not V.is_hot(b.kind, b.dtype, b.head_dim, b.even_d):
            pairs.append(p)
            continue
        problems = [msg for bad, msg in (
            (b not in unmerged, f"{b.name} is not in the unmerged product"),
            (b in now, f"{b.name} is still compiled: this call is not merged"),
            (a not in now, f"{a.name} is not in the merged variant table"),
            ((a.kind, a.dtype, a.precision, a.head_dim, a.mask, a.mask_keys) !=
             (b.kind, b.dtype, b.precision, b.head_dim, b.mask, b.mask_keys), f"{a.name} is another class than {b.name}"),
            (not a.extras or a.even_d > b.even_d, f"{a.name} is no superset of {b.name}"))
            if bad]
        if problems:
            raise ValueError(f"{c.label}: " + "; ".join(problems))
        pairs.append(p)
    return pairs


# Calls whose variant is a superset one compiled with EDGE_LOOP, for A/B runs of one kernel source
# against another (ab_pairs): CALLS and calls with a softcap or a full mask.
AB_CALLS = CALLS + [
    Call("fp32 d64 softcap", "fp32", 2, 8, 8, 1000, 1000, 64, softcap=30.0),
    Call("fp16 d32 softcap causal", "fp16", 4, 16, 16, 1531, 1531, 32, causal=True, softcap=30.0),
    Call("fp16 d256 softcap causal gqa", "fp16", 2, 8, 4, 1531, 1531, 256, causal=True, softcap=50.0),
    Call("fp16 d80 softcap key mask", "fp16", 4, 12, 12, 1531, 1531, 80, mask="add", softcap=30.0),
    Call("fp16 d64m full mask", "fp16", 4, 12, 12, 1031, 1031, 48, mask="bool", mask_rows=True),
    Call("bf16 d128m full mask causal", "bf16", 2, 8, 8, 1031, 1031, 96, causal=True, mask="add", mask_rows=True),
    # The tiles of docs/build-time.md "Spilling tiles": fp32 IEEE at every head dim, fp16/bf16 full
    # masks at head dims 32 and 64 (inexact ones among them).
    Call("fp32 d128", "fp32", 2, 8, 8, 1000, 1000, 128),
    Call("fp32 d128 full mask causal", "fp32", 2, 8, 8, 1000, 1000, 128, causal=True, mask="bool", mask_rows=True),
    Call("fp32 d96 key mask", "fp32", 2, 8, 8, 777, 777, 96, mask="add"),
    Call("fp32 d256 gqa", "fp32", 2, 8, 4, 777, 777, 256),
    Call("fp32 d256 full mask causal", "fp32", 2, 8, 8, 777, 777, 256, causal=True, mask="add", mask_rows=True),
    Call("fp16 d32 full mask", "fp16", 4, 16, 16, 1531, 1531, 32, mask="add", mask_rows=True),
    Call("bf16 d32 full mask causal", "bf16", 4, 16, 16, 1531, 1531, 32, causal=True, mask="bool", mask_rows=True),
    Call("bf16 d40 full mask causal", "bf16", 4, 12, 12, 1031, 1031, 40, causal=True, mask="add", mask_rows=True),
]


def ab_pairs(before_source: str, calls=AB_CALLS, arch: int = ARCH) -> list[Pair]:
    """Each call's variant in the merged table, compiled from the folder `before_source` (another
    version of aot/flash_fwd.py, aot/flash_decode.py and/or aot/variants.py: the kernels, the
    tiles) and from aot/: the calls whose variant compiles with EDGE_LOOP."""
    table = _table(V.all_variants(), arch)
    pairs = []
    for c in calls:
        v = pick(c, table)
        if V.edge_loop(v):
            pairs.append(Pair(c, v, v, before_source))
    return pairs


_MODULES: dict = {}


def _folder_module(folder: str, name: str):
    """`folder`/`name`.py imported under a name of its own in the aot package, so that its relative
    imports resolve to aot/'s (None where the folder has no such file)."""
    path = str(Path(folder) / f"{name}.py")
    if not Path(path).exists():
        return None
    if path not in _MODULES:
        import importlib.util
        spec = importlib.util.spec_from_file_location(f"aot.{name}_ab{len(_MODULES)}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        _MODULES[path] = mod
    return _MODULES[path]


def kernel_fn(v: V.Variant, folder: str | None):
    """The JIT function v compiles from: aot/'s, or that of the kernel file of its kind in `folder`
    (flash_fwd.py: flash_fwd; flash_decode.py: flash_decode_split, whose imports from flash_fwd
    resolve to aot/'s, as they do in the build); aot/'s where the folder has no such file."""
    name, fn = {"fwd": ("flash_fwd", "flash_fwd"), "decode": ("flash_decode", "flash_decode_split"),
                "combine": ("flash_decode", "flash_decode_combine")}[v.kind]
    mod = _folder_module(folder, name) if folder is not None else None
    return build.KERNELS[v.kind] if mod is None else getattr(mod, fn)


def fwd_config(v: V.Variant, arch: int, folder: str | None = None) -> V.TileConfig:
    """The tile v compiles and launches with: aot/variants.py's, or that of a variants.py in `folder`
    (an A/B of two tile tables; its get_fwd_config reads only the variant's fields)."""
    mod = _folder_module(folder, "variants") if folder is not None else None
    return V.get_fwd_config(arch, v) if mod is None else mod.get_fwd_config(arch, v)


def constexprs(v: V.Variant, arch: int, edge: bool, folder: str | None = None) -> dict:
    """The constexprs aot/build.py's _compile_one gives v (tests check they match), EDGE_LOOP as asked."""
    cfg = fwd_config(v, arch, folder)
    if v.kind == "combine":
        return {"BLOCK_DV": v.head_dim, "BLOCK_S": cfg.block_n}
    c = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_D": v.head_dim, "BLOCK_DV": v.head_dim,
         "EVEN_D": v.even_d, "MASK_KIND": V.MASK_KINDS[v.mask], "EXTRAS": v.extras, "DOT_PRECISION": v.precision}
    if v.kind == "decode":
        c["PDL"] = build.decode_pdl(arch)
    if v.mask_keys:
        c["MASK_KEYS"] = True
    if edge:
        c["EDGE_LOOP"] = True
    return c


def source(v: V.Variant, arch: int, edge: bool, folder: str | None = None):
    """(ASTSource, compile options, parameter names, signature) as aot/build.py compiles v (from
    the kernel files in `folder` where given, kernel_fn)."""
    from triton.compiler import ASTSource
    cfg = fwd_config(v, arch, folder)
    sig, attrs, names = build.signature(v, cfg)
    src = ASTSource(fn=kernel_fn(v, folder), signature=sig, constexprs=constexprs(v, arch, edge, folder), attrs=attrs)
    return src, build.compile_options(cfg), names, sig


def combine_variant(v: V.Variant) -> V.Variant:
    return V.Variant(v.dtype, v.head_dim, False, "none", False, v.precision, "combine")
