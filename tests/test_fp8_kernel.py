"""The FP8 (e4m3) attention kernels (aot/fp8_prepare.py, aot/flash_fwd_fp8.py) on the CPU.

1. Under Triton's interpreter (a subprocess with TRITON_INTERPRET=1), prepare + attention on odd
   shapes (N 200 and 77, not multiples of the tiles), head dims 64 and 128, causal and not, fp16
   and bf16, BHSD and BSHD inputs, multi-head and grouped-query (6 query heads over 2 key heads,
   4 over 1), every output buffer poisoned with NaN first, against the float64
   reference (ort_flash.reference) on FlashAttention-3's outlier inputs (N(0, 1), 0.1 % N(0, 10)).

   The interpreter's own float8 conversion is wrong (it truncates the mantissa and loses the carry
   of a round-up: 1.97 becomes 1.0, 31.9 becomes 16) and does not saturate, so `_exact_fp8` routes
   every conversion to or from e4m3 through torch.float8_e4m3fn (round to nearest even; clamped to
   ±448 first, as sm_90's cvt.rn.satfinite does). The interpreter's FP8 dot upcasts the e4m3 codes
   (exactly, then) and multiplies in fp32: each product of two e4m3 values is exact in fp32, sums in
   fp32. What this proves: the kernels' indexing, padding, masking, scales, rotation, smoothing,
   online softmax and dequantization, and the error of the scheme as the kernels compute it. What
   it does not: the GPU's own FP8 tensor-core arithmetic (wgmma accumulates FP8 products with fewer
   than fp32's bits before adding them to the accumulator) or anything about speed; those need the
   GPU (lab/experiments/fp8_kernel_bench.py).

   The error bound: `emulate` computes the same scheme in float64 with ml_dtypes' e4m3 rounding
   (same rotation, blocks, scales, online softmax block by block). The kernel must match it (RMSE
   of the difference at most a tenth of the scheme's own error, plus the output dtype's rounding)
   and stay under ABS_BOUND: the emulated RMSE's maximum over 160 draws per head dim (40 seeds x
   the 4 shapes of CASES, B 1, H 3) plus 20 %; the maxima were 2.02e-2 (d64) and 1.99e-2 (d128),
   the means 1.37e-2 and 1.27e-2 (small N averages fewer keys, so outputs and errors are larger
   than at N >= 512, where the emulation gives 1.06-1.25e-2 at d64 and 0.69-0.99e-2 at d128). The
   log-sum-exp likewise: within 1e-4 of the emulation's, and under LSE_BOUND (the emulation's
   largest error over those draws, 0.50, plus 20 %: an outlier query's scores are large, and so is
   their e4m3 error). A wrong scale (every K block scale 1.25x, or V's channel scales permuted)
   must fail both RMSE checks.

2. AOT: the build's FP8 variants (aot/variants.py fp8_variants) compiled for sm_90 as aot/build.py
   compiles them (no GPU), D 64/128 x causal/not x fp16/bf16; the attention's PTX must hold FP8 wgmma (wgmma.mma_async ... e4m3) for
   both products, with no spills and shared memory under sm_90's limit.

3. The GPU benchmark (lab/experiments/fp8_kernel_bench.py) answers --help and, without CUDA,
   exits 1 with a one-line reason.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
from _paths import ROOT, child_env

# The FP8 error study's inputs, rounding and error measure (its scheme emulation is this file's own).
from lab.experiments.fp8_error import E4M3_MAX, e4m3, outlier_inputs, rmse

P_SCALE = 256.0
ABS_BOUND = {64: 2.45e-2, 128: 2.4e-2}
LSE_BOUND = 0.6

CASES = [
    dict(n=200, d=64, causal=False, dtype="float16", bm=64, bn=32),
    dict(n=77, d=64, causal=True, dtype="float16", bm=32, bn=32, layout="bshd"),
    dict(n=77, d=64, causal=False, dtype="bfloat16", bm=64, bn=64),
    dict(n=200, d=64, causal=True, dtype="bfloat16", bm=64, bn=32, layout="bshd"),
    dict(n=200, d=128, causal=True, dtype="float16", bm=128, bn=128),
    dict(n=77, d=128, causal=False, dtype="float16", bm=32, bn=32, layout="bshd"),
    dict(n=200, d=128, causal=False, dtype="bfloat16", bm=128, bn=128, layout="bshd"),
    dict(n=77, d=128, causal=True, dtype="bfloat16", bm=64, bn=32),
    # Grouped-query attention: 6 query heads over 2 key heads, 2 batch rows.
    dict(n=77, d=64, causal=True, dtype="float16", bm=32, bn=32, b=2, h=6, hkv=2, layout="bshd"),
    dict(n=200, d=128, causal=False, dtype="bfloat16", bm=64, bn=32, b=2, h=4, hkv=1),
]


# ---------------------------------------------------------------- the scheme, emulated in float64

def rotation(d: int) -> np.ndarray:
    """aot/fp8_prepare.py's R (orthonormal): diag(s) H / sqrt(d)."""
    def parity(x):
        x = x ^ (x >> 4)
        x = x ^ (x >> 2)
        return (x ^ (x >> 1)) & 1
    i = np.arange(d)[:, None]
    flip = parity(i & np.arange(d)[None, :]) ^ parity((i * 181 + 57) & 255)
    return np.where(flip == 1, -1.0, 1.0) / math.sqrt(d)


def _blocks(x: np.ndarray, rows: int) -> np.ndarray:
    """x (n, d) through e4m3 with one scale (max |x| / 448) per block of rows, dequantized."""
    out = np.empty_like(x)
    for i in range(0, x.shape[0], rows):
        amax = max(np.abs(x[i:i + rows]).max(), 1e-30)
        out[i:i + rows] = e4m3(x[i:i + rows] * (E4M3_MAX / amax)) * (amax / E4M3_MAX)
    return out


def emulate(q, k, v, causal: bool, bm: int, bn: int) -> tuple[np.ndarray, np.ndarray]:
    """One head's output (n, d) and log-sum-exp (n,) as the FP8 kernels compute them, in float64
    but for the e4m3 roundings."""
    n, d = q.shape
    r = rotation(d)
    qq = _blocks(q @ r, bm)
    kq = _blocks(k @ r - k.mean(0) @ r, bn)
    vmax = np.maximum(np.abs(v).max(0), 1e-30)
    v8 = e4m3(v * (E4M3_MAX / vmax))
    s = qq @ kq.T / math.sqrt(d)
    if causal:
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    m = np.full(n, -np.inf)
    l = np.zeros(n)
    acc = np.zeros((n, d))
    for j in range(0, n, bn):
        blk = s[:, j:j + bn]
        m_new = np.maximum(m, blk.max(1))
        p = np.exp(blk - m_new[:, None])
        alpha = np.exp(m - m_new)
        l = l * alpha + p.sum(1)
        acc = acc * alpha[:, None] + e4m3(p * P_SCALE) @ v8[j:j + bn]
        m = m_new
    lse = m + np.log(l) + q @ k.mean(0) / math.sqrt(d)
    return acc * (vmax / E4M3_MAX) / (P_SCALE * l[:, None]), lse


# ---------------------------------------------------------------- the interpreter run

def _interpreted(arg: str, timeout: int = 300) -> list[dict]:
    """Runs this file's check `arg` in a subprocess under TRITON_INTERPRET=1; its JSON lines."""
    pytest.importorskip("torch", reason="the Triton interpreter runs on torch CPU tensors")
    pytest.importorskip("triton", reason="the kernel source needs Triton")
    pytest.importorskip("ml_dtypes", reason="the emulation rounds with ml_dtypes' e4m3")
    env = child_env(TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, __file__, arg], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def _exact_fp8():
    """The interpreter's float conversions done by torch (see the module docstring; its own also
    truncates fp32 to bf16, where the GPU rounds to nearest even), its bf16 dots on the values (it multiplies bf16's stored bit patterns as integers otherwise),
    and its loop bounds read from 1-element arrays (int(array) is refused by numpy >= 2.4)."""
    import torch
    import triton.language as tl
    import triton.runtime.interpreter as interp

    torch_of = {tl.float16: torch.float16, tl.bfloat16: torch.bfloat16, tl.float32: torch.float32,
                tl.float64: torch.float64, tl.float8e4nv: torch.float8_e4m3fn}
    bits_of = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}
    original = interp._convert_float
    _RTZ = interp._ir.ROUNDING_MODE.RTZ

    def convert(data, src, dst, rounding_mode):
        if src not in torch_of or dst not in torch_of or rounding_mode == _RTZ:
            return original(data, src, dst, rounding_mode)
        raw = np.ascontiguousarray(data)
        t = torch.from_numpy(raw.view(f"int{src.primitive_bitwidth}")).view(torch_of[src])
        if dst == tl.float8e4nv:
            t = t.to(torch.float32).clamp(-E4M3_MAX, E4M3_MAX)
        out = t.to(torch_of[dst]).view(bits_of[dst.primitive_bitwidth]).numpy()
        return out.view(f"uint{dst.primitive_bitwidth}").reshape(data.shape)

    interp._convert_float = convert
    dot = interp.InterpreterBuilder.create_dot

    def exact_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a, b = (interp.TensorHandle(convert(x.data, tl.bfloat16, tl.float32, None).view(np.float32), tl.float32)
                if x.dtype.scalar == tl.bfloat16 else x for x in (a, b))
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    interp.InterpreterBuilder.create_dot = exact_dot
    from test_kernel_interpreter import _patch_interpreter

    _patch_interpreter()


def prepare_fp8(q, k, v, bm: int, bn: int) -> dict:
    """aot/fp8_prepare.py's two kernels under the interpreter on torch tensors q, k, v (logical
    [B, H, N, D], any strides with a contiguous head dim), every buffer poisoned first."""
    import torch

    from aot.fp8_prepare import buffer_specs, fp8_quantize, fp8_stats, padded_len, stats_splits

    b, h, n, d = q.shape
    hkv = k.shape[1]
    splits = stats_splits(b, hkv, n, bn, sms=2)
    bufs = {}
    for name, (shape, dt) in buffer_specs(b, h, hkv, n, d, bm, bn, splits).items():
        if dt == "fp8e4nv":  # 0x7F: e4m3's NaN
            bufs[name] = torch.full(shape, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)
        else:
            bufs[name] = torch.full(shape, float("nan"), dtype=torch.float32)
    fp8_stats[(splits, b * hkv)](k, v, bufs["Part"], hkv, n, splits, *k.stride()[:3], *v.stride()[:3],
                                 BLOCK_N=bn, HEAD_DIM=d)
    fp8_quantize[(padded_len(n, bm, bn) // min(bm, bn), b * h, 2)](
        q, k, v, bufs["Part"], bufs["Q8"], bufs["K8"], bufs["V8t"], bufs["ScaleQ"], bufs["ScaleK"],
        bufs["ScaleV"], bufs["QBias"], h, h // hkv, n, splits, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=d)
    return bufs


def attend_fp8(bufs: dict, n: int, causal: bool, bm: int, bn: int, dtype, bshd: bool):
    """aot/flash_fwd_fp8.py under the interpreter; y (logical [B, H, N, D], stored BSHD or BHSD)
    and the log-sum-exp poisoned first."""
    import torch

    from aot.flash_fwd_fp8 import flash_fwd_fp8

    b, h, _, d = bufs["Q8"].shape
    group = h // bufs["K8"].shape[1]
    y = torch.full((b, n, h, d) if bshd else (b, h, n, d), float("nan"), dtype=dtype)
    y = y.permute(0, 2, 1, 3) if bshd else y
    lse = torch.full((b, h, n), float("nan"))
    flash_fwd_fp8[(math.ceil(n / bm), b * h)](
        bufs["Q8"], bufs["K8"], bufs["V8t"], bufs["ScaleQ"], bufs["ScaleK"], bufs["ScaleV"], bufs["QBias"],
        y, lse, 1 / math.sqrt(d), h, group, n, 1, *y.stride()[:3], BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=d, CAUSAL=causal)
    return y, lse


def check_cases():
    import torch

    from ort_flash.reference import attention_reference

    _exact_fp8()
    for case in CASES:
        c = dict(dict(b=1, h=3, layout="bhsd"), **case)
        b, h, n, d, bm, bn = c["b"], c["h"], c["n"], c["d"], c["bm"], c["bn"]
        hkv = c.get("hkv", h)
        rng = np.random.default_rng([11, n, d, int(c["causal"]), len(c["dtype"])])
        dt = getattr(torch, c["dtype"])
        qkv = []
        for heads in (h, hkv, hkv):
            x = torch.from_numpy(outlier_inputs(rng, (b, heads, n, d))).to(dt)
            if c["layout"] == "bshd":
                x = x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
            qkv.append(x)
        q, k, v = qkv
        qn, kn, vn = (x.double().numpy() for x in qkv)  # the rounded inputs both sides see
        ref, _, _, ref_lse = attention_reference(qn, kn, vn, scale=1 / math.sqrt(d), is_causal=c["causal"])
        group = h // hkv
        emus = [[emulate(qn[i, j], kn[i, j // group], vn[i, j // group], c["causal"], bm, bn) for j in range(h)]
                for i in range(b)]
        emu = np.stack([[e[0] for e in row] for row in emus])
        emu_lse = np.stack([[e[1] for e in row] for row in emus])
        bufs = prepare_fp8(q, k, v, bm, bn)
        y, lse = attend_fp8(bufs, n, c["causal"], bm, bn, dt, c["layout"] == "bshd")
        got = y.double().numpy()
        written = {name: not torch.isnan(t.float()).any().item() for name, t in bufs.items()}
        np_ = bufs["Q8"].shape[2]
        pad_zero = all(bool((t.float() == 0).all()) for t in (
            bufs["Q8"][:, :, n:], bufs["K8"][:, :, n:], bufs["V8t"][..., n:]))

        def mutated(name, factor=None, perm=None):
            wrong = {key: t.clone() for key, t in bufs.items()}
            if factor is not None:
                wrong[name].mul_(factor)
            if perm is not None:
                wrong[name].copy_(wrong[name][..., perm])
            return rmse(attend_fp8(wrong, n, c["causal"], bm, bn, dt, False)[0].double().numpy(), ref)

        out = dict(case=case, nan=bool(np.isnan(got).any()), written=written, pad_zero=pad_zero, np=np_,
                   rmse=rmse(got, ref), rmse_emulated=rmse(emu, ref), rmse_vs_emulated=rmse(got, emu),
                   out_rms=rmse(ref, 0), lse_err=float(np.abs(lse.double().numpy() - ref_lse).max()),
                   lse_err_emulated=float(np.abs(emu_lse - ref_lse).max()),
                   lse_vs_emulated=float(np.abs(lse.double().numpy() - emu_lse).max()),
                   round_floor=rmse(torch.from_numpy(ref).to(dt).double().numpy(), ref))
        if case is CASES[0] or case is CASES[4]:
            out["mutated_scale_k"] = mutated("ScaleK", factor=1.25)
            out["mutated_scale_v"] = mutated("ScaleV", perm=torch.randperm(d, generator=torch.Generator().manual_seed(0)))
        print(json.dumps(out), flush=True)


def test_fp8_kernels_match_reference_under_interpreter():
    results = _interpreted("cases")
    assert len(results) == len(CASES)
    mutated = 0
    for r in results:
        c, d = r["case"], r["case"]["d"]
        assert not r["nan"] and all(r["written"].values()), r
        assert r["pad_zero"], r
        # The kernel computes the scheme the emulation describes: its distance to the emulation is
        # a tenth of the scheme's error, plus the output's own rounding (bf16: 2^-9 relative).
        assert r["rmse_vs_emulated"] <= 0.1 * r["rmse_emulated"] + 2 * r["round_floor"], r
        assert r["rmse"] <= ABS_BOUND[d], r
        assert r["lse_vs_emulated"] <= 1e-4 and r["lse_err"] <= LSE_BOUND, r
        for key in ("mutated_scale_k", "mutated_scale_v"):
            if key in r:
                mutated += 1
                assert r[key] > 1.5 * ABS_BOUND[d] and r[key] > 2 * r["rmse_emulated"], (key, r)
        print(f"n={c['n']} d={d} causal={c['causal']} {c['dtype']}: rmse {r['rmse']:.3e} "
              f"(emulated {r['rmse_emulated']:.3e}, kernel vs emulation {r['rmse_vs_emulated']:.1e})")
    assert mutated == 4


# ---------------------------------------------------------------- AOT for sm_90

def compile_sm90(name: str) -> dict:
    """The build's variant `name` (aot/variants.py fp8_variants) compiled for sm_90 as aot/build.py
    compiles it (its triton_source: the contract's signature, the table's tile; no GPU); its PTX's
    wgmma instructions and ptxas's register, spill and shared-memory figures."""
    import contextlib
    import io
    import re

    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    from aot import build, variants

    v = {x.name: x for x in variants.fp8_variants()}[name]
    cfg = variants.get_fwd_config(90, v)
    src, options = build.triton_source(v, 90, cfg)[:2]
    log = io.StringIO()
    knobs.nvidia.dump_ptxas_log = True
    with contextlib.redirect_stdout(log):
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    text = log.getvalue()
    spills = [int(x) for pair in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
              for x in pair]
    return dict(kernel=v.kind, name=name, d=v.head_dim, block_n=cfg.block_n, warps=cfg.num_warps,
                stages=cfg.num_stages,
                wgmma=sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.\w+\.\w+\.\w+\.\w+",
                                            compiled.asm["ptx"]))),
                wgmma_count=len(re.findall(r"wgmma\.mma_async", compiled.asm["ptx"])),
                registers=int(re.search(r"Used (\d+) registers", text).group(1)),
                spill_bytes=sum(spills), shared=compiled.metadata.shared)


def test_fp8_kernels_compile_for_sm90_with_fp8_wgmma(tmp_path):
    """Both products of the attention run on e4m3 tensor cores (every wgmma of its PTX is
    .e4m3.e4m3, and there are at least D/32 + BLOCK_N/32 of them: Q·Kᵀ and P·V over k32 steps);
    nothing spills; shared memory within sm_90's 227 KB."""
    pytest.importorskip("triton", reason="the AOT compile needs Triton (and its ptxas)")
    from aot.variants import fp8_variants

    jobs = [v.name for v in fp8_variants()]
    assert len(jobs) == 16  # 2 dtypes x 2 head dims x (stats, quantize, attention causal and not)
    env = {"TRITON_CACHE_DIR": str(tmp_path)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with ProcessPoolExecutor(max_workers=2) as pool:
            facts = list(pool.map(compile_sm90, jobs, timeout=300))
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    for f in facts:
        print(f"{f['name']:28}: {f['warps']} warps {f['stages']} stages, {f['registers']} registers, spills "
              f"{f['spill_bytes']} B, shared {f['shared']} B, {f['wgmma_count']} x {f['wgmma']}")
        assert f["spill_bytes"] == 0, f
        assert f["shared"] <= 227 * 1024, f
        if f["kernel"] == "fwd_fp8":
            assert f["wgmma"] and all(w.endswith(".f32.e4m3.e4m3") for w in f["wgmma"]), f
            assert f["wgmma_count"] >= f["d"] // 32 + f["block_n"] // 32, f
        elif f["kernel"] == "fp8_quantize":  # the rotation: one fp16 / bf16 wgmma per row block
            assert f["wgmma"], f

def test_bench_exits_in_one_line_without_cuda():
    """lab/experiments/fp8_kernel_bench.py answers --help anywhere, and on a machine without CUDA
    says so in one line and exits 1 (it runs on an H100 only)."""
    torch = pytest.importorskip("torch", reason="the benchmark needs torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the benchmark would run")
    script = str(ROOT / "lab" / "experiments" / "fp8_kernel_bench.py")
    assert subprocess.run([sys.executable, script, "--help"], capture_output=True, timeout=60).returncode == 0
    r = subprocess.run([sys.executable, script, "--json", os.devnull], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "needs" in r.stderr, r.stderr

if __name__ == "__main__":
    if sys.argv[1] == "cases":
        check_cases()
