"""Ahead-of-time build of the FlashAttention cubins and the generated C++ kernel table.

Runs at package build time on a machine with no GPU: `triton.compile` with an explicit
`GPUTarget` (ptxas ships in the triton wheel). Each compiled variant is cached under a key of
(kernel source, Triton version, variant, tile config, arch), so unchanged kernels are not
recompiled across builds.

    python -m aot.build --archs 80,90 --out BUILD/aot [--cache DIR] [--jobs N] [--gluon-ws-on NAMES]

Writes into --out: one .cubin per (variant, arch), `kernels.gen.S` (embeds them with .incbin),
`kernel_table.gen.cc` (the table cpp/kernel_registry.cc searches) and `manifest.json`.

The table is aot/variants.py's as shipped, or with --gluon-ws-on (default: the environment
variable ORT_FLASH_GLUON_WS_ON, which the CMake step passes through) the named candidate grids of
the warp-specialized kernel (tiles.GLUON_WS_CANDIDATES) in place of the shipped ones: a
development build that measures them without an edit.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from . import (compile_pool, contract, flash_decode, flash_fwd, flash_fwd_fp8, fp8_prepare, gqa_prepare, sink_rescale,
               variants)
from .contract import TMA_ARGS, TMA_KINDS, TMA_RANK
from .variants import (DTYPE_CODES, FP8_KINDS, GQA_KINDS, KIND_CODES, MASK_KINDS, PRECISION_CODES, SINK_KINDS,
                       TRITON_VERSION, TileConfig, Variant, all_combinations, all_variants, edge_loop, get_fwd_config,
                       with_candidates)

# The kernel each variant kind compiles.
KERNELS = {"fwd": flash_fwd.flash_fwd, "fwd_tma": flash_fwd.flash_fwd,
           "decode": flash_decode.flash_decode_split, "combine": flash_decode.flash_decode_combine,
           "gqa_prepare": gqa_prepare.gqa_prepare, "gqa_past": gqa_prepare.gqa_prepare,
           "gqa_compact": gqa_prepare.gqa_prepare, "gqa_shift": gqa_prepare.gqa_prepare,
           "fp8_stats": fp8_prepare.fp8_stats, "fp8_quantize": fp8_prepare.fp8_quantize,
           "fwd_fp8": flash_fwd_fp8.flash_fwd_fp8, "sink_rescale": sink_rescale.sink_rescale}

# Largest dynamic shared memory a block may use, per arch (bytes).
SMEM_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}

# The strides aligned to 16 elements in an exact-head-dim ("even") variant.
STRIDE_ARGS = tuple(f"stride_{t}{d}" for t in "qkvy" for d in ("b", "h", "m" if t in "qy" else "n"))
# Triton's element-type codes in tensordesc metadata -> CUtensorMapDataType (FLOAT16 6, BFLOAT16 9).
TMA_ELEM_TYPES = {"fp16": (6, 6), "bf16": (10, 9)}


def gluon_module(ws: bool = False):
    """A Gluon kernel's module (variants.GLUON_MODULE, or GLUON_WS_MODULE), imported on first use:
    it needs triton.experimental.gluon, and a table without Gluon variants never imports it."""
    return importlib.import_module(variants.GLUON_WS_MODULE if ws else variants.GLUON_MODULE)


def kernel_fn(kind: str, ws: bool = False):
    """The (Triton or Gluon) JIT function a kind compiles (ws: the warp-specialized Gluon one)."""
    if kind == "fwd_gluon":
        return gluon_module(ws).flash_fwd_gluon_ws if ws else gluon_module().flash_fwd_gluon
    return KERNELS[kind]


def signature(v: Variant, cfg: TileConfig) -> tuple[dict, dict, list]:
    """(signature, attrs, argument names) for ASTSource: each runtime parameter typed by
    aot/contract.py (the launcher's arguments are the contract's), the rest constexpr. A kernel
    whose runtime parameters are not its ABI's, in order, is refused."""
    params = inspect.signature(kernel_fn(v.kind, v.ws).fn).parameters
    names = list(params)
    runtime = tuple(n for n in names if "constexpr" not in str(params[n].annotation))
    if runtime != contract.runtime_args(v.kind):
        raise RuntimeError(f"{v.name}: the kernel's runtime parameters {runtime} are not aot/contract.py's "
                           f"{contract.KIND_ABIS[v.kind]} ABI {contract.runtime_args(v.kind)}; change them together")
    types = dict(contract.ABIS[contract.KIND_ABIS[v.kind]])
    sig = {}
    for name in names:
        if name not in types:
            sig[name] = "constexpr"
        elif v.kind in TMA_KINDS and name in TMA_ARGS:
            rows = cfg.desc_rows[name in ("K", "V")]
            # A Gluon descriptor's type names its shared layout, which the kernel's module picks.
            sig[name] = (gluon_module(v.ws).desc_signature(v.dtype, rows, v.head_dim)
                         if v.kind == "fwd_gluon" else f"tensordesc<{v.dtype}[1,1,{rows},{v.head_dim}]>")
        else:
            sig[name] = contract.triton_type(types[name], v.dtype, v.mask)
    attrs = {}
    # The GQA kernels' K and V may point into packed QKV: no alignment promised; nor for the sink
    # rescale, which reads rows of any head size in place.
    # The FP8 kinds: every pointer (the op's tensors and its 256-byte-aligned scratch) and stride.
    aligned = [n for n in names if sig[n].startswith("*")] if v.kind in FP8_KINDS else (
        () if v.kind in GQA_KINDS or v.kind in SINK_KINDS else ("Q", "K", "V", "Y", "Lse", "OPart", "LsePart"))
    for name in aligned:
        if name in names and sig[name].startswith("*"):
            attrs[(names.index(name),)] = [["tt.divisibility", 16]]
    if v.even_d:
        for name in STRIDE_ARGS:
            if name in names:
                attrs[(names.index(name),)] = [["tt.divisibility", 16]]
    return sig, attrs, names


# ptxas's options on top of Triton's (which passes -lineinfo): -suppress-debug-info keeps the line
# tables and the PTX text that -lineinfo embeds out of the cubin. The machine code (.text) and the
# kernel's attributes are byte for byte those of a build without it; the cubins are a quarter of
# their size (the PTX text was 58 % of the 448 cubins' 205 MB), and so are the library, the pybind11
# module that embeds the same table and the wheel that ships both (docs/build-time.md, "Packaging").
PTXAS_OPTIONS = "-suppress-debug-info"


def compile_options(cfg: TileConfig) -> dict:
    """triton.compile's options for a tile (the warp-specialized Gluon kernel adds maxnreg)."""
    return {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages, "ptx_options": PTXAS_OPTIONS}


def triton_source(v: Variant, arch: int, cfg: TileConfig) -> tuple:
    """(source, options, argument names, signature, constexprs) that triton.compile takes for a variant."""
    from triton.compiler import ASTSource

    sig, attrs, names = signature(v, cfg)
    options = compile_options(cfg)
    if v.kind == "fwd_gluon":
        constexprs = {"BLOCK_M": cfg.block_m // cfg.tiles, "BLOCK_N": cfg.block_n, "BLOCK_D": v.head_dim,
                      "NUM_STAGES": cfg.num_stages}
        if v.ws:
            constexprs.update(NUM_CONSUMERS=cfg.consumers, CONSUMER_REGS=cfg.consumer_regs,
                              PINGPONG=cfg.pingpong)
            # Both named always: Triton's compile cache keys the constexprs by their values in
            # argument order, not by name, so {TILES_PER_CTA: 2} and {MASK_KIND: 2} would share
            # a key (and one variant get the other's cubin) if each were named only when set.
            # Under a key-vector mask the visible-range check (padded batches whose keys show one
            # visible run attend over it unmasked).
            constexprs.update(TILES_PER_CTA=cfg.tiles, MASK_KIND=MASK_KINDS[v.mask], OVERLAP_PV=cfg.overlap,
                              MASK_PREFIX=v.mask != "none", PERSISTENT_GRID=cfg.persistent > 0,
                              DYNAMIC_TILES=cfg.dynamic, SKIP_PAST_ROWS=cfg.skip)
            options["maxnreg"] = cfg.maxnreg
    elif v.kind == "combine":
        constexprs = {"BLOCK_DV": v.head_dim, "BLOCK_S": cfg.block_n}
    elif v.kind in GQA_KINDS:
        constexprs = {"BLOCK_ROWS": cfg.block_m, "BLOCK_D": v.head_dim, "GATHER_ROWS": cfg.block_n,
                      "MODE": GQA_KINDS.index(v.kind)}
    elif v.kind in SINK_KINDS:
        constexprs = {"BLOCK_M": cfg.block_m, "BLOCK_D": v.head_dim}
    elif v.kind in FP8_KINDS:
        constexprs = {"BLOCK_N": cfg.block_n, "HEAD_DIM": v.head_dim}
        if v.kind != "fp8_stats":
            constexprs["BLOCK_M"] = cfg.block_m
        if v.kind == "fwd_fp8":
            constexprs["CAUSAL"] = v.tile_causal == 1
    else:
        constexprs = {
            "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_D": v.head_dim,
            "BLOCK_DV": v.head_dim, "EVEN_D": v.even_d,
            "MASK_KIND": MASK_KINDS[v.mask], "EXTRAS": v.extras, "DOT_PRECISION": v.precision,
        }
        if v.kind == "decode":
            constexprs["PDL"] = decode_pdl(arch)
        if v.kind == "fwd_tma":
            constexprs["TMA"] = True
        if v.mask_keys:
            constexprs["MASK_KEYS"] = True
        if edge_loop(v):
            constexprs["EDGE_LOOP"] = True
    if v.kind == "fwd_gluon":
        from triton.experimental.gluon._runtime import GluonASTSource
        src = GluonASTSource(fn=kernel_fn(v.kind, v.ws), signature=sig, constexprs=constexprs, attrs=attrs)
    else:
        src = ASTSource(fn=KERNELS[v.kind], signature=sig, constexprs=constexprs, attrs=attrs)
    return src, options, names, sig, constexprs


def _compile_one(job: tuple[Variant, int, TileConfig, str]) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget

    v, arch, cfg, cache_dir = job
    key = cache_key(v, arch, cfg)
    cached = Path(cache_dir) / key
    if (cached / "kernel.cubin").exists() and (cached / "meta.json").exists():
        meta = json.loads((cached / "meta.json").read_text())
        meta.update(cached=True, cubin=str(cached / "kernel.cubin"))
        return meta
    src, options, names, sig, constexprs = triton_source(v, arch, cfg)
    target = GPUTarget("cuda", arch, 32)
    stage_s = {}
    start = cpu_seconds()
    try:
        with _timed_stages(stage_s):
            compiled = triton.compile(src, target=target, options=options)
    except Exception as e:
        raise RuntimeError(f"{v.name} sm_{arch} {cfg}: Triton failed: {e}") from None
    # The front end (Python AST to TTIR) and Triton's own cache writes: what the stages leave.
    stage_s = {"ast": cpu_seconds() - start - sum(stage_s.values()), **stage_s}
    md = compiled.metadata
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        raise RuntimeError(f"{v.name} sm_{arch}: kernels needing scratch memory are not supported")
    limit = SMEM_LIMIT.get(arch, 99 * 1024)
    if md.shared > limit:
        raise RuntimeError(f"{v.name} sm_{arch}: {md.shared} B shared memory exceeds {limit} B; "
                           f"shrink its tile in aot/variants.py")
    runtime_args = [n for n in names if sig[n] != "constexpr"]
    tma = _tma_boxes(v, md) if v.kind in TMA_KINDS else []
    meta = {
        # num_warps: every warp of the launch (a warp-specialized kernel's workers included).
        "variant": v.name, "arch": arch, "kernel_name": md.name, "num_warps": md.num_warps,
        "shared": md.shared, "block_m": cfg.block_m, "block_n": cfg.block_n,
        "num_stages": cfg.num_stages, "args": runtime_args, "triton": triton.__version__,
        "tma": tma, "pdl": bool(constexprs.get("PDL", 0)), "persistent": cfg.persistent, "dynamic": cfg.dynamic,
        "stage_s": {k: round(t, 3) for k, t in stage_s.items()},
    }
    cached.mkdir(parents=True, exist_ok=True)
    tmp = cached / "kernel.cubin.tmp"
    tmp.write_bytes(compiled.asm["cubin"])
    os.replace(tmp, cached / "kernel.cubin")
    (cached / "meta.json").write_text(json.dumps(meta, indent=1))
    meta.update(cached=False, cubin=str(cached / "kernel.cubin"))
    return meta


def cpu_seconds() -> float:
    """CPU time of this process and its waited-for children (ptxas)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@contextlib.contextmanager
def _timed_stages(out: dict):
    """Adds each Triton stage's CPU seconds to `out` (ttir, ttgir: MLIR passes; llir: lowering to
    LLVM IR and LLVM's optimizer; ptx: LLVM's NVPTX back end; cubin: ptxas, a child process). CPU
    time, not wall time, so that other load on the machine does not inflate it."""
    from triton import knobs

    def hook(backend, stages, options, language, capability):
        for name, fn in list(stages.items()):
            def timed(src, metadata, fn=fn, name=name):
                t = cpu_seconds()
                try:
                    return fn(src, metadata)
                finally:
                    out[name] = out.get(name, 0.0) + cpu_seconds() - t
            stages[name] = timed

    before = knobs.runtime.add_stages_inspection_hook
    knobs.runtime.add_stages_inspection_hook = hook
    try:
        yield
    finally:
        knobs.runtime.add_stages_inspection_hook = before


def _tma_boxes(v: Variant, md) -> list[dict]:
    """What the launcher needs to encode each descriptor as this cubin expects it: the swizzle
    mode (CUtensorMapSwizzle) and the box (rows x columns; Triton splits a 128-element row of
    fp16 into two 64-element boxes under the 128-byte swizzle)."""
    metas = getattr(md, "tensordesc_meta", None) or []
    if len(metas) != len(TMA_ARGS):
        raise RuntimeError(f"{v.name}: expected {len(TMA_ARGS)} TMA descriptors, Triton lowered "
                           f"{len(metas)}; the launcher cannot encode this kernel's arguments")
    out = []
    for name, m in zip(TMA_ARGS, metas):
        block = list(m["block_size"])
        device_type, _ = TMA_ELEM_TYPES[v.dtype]
        if (len(block) != TMA_RANK or block[:2] != [1, 1] or m["elem_type"] != device_type
                or m["elem_size"] != 2 or m.get("fp4_padded")):
            raise RuntimeError(f"{v.name}: descriptor {name} lowered as {m}; the launcher encodes "
                               f"(1, 1, rows, cols) boxes of 2-byte elements only")
        out.append(dict(arg=name, swizzle=int(m["swizzle"]), rows=block[2], cols=block[3]))
    return out


def gluon_sources() -> list[str]:
    """The Gluon kernels' modules: the one-partition kernel's, the warp-specialized kernel's entry
    where it takes calls, and the role modules (aot/gluon_ws/), whose structs both kernels use."""
    mods = [gluon_module().__file__]
    if variants.GLUON_WS_LENGTHS:
        mods.append(gluon_module(ws=True).__file__)
    # The role modules: the warp-specialized kernel's, and the structs the one-partition kernel's
    # epilogue takes too.
    mods += [str(f) for f in sorted((Path(__file__).resolve().parent / "gluon_ws").glob("*.py"))]
    return mods


def source_hash(kind: str | None = None, script: bool = True) -> str:
    """The kernel sources a kind compiles from (all of them for None) and, with ``script``, this
    script: an edit to the decode kernel leaves the forward cubins cached, and an edit to the
    Gluon kernel only its own."""
    if kind == "fwd_gluon":
        sources = gluon_sources()
    elif kind in GQA_KINDS:
        sources = [gqa_prepare.__file__]
    elif kind in FP8_KINDS:
        sources = [fp8_prepare.__file__, flash_fwd_fp8.__file__]
    elif kind in SINK_KINDS:
        sources = [sink_rescale.__file__]
    elif kind in ("fwd", "fwd_tma"):
        sources = [flash_fwd.__file__]
    else:
        sources = [flash_fwd.__file__, flash_decode.__file__]
        if kind is None:
            sources += [gqa_prepare.__file__, fp8_prepare.__file__, flash_fwd_fp8.__file__, sink_rescale.__file__] + (
                gluon_sources() if variants.GLUON_ENABLED else [])
    h = hashlib.sha256()
    for f in sources + ([__file__] if script else []):
        h.update(Path(f).read_bytes())
    return h.hexdigest()


def cache_key(v: Variant, arch: int, cfg: TileConfig) -> str:
    """The cubin's cache key: its kernel sources, what triton.compile receives for it (the
    source's own hash: the kernel and every jit function it calls, the signature, constexprs and
    attributes; the options; the arch), Triton's version and the variant and tile it is for. Not
    this script's text: an edit here that compiles nothing differently keeps the cache."""
    src, options = triton_source(v, arch, cfg)[:2]
    h = hashlib.sha256()
    h.update(src.hash().encode())
    h.update(json.dumps(options, sort_keys=True, default=str).encode())
    # repr(v) leaves out the tile range (a TMA_TILES entry), so it joins the key only when set.
    tile = f"tile({v.tile_causal},{v.tile_min_len})" if (v.tile_causal, v.tile_min_len) != (-1, 0) else ""
    tile += f"below({v.tile_max_len})" if v.tile_max_len else ""
    tile += "edge_loop" if edge_loop(v) else ""
    if v.ws:
        tile += f"ws({cfg.consumers},{cfg.maxnreg},{cfg.consumer_regs},{cfg.pingpong})"
        tile += f"tiles({cfg.tiles})" if cfg.tiles > 1 else ""
        tile += "overlap" if cfg.overlap else ""
        tile += f"persistent({cfg.persistent})" if cfg.persistent else ""
        tile += "dynamic" if cfg.dynamic else ""
        tile += "skip" if cfg.skip else ""
    for part in (source_hash(v.kind, script=False), TRITON_VERSION, repr(v) + tile, repr(cfg), str(arch)):
        h.update(part.encode())
    return f"{v.name}-sm{arch}-{h.hexdigest()[:16]}"


# Programmatic dependent launch (sm_90+, docs/perf-notes.md decode v7): the decode split kernel
# waits for the grid before it (griddepcontrol.wait) before touching memory, so the launcher may
# launch it while that grid drains (KernelEntry::pdl); it never releases the next grid early.
PDL_MIN_ARCH = 90


def decode_pdl(arch: int) -> int:
    """flash_decode_split's PDL level for an arch: 1 (wait first) from sm_90, else 0."""
    return 1 if arch >= PDL_MIN_ARCH else 0


def _cxx_bool(b: bool) -> str:
    return "true" if b else "false"


def _cxx_tma(boxes: list[dict]) -> str:
    """KernelEntry::tma: {swizzle, box rows, box cols} per descriptor (Q, K, V, Y), or zeros."""
    cells = [f"{{{b['swizzle']}, {b['rows']}, {b['cols']}}}" for b in boxes] or ["{0, 0, 0}"] * len(TMA_ARGS)
    return "{" + ", ".join(cells) + "}"


def write_outputs(out: Path, metas: list[dict], variants: dict[str, Variant]):
    out.mkdir(parents=True, exist_ok=True)
    asm = ["/* Generated by aot/build.py; do not edit. Embeds the AOT-compiled cubins. */",
           '\t.section .rodata']
    rows = []
    for i, m in enumerate(metas):
        v = variants[m["variant"]]
        cfg = TileConfig(m["block_m"], m["block_n"], m["num_warps"], m["num_stages"])
        dst = out / f"{v.name}.sm{m['arch']}.cubin"
        dst.write_bytes(Path(m.pop("cubin")).read_bytes())
        sym = f"ort_flash_cubin_{i}"
        asm += [f"\t.global {sym}", f"\t.global {sym}_end", "\t.balign 16", f"{sym}:",
                f'\t.incbin "{dst.resolve()}"', f"{sym}_end:", "\t.byte 0"]
        rows.append((sym, m, v, cfg))
    asm.append('\t.section .note.GNU-stack,"",@progbits')
    (out / "kernels.gen.S").write_text("\n".join(asm) + "\n")

    cc = ["// Generated by aot/build.py; do not edit. The AOT kernel table.",
          '#include "kernel_table.h"', "", "extern \"C\" {"]
    for sym, *_ in rows:
        cc.append(f"extern const unsigned char {sym}[];")
        cc.append(f"extern const unsigned char {sym}_end[];")
    cc += ["}", "", "namespace ort_flash {", "", "static const KernelEntry kEntries[] = {"]
    for sym, m, v, cfg in rows:
        cc.append(
            f"  {{{{DType({DTYPE_CODES[v.dtype]}), {v.head_dim}, {_cxx_bool(v.even_d)}, "
            f"MaskKind({MASK_KINDS[v.mask]}), {_cxx_bool(v.extras)}, "
            f"Fp32Precision({PRECISION_CODES[v.precision] if v.dtype == 'fp32' else 0}), "
            f"KernelKind({KIND_CODES[v.kind]}), {_cxx_bool(v.mask_keys)}}}, "
            f"{m['arch']}, \"{v.name}\", \"{m['kernel_name']}\", {m['num_warps']}, {m['shared']}, "
            f"{cfg.block_m}, {cfg.block_n}, {sym}, {sym}_end, {_cxx_tma(m.get('tma', []))}, "
            f"{v.tile_causal}, {v.tile_min_len}, {_cxx_bool(m.get('pdl', False))}, {v.tile_max_len}, "
            f"{m.get('persistent', 0)}, {_cxx_bool(m.get('dynamic', False))}}},")
    if not rows:  # a CPU-only build (no archs): an empty table
        cc[-1] = "static const KernelEntry* const kEntries = nullptr;"
        cc += ["", "const KernelEntry* kernel_table(size_t* count) {", "  *count = 0;",
               "  return kEntries;", "}", ""]
    else:
        cc += ["};", "",
               "const KernelEntry* kernel_table(size_t* count) {",
               "  *count = sizeof(kEntries) / sizeof(kEntries[0]);",
               "  return kEntries;", "}", ""]
    cc += [
           f"const char* kernel_table_triton_version() {{ return \"{TRITON_VERSION}\"; }}", "",
           "}  // namespace ort_flash", ""]
    (out / "kernel_table.gen.cc").write_text("\n".join(cc))
    (out / "manifest.json").write_text(json.dumps(
        {"triton": TRITON_VERSION, "source_sha256": source_hash(), "kernels": metas}, indent=1))


def candidate_grids(names: str) -> dict | None:
    """The warp-specialized kernel's grids a build with candidate grids `names` (comma-separated,
    --gluon-ws-on) compiles, for the table functions' `grids`: None (the shipped table) where
    `names` names none; ValueError for a name that is not a candidate."""
    listed = [n for n in names.replace(" ", "").split(",") if n]
    return with_candidates(listed) if listed else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default="80,90", help="comma-separated SM versions, e.g. 80,90")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get(
        "ORT_FLASH_AOT_CACHE", Path.home() / ".cache" / "ort_flash" / "aot")))
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("ORT_FLASH_AOT_JOBS", 0)) or
                    compile_pool.available_cpus(), help="compile processes (default: the CPUs available)")
    ap.add_argument("--only", metavar="REGEX",
                    help="compile only the variants whose name matches (measurements; the table "
                         "then lacks the rest)")
    ap.add_argument("--unmerged", action="store_true",
                    help="every combination, also those a superset variant serves (measurements)")
    ap.add_argument("--profile", type=Path, metavar="JSON",
                    help="write each kernel's seconds per Triton stage here")
    ap.add_argument("--gluon-ws-on", metavar="NAMES", default=os.environ.get("ORT_FLASH_GLUON_WS_ON", ""),
                    help="comma-separated candidate grids of the warp-specialized kernel (aot/variants.py "
                         "GLUON_WS_CANDIDATES) in place of the shipped ones, for a development build "
                         "(default: $ORT_FLASH_GLUON_WS_ON; empty: the shipped table)")
    args = ap.parse_args(argv)
    try:
        grids = candidate_grids(args.gluon_ws_on)
    except ValueError as e:
        ap.error(f"--gluon-ws-on / ORT_FLASH_GLUON_WS_ON: {e}")

    import triton
    if triton.__version__ != TRITON_VERSION:
        print(f"aot/build.py: Triton {triton.__version__} found, kernels are pinned to "
              f"{TRITON_VERSION}; install triton=={TRITON_VERSION}", file=sys.stderr)
        return 1
    archs = [int(a.strip().replace("sm_", "")) for a in args.archs.replace(";", ",").split(",") if a.strip()]
    if not archs:
        print("aot/build.py: no CUDA archs requested; building a CPU-only kernel table")
    if grids is not None:
        print(f"aot/build.py: candidate grids {args.gluon_ws_on.strip()} in place of the shipped ones")
    variants = {v.name: v for v in (all_combinations(grids) if args.unmerged else all_variants(grids))}
    jobs = [(v, arch, get_fwd_config(arch, v, grids), str(args.cache)) for arch in archs
            for v in variants.values() if arch >= v.min_arch
            and (not args.only or re.search(args.only, v.name))]
    args.cache.mkdir(parents=True, exist_ok=True)
    todo = [not (Path(c) / cache_key(v, a, cfg) / "kernel.cubin").exists() for v, a, cfg, c in jobs]
    # Triton's own compile cache, private to this build and removed after it: the AOT cache keeps
    # what later builds reuse. Its workers still share one (Triton returns a compile it has just
    # done, e.g. two tiles that compile the same), no other process's compiles land in it (its
    # keys name constexprs by value only: test_triton_cache_keys_tell_variants_apart), and the
    # intermediate files (about 3 MB a kernel) do not pile up in ~/.triton.
    triton_dir = tempfile.mkdtemp(prefix="triton-cache-", dir=args.cache)
    os.environ["TRITON_CACHE_DIR"] = triton_dir
    try:
        metas = compile_pool.compile_all(jobs, todo, _compile_one, args.jobs)
    finally:
        shutil.rmtree(triton_dir, ignore_errors=True)
    if args.profile:
        args.profile.write_text(json.dumps(
            [{k: m.get(k) for k in ("variant", "arch", "cached", "stage_s", "num_warps",
                                    "num_stages", "block_m", "block_n")} for m in metas], indent=1))
    fresh = sum(not m.pop("cached") for m in metas)
    write_outputs(args.out, metas, variants)
    if archs:
        print(f"aot/build.py: {len(metas)} kernels for sm_{', sm_'.join(map(str, archs))} "
              f"({fresh} compiled, {len(metas) - fresh} from cache {args.cache})")
    else:
        print("aot/build.py: wrote an empty kernel table: no CUDA kernels are compiled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
