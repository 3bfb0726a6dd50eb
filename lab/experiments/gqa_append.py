"""A GroupQueryAttention first prompt with the new K and V appended by the attention kernel itself
(aot/flash_fwd_gluon.py `attend` with APPEND_KV), against what the op runs now: the prepare
kernel (aot/gqa_prepare.py MODE 0: K turned by the rotary, K and V written to present) and then
the one-partition Gluon kernel reading present, Q turned on load. JIT on an sm_90 GPU. Not built,
not shipped: it measures whether the fused append is worth a place in the op.

Inputs as GenAI's builder writes them: packed QKV (B, S, (Hq + 2 Hkv) D), half-split rotary over
the whole head, no position_ids, present a buffer of `--capacity-extra` rows more than S, 32/8
heads, B x S = `--tokens`.

Checked first (every shape, fp16 and bf16; Y, Lse and present NaN-poisoned before each run): the
fused path's Y, Lse and present rows [0, S) against a float32 torch reference (tolerance of the
dtype; no NaN left), and bit for bit against the prepare path's, which reads the same rounded K
(the same fp32 rotary in the same order): how many elements differ is recorded. A right-padded batch (each row's key count below S, so that
the rows past it are written by the pass after the attention) and present rows past S left as
they were are checked too.

Then timed (triton.testing.do_bench medians, fresh inputs), with the rotary and without it (a node
whose rotary is done outside it: the fused path then turns nothing): the prepare path (both
kernels, and each alone), the fused path, and the plain kernel on the already-rotated tensors (ort_flash's FlashAttention on
the same attention, the drop-in's yardstick), with cuDNN (torch SDPA, K/V heads repeated) for context.
Prints a table, writes JSON.

    python3 lab/experiments/gqa_append.py --d 64 128 --seqlens 128 512 1024 2048 --out gqa-append.json
    python3 lab/experiments/gqa_append.py --sass     # no GPU: registers, spills, shared memory
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402

from aot import flash_fwd_gluon as fg  # noqa: E402
from aot.contract import ordered_args  # noqa: E402
from aot.tiles import gluon_config, gqa_tile  # noqa: E402

HQ, HKV = 32, 8
DEVICE = "cuda"  # tests record the launches on the CPU
# Checked shapes: (batch, S, right-padded, rotary); odd lengths, one row, ragged last blocks.
CHECKS = ((3, 77, False, True), (2, 200, True, True), (4, 129, True, True), (1, 64, False, True),
          (2, 300, True, True), (2, 150, True, False))


@gluon.jit
def flash_fwd_gluon_append(
    Q, K, V, Y, Lse, Mask, SeqlensK,
    scale, softcap,
    Hq, group, Sq, Skv, D, Dv, offset, causal, window_left, window_right, mask_len, has_seqlens,
    store_lse,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_yb, stride_yh, stride_ym,
    stride_mb, stride_mh, stride_mm,
    TileCounter, Cos, Sin, rotary_half, max_position, Kout, Vout,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, NUM_STAGES: gl.constexpr,
    OVERLAP_PV: gl.constexpr = False,
):
    """flash_fwd_gluon's ABI and two descriptors more: Kout and Vout over present's first Sq rows."""
    fg.attend(Q, K, V, Y, Lse, Mask, SeqlensK, scale, Hq, group, Sq, Skv, offset, causal, has_seqlens, store_lse,
              Cos, Sin, rotary_half, max_position, Kout, Vout, BLOCK_M, BLOCK_N, BLOCK_D, NUM_STAGES, OVERLAP_PV,
              True)


def sass(dtypes, head_dims) -> list[dict]:
    """Compile the fused kernel (and the shipped one beside it) for sm_90 as aot/build.py would,
    on any machine: registers, spills, shared memory."""
    from gluon_sass import compile_variant, resources
    rows = []
    for dt in dtypes:
        for d in head_dims:
            cfg = gluon_config(dt, d, True)
            for name, fn in (("shipped", fg.flash_fwd_gluon), ("append", flash_fwd_gluon_append)):
                row = dict(kernel=name, dtype=dt, head_dim=d, **resources(compile_variant(dt, d, cfg, fn)), **cfg)
                print(f"{name:8s} {dt} d{d}: {row['registers']} registers, stack {row['stack']} B, "
                      f"shared {row['shared']} B", flush=True)
                rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# On the GPU.

def _inputs(torch, b, s, d, dt, cap_extra, seed):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    qkv = torch.randn(b, s, (HQ + 2 * HKV) * d, device=DEVICE, dtype=dt, generator=g)
    max_pos = s + cap_extra + 7
    half = d // 2
    inv = 1.0 / (10000.0 ** (torch.arange(0, half, device=DEVICE, dtype=torch.float64) / half))
    ang = torch.arange(max_pos, device=DEVICE, dtype=torch.float64)[:, None] * inv[None, :]
    return qkv, ang.cos().to(dt).contiguous(), ang.sin().to(dt).contiguous()


def _views(qkv, d):
    """Packed QKV's Q, K, V heads as (B, H, S, D) views (strided, in place)."""
    b, s, _ = qkv.shape
    x = qkv.view(b, s, HQ + 2 * HKV, d).permute(0, 2, 1, 3)
    return x[:, :HQ], x[:, HQ:HQ + HKV], x[:, HQ + HKV:]


def _desc(t, rows, d):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, d], fg.desc_layout())


class Case:
    """One first prompt: inputs, present (capacity S + cap_extra), the key counts T_b."""

    def __init__(self, torch, b, s, d, dt, seqlens, cap_extra, seed, rotary=True, tile=None):
        self.torch, self.b, self.s, self.d, self.dt, self.rotary = torch, b, s, d, dt, rotary
        self.qkv, self.cos, self.sin = _inputs(torch, b, s, d, dt, cap_extra, seed)
        self.cap = s + cap_extra
        self.totals = torch.tensor(seqlens, dtype=torch.int64, device=DEVICE)
        # The shipped tile, or `tile` (BLOCK_M, BLOCK_N, NUM_STAGES, num_warps) for every kernel.
        self.cfg = gluon_config({torch.float16: "fp16", torch.bfloat16: "bf16"}[dt], d, True)
        if tile:
            self.cfg = dict(zip(("BLOCK_M", "BLOCK_N", "NUM_STAGES", "num_warps"), tile))
        self.pk = torch.empty(b, HKV, self.cap, d, device=DEVICE, dtype=dt)
        self.pv = torch.empty_like(self.pk)
        self.y = torch.empty(b, HQ, s, d, device=DEVICE, dtype=dt)
        self.lse = torch.empty(b * HQ * s, device=DEVICE, dtype=torch.float32)
        self.null = torch.empty(1, dtype=torch.int8, device=DEVICE)

    def poison(self):
        for t in (self.pk, self.pv, self.y, self.lse):
            t.fill_(float("nan"))

    def _descs(self, q, k, v, y) -> dict:
        """Q, K, V and Y as TMA descriptors at the case's tile."""
        c = self.cfg
        return dict(Q=_desc(q, c["BLOCK_M"], self.d), K=_desc(k, c["BLOCK_N"], self.d),
                    V=_desc(v, c["BLOCK_N"], self.d), Y=_desc(y, c["BLOCK_M"], self.d))

    def _launch(self, kernel, args):
        """One launch of a one-partition kernel at the case's tile: a CTA per query tile and head."""
        c = self.cfg
        kernel[(-(-self.s // c["BLOCK_M"]), self.b * HQ)](
            *args, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_D=self.d, NUM_STAGES=c["NUM_STAGES"],
            num_warps=c["num_warps"])

    def _args(self, k, v):
        """The FwdGluon arguments of a first prompt over keys k, v: causal, Q read from packed QKV
        (turned on load with the rotary), each row's keys bounded at T_b."""
        from tune import fwd_values
        q, _, _ = _views(self.qkv, self.d)
        # Without rotary the tables stay (never read: no row turns), as the op passes them.
        rope = dict(Cos=self.cos, Sin=self.sin, rotary_half=self.d // 2 if self.rotary else 0,
                    max_position=self.cos.shape[0] if self.rotary else 0)
        args = fwd_values(q, k, v, self.y, self.lse, **self._descs(q, k, v, self.y), Mask=self.null,
                          SeqlensK=self.totals, TileCounter=self.null, causal=1, has_seqlens=1, **rope)
        return ordered_args("fwd_gluon", args)

    def prepare(self):
        """The op's prepare kernel: K turned (with rotary) and K, V written to present (q_heads 0: Q
        is turned on load)."""
        from aot.gqa_prepare import gqa_prepare
        torch = self.torch
        b, s, d = self.b, self.s, self.d
        q_in = self.qkv
        w = self.qkv.stride(1)
        seqlens = (self.totals - 1).to(torch.int32)
        tot = torch.empty(b, dtype=torch.int64, device=self.qkv.device)
        rows, gather, warps, _ = gqa_tile(d)
        none = torch.empty(1, dtype=self.dt, device=self.qkv.device)  # QRot, QNorm, KNorm: unused
        pos = torch.empty(1, dtype=torch.int64, device=self.qkv.device)  # no position_ids
        args = [q_in, q_in[..., HQ * d:], q_in[..., (HQ + HKV) * d:], self.pk, self.pv, self.pk, self.pv, none,
                self.cos, self.sin, self.pk, self.pv, pos, seqlens, tot, self.null, none, none,
                s, HQ, HKV, d, 0, int(self.rotary), d // 2 if self.rotary else 0, self.cos.shape[0], 0,
                1, 0, s, self.cap, self.cap, 0, 0, 1, 0, 1, 1e-6,
                q_in.stride(0), w, q_in.stride(0), w, q_in.stride(0), w]
        gqa_prepare[(b * -(-s * 2 * HKV // rows),)](*args, BLOCK_ROWS=rows, BLOCK_D=d, GATHER_ROWS=gather, MODE=0,
                                                    num_warps=warps)
        return tot

    def run_attention(self):
        """The attention the op runs after the prepare kernel: present's keys, Q turned on load."""
        self._launch(fg.flash_fwd_gluon, self._args(self.pk[:, :, :self.s], self.pv[:, :, :self.s]))

    def run_prepare_path(self):
        self.prepare()
        self.run_attention()

    def run_fused(self):
        _, k, v = _views(self.qkv, self.d)
        present = [_desc(t[:, :, :self.s], self.cfg["BLOCK_N"], self.d) for t in (self.pk, self.pv)]
        self._launch(flash_fwd_gluon_append, [*self._args(k, v), *present])

    def rotated(self):
        """Q, K, V with the rotary (where on) applied in float32 by torch, (B, H, S, D)."""
        torch = self.torch
        q, k, v = (x.float() for x in _views(self.qkv, self.d))
        half = self.d // 2
        c = self.cos[:self.s].float()[None, None]
        s = self.sin[:self.s].float()[None, None]

        def turn(x):
            if not self.rotary:
                return x
            lo, hi = x[..., :half], x[..., half:]
            return torch.cat([lo * c - hi * s, hi * c + lo * s], dim=-1)
        return turn(q), turn(k), v

    def run_plain(self, q, k, v, y, lse):
        """The one-partition kernel on rotated contiguous tensors, no key bound: the plain op's attention."""
        from tune import fwd_values
        args = fwd_values(q, k, v, y, lse, **self._descs(q, k, v, y), Mask=self.null, SeqlensK=self.null,
                          TileCounter=self.null, causal=1, Cos=self.null, Sin=self.null, rotary_half=0,
                          max_position=0)
        self._launch(fg.flash_fwd_gluon, ordered_args("fwd_gluon", args))


def _difference(torch, got, want) -> dict:
    """How `got` differs from `want` bit for bit: the elements whose bits differ (NaN against NaN
    alike) and the largest difference between finite values."""
    bits = got.view(torch.int16) != want.view(torch.int16) if got.dtype != torch.float32 else \
        got.nan_to_num(nan=-7.0) != want.nan_to_num(nan=-7.0)
    diff = (got.float() - want.float()).abs().nan_to_num(nan=0.0)
    return dict(elements=int(bits.sum()), max_abs=float(diff.max()))


def check(torch, d, dt, b, s, padded, seed, rotary=True, tile=None) -> dict:
    rng = torch.Generator().manual_seed(seed)
    seqlens = ([int(x) for x in torch.randint(max(1, s // 3), s + 1, (b,), generator=rng)] if padded else [s] * b)
    if padded:
        seqlens[0] = s  # one full row beside the padded ones
    c = Case(torch, b, s, d, dt, seqlens, cap_extra=9, seed=seed, rotary=rotary, tile=tile)
    what = f"d{d} {dt} B{b} S{s}{' padded' if padded else ''}{'' if rotary else ' no rotary'} tile {c.cfg}"
    tail = torch.randn(b, HKV, c.cap - s, d, device=DEVICE).to(dt)  # present's rows past S: kept

    def run(path):
        c.poison()
        c.pk[:, :, s:] = tail
        c.pv[:, :, s:] = tail
        path()
        torch.cuda.synchronize()
        return [t.clone() for t in (c.y, c.lse, c.pk, c.pv)]

    want = run(c.run_prepare_path)
    run(c.run_fused)
    # Bit for bit against the prepare path (the same rounded K, the same kernel arithmetic): recorded,
    # not required (a compiler's different contraction would round apart; the float32 check decides).
    diffs = {name: _difference(torch, got, ref)
             for got, ref, name in zip((c.y, c.lse, c.pk, c.pv), want, ("Y", "Lse", "present K", "present V"))}
    if any(torch.isnan(t).any() for t in (c.y, c.lse, c.pk[:, :, :s], c.pv[:, :, :s])):
        raise AssertionError(f"{what}: NaN left in the fused path's outputs (an element it did not write)")
    # Against float32: each row b attends its first T_b keys, rows past T_b are any value.
    q, k, v = c.rotated()
    ref = torch.empty(b, HQ, s, d, device=DEVICE)
    for i, t in enumerate(seqlens):
        kk = k[i:i + 1, :, :t].repeat_interleave(HQ // HKV, 1)
        vv = v[i:i + 1, :, :t].repeat_interleave(HQ // HKV, 1)
        mask = torch.arange(t, device=DEVICE)[None, :] <= torch.arange(s, device=DEVICE)[:, None]
        ref[i:i + 1] = torch.nn.functional.scaled_dot_product_attention(q[i:i + 1], kk, vv, attn_mask=mask)
    err = (c.y.float() - ref).abs().max().item()
    tol = 1e-2 if dt == torch.float16 else 4e-2
    k_err = (c.pk[:, :, :s].float() - k).abs().max().item()
    v_err = (c.pv[:, :, :s].float() - v).abs().max().item()
    if not (err <= tol and k_err <= tol and v_err == 0.0):
        raise AssertionError(f"{what}: against float32 |Y| {err:.3g}, |K| {k_err:.3g}, |V| {v_err:.3g}")
    if not (torch.equal(c.pk[:, :, s:], tail) and torch.equal(c.pv[:, :, s:], tail)):
        raise AssertionError(f"{what}: present rows past S changed")
    identical = all(x["elements"] == 0 for x in diffs.values())
    print(f"check {what}: {'bit-identical to the prepare path' if identical else f'differs from the prepare path {diffs}'}"
          f"; against float32 |Y| {err:.2g}, |K| {k_err:.2g}", flush=True)
    return dict(d=d, dtype=str(dt), b=b, s=s, padded=padded, rotary=rotary, tile=c.cfg, y_err=err, k_err=k_err,
                bit_identical=identical, differences=diffs)


def timings(torch, d, dt, s, tokens, seed, rotary=True, tile=None, batch=0, graph=False) -> dict:
    """Each path's median time at one shape: B = `batch`, else tokens // s. With `graph` each is a
    CUDA graph's replay (do_bench_cudagraph), for shapes small enough that a Python launch would
    outlast the kernels (batch 1: a first prompt's time to first token)."""
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b = batch or max(1, tokens // s)
    c = Case(torch, b, s, d, dt, [s] * b, cap_extra=0, seed=seed, rotary=rotary, tile=tile)
    q, k, v = (x.to(dt).contiguous() for x in c.rotated())
    y = torch.empty_like(q)
    lse = torch.empty(b * HQ * s, device=DEVICE, dtype=torch.float32)
    kr, vr = k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, kr, vr, is_causal=True)

    def bench(fn):
        if graph:
            fn()  # compiled and warm before the capture
            return triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median")
        return triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")

    ms = dict(prepare_path=bench(c.run_prepare_path), prepare_only=bench(c.prepare), attention_only=bench(c.run_attention),
              fused=bench(c.run_fused), plain=bench(lambda: c.run_plain(q, k, v, y, lse)), cudnn=bench(cudnn))
    flops = 4 * b * HQ * s * s * d / 2
    row = dict(d=d, dtype=str(dt), b=b, s=s, rotary=rotary, tile=c.cfg, graph=graph, ms=ms, tflops={k_: flops / t * 1e-9 for k_, t in ms.items()},
               fused_over_prepare_path=ms["prepare_path"] / ms["fused"], plain_over_fused=ms["plain"] / ms["fused"],
               plain_over_prepare_path=ms["plain"] / ms["prepare_path"])
    tile_name = ",".join(str(c.cfg[k_]) for k_ in ("BLOCK_M", "BLOCK_N", "NUM_STAGES", "num_warps"))
    print(f"d{d} {str(dt):14s} {tile_name:12s} {'rotary' if rotary else 'none  '} {b:4d}x{s:<6d} prepare+attn "
          f"{ms['prepare_path'] * 1e3:8.1f} us (prepare {ms['prepare_only'] * 1e3:6.1f}, attention "
          f"{ms['attention_only'] * 1e3:6.1f})  fused {ms['fused'] * 1e3:8.1f}  plain {ms['plain'] * 1e3:8.1f}  "
          f"cuDNN {ms['cudnn'] * 1e3:8.1f}  | fused gain {row['fused_over_prepare_path']:.2f}x  "
          f"plain/fused {row['plain_over_fused']:.2f}  plain/prepare path {row['plain_over_prepare_path']:.2f}",
          flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[128, 512, 1024])
    ap.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"], choices=["fp16", "bf16"])
    ap.add_argument("--tokens", type=int, default=16384, help="batch x sequence length of each timed shape")
    ap.add_argument("--batch", type=int, default=0, help="this batch at every length instead (--tokens ignored)")
    ap.add_argument("--graph", action="store_true", help="time CUDA graph replays (small shapes)")
    ap.add_argument("--tiles", nargs="*", default=[], metavar="D:BM,BN,STAGES,WARPS",
                    help="tiles to check and time besides the shipped one (every kernel of both paths at it)")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--no-check", action="store_true", help="time only (an earlier run checked these tiles)")
    ap.add_argument("--sass", action="store_true", help="no GPU: compile for sm_90 and print registers")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    doc = dict(args=vars(a) | {"out": str(a.out)})
    if a.sass:
        doc["sass"] = sass(a.dtypes, a.d)
    else:
        import torch
        sys.path.insert(0, str(HERE))
        dts = {"fp16": torch.float16, "bf16": torch.bfloat16}
        doc["device"] = torch.cuda.get_device_name()
        doc["checks"] = []
        tiles = {d: [None] for d in a.d}
        for item in a.tiles:
            d, tile = item.split(":")
            if int(d) in tiles:
                tiles[int(d)].append(tuple(int(x) for x in tile.split(",")))
        for dt in [] if a.no_check else a.dtypes:
            for d in a.d:
                for (b, s, padded, rotary), tile in itertools.product(CHECKS, tiles[d]):
                    doc["checks"].append(check(torch, d, dts[dt], b, s, padded, seed=len(doc["checks"]),
                                               rotary=rotary, tile=tile))
        if not a.no_check:
            same = sum(r["bit_identical"] for r in doc["checks"])
            print(f"checks: {len(doc['checks'])} cases within the dtype of float32, no NaN; {same} bit-identical to "
                  f"the prepare path", flush=True)
        if not a.check_only:
            doc["timings"] = [timings(torch, d, dts[dt], s, a.tokens, seed=7, rotary=rotary, tile=tile,
                                      batch=a.batch, graph=a.graph)
                              for dt in a.dtypes for d in a.d for tile in tiles[d] for rotary in (True, False)
                              for s in a.seqlens]
    if a.out:
        a.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
