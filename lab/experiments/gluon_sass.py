"""What the Gluon prefill kernel compiles to, read on a machine with no GPU (lab/experiments/gluon_attn.py
--sass): each variant compiled ahead of time for sm_90 as aot/build.py compiles it (GluonASTSource
+ triton.compile, GPUTarget("cuda", 90, 32)), its registers, spills and shared memory from
cuobjdump -res-usage, and the order of the main loop's SASS: the softmax's MUFU.EX2 should sit
between the wait for S (WARPGROUP.DEPBAR.LE gsb0, 0x1) and the wait for P V (..., 0x0); ptxas
moving the second wait above them serializes the softmax after P V (perf-notes "prefill v6").
"""
from __future__ import annotations

import inspect
import itertools
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from aot import contract
from aot import flash_fwd_gluon as fg
from aot.tiles import gluon_config

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


# Descriptor parameters of key rows (BLOCK_N): the ABI's K and V, and present's Kout and Vout of
# lab/experiments/gqa_append.py's entry; the other descriptors have query rows (BLOCK_M).
KEY_DESCRIPTORS = ("K", "V", "Kout", "Vout")


def compile_variant(dtype: str, d: int, cfg: dict, fn=None):
    """One variant's CompiledKernel of `fn` (flash_fwd_gluon, or an entry with its ABI and more
    key-row descriptors); `cfg` holds BLOCK_M, BLOCK_N, NUM_STAGES, num_warps and optionally
    OVERLAP_PV."""
    fn = fn or fg.flash_fwd_gluon
    types = dict(contract.ABIS[contract.KIND_ABIS["fwd_gluon"]])
    sig = {}
    for name in inspect.signature(fn.fn).parameters:
        if name in contract.TMA_ARGS or name in KEY_DESCRIPTORS:
            sig[name] = fg.desc_signature(dtype, cfg["BLOCK_N" if name in KEY_DESCRIPTORS else "BLOCK_M"], d)
        else:  # aot/contract.py's types, as aot/build.py gives them (no mask)
            sig[name] = contract.triton_type(types[name], dtype, "none") if name in types else "constexpr"
    consts = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=d, NUM_STAGES=cfg["NUM_STAGES"])
    if "OVERLAP_PV" in cfg:
        consts["OVERLAP_PV"] = cfg["OVERLAP_PV"]
    src = GluonASTSource(fn, sig, consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=cfg["num_warps"]))


def cuobjdump(ck, flag: str) -> str:
    """cuobjdump's output for a CompiledKernel's cubin (-res-usage, --dump-sass)."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(ck.asm["cubin"])
        return subprocess.run([str(BIN / "cuobjdump"), flag, str(cubin)], capture_output=True, text=True,
                              check=True).stdout


def resources(ck) -> dict:
    """Registers a thread, stack bytes (spills) and shared memory of a CompiledKernel."""
    res = cuobjdump(ck, "-res-usage")
    return dict(registers=int(re.search(r"REG:(\d+)", res).group(1)),
                stack=int(re.search(r"STACK:(\d+)", res).group(1)), shared=ck.metadata.shared)


def loop_overlap(sass: str) -> list[int]:
    """For each wait for S (DEPBAR.LE gsb0, 0x1), the MUFU.EX2 count before the next wait."""
    counts, n = [], None
    for line in sass.splitlines():
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in line:
            n = 0
        elif "WARPGROUP.DEPBAR.LE" in line and n is not None:
            counts.append(n)
            n = None
        elif "MUFU.EX2" in line and n is not None:
            n += 1
    return counts


def report(dtypes, head_dims, cfgs) -> int:
    for dt, d, cfg in itertools.product(dtypes, head_dims, cfgs):
        if cfg and cfg.get("BLOCK_D", d) != d:
            continue
        full = dict(gluon_config(dt, d, False), **{k: v for k, v in (cfg or {}).items() if k != "BLOCK_D"})
        ck = compile_variant(dt, d, full)
        r, sass = resources(ck), cuobjdump(ck, "--dump-sass")
        serial = sass.count("HGMMA") and all(
            "DEPBAR" in nxt for cur, nxt in zip(sass.splitlines(), sass.splitlines()[2:]) if "HGMMA" in cur)
        print(f"{dt} d{d} {full}: {r['registers']} registers, stack {r['stack']} B, shared {r['shared']} B, "
              f"{ck.metadata.num_warps} warps; MUFU.EX2 between the S and P V waits: "
              f"{loop_overlap(sass)}{'  (every HGMMA waited: serialized)' if serial else ''}", flush=True)
    return 0
