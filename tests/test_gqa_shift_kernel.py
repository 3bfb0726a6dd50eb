"""A windowed cache's decode step past its capacity over present (aot/gqa_prepare.py: present as the
stage, the shift of MODE 3 (its save launch, then its move) or the past copy from row E_b) against the staged path (a stage of C + 1
rows, then the compaction), both run by Triton's CPU interpreter on the same inputs: present must
end bit for bit the same, each row's key count must be L(past_b + 1), and the keys the attention
reads (present's rows [0, L(past_b + 1))) must be the stage's last rows of the row. Random lengths
with rows that drop nothing (E_b = 0), rows at exactly C, rows that first pass C and impossible
rows; a buffer shared with the past and a present of its own (poisoned: every row must be
written; the shift's save buffers poisoned too); fp16 / bf16 / fp32, C = W and C > W; shift blocks
of fewer rows than E_b and of more, the last block ragged. The interpreter runs a grid's programs
one after another; each case runs with them in ascending order and again in descending order,
so that a block that reads a row another block has already moved (a missing save) shows. Each case runs in a subprocess under
TRITON_INTERPRET=1, as tests/test_gqa_prepare_kernel.py does."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from _paths import run_interpreted

from test_gqa_prepare_kernel import GUARD, kept

ROOT = Path(__file__).resolve().parents[1]

# b, hq, hkv, d; cap C, window W; shared: past and present one buffer; rotary 0/1/2 (R = d);
# rows: the shift's BLOCK_ROWS (E_b = G = C - W + 1 below it, at it and above it).
CASES = [
    dict(b=9, hq=4, hkv=2, d=64, cap=12, window=12, shared=True, packed=True, rotary=1, rows=4),
    dict(b=9, hq=4, hkv=2, d=32, cap=12, window=5, shared=True, rotary=2, rows=4, dtype="bfloat16"),
    dict(b=12, hq=2, hkv=1, d=64, cap=10, window=4, shared=False, dtype="float32", rows=8),
    dict(b=8, hq=4, hkv=2, d=80, cap=9, window=9, shared=False, packed=True, rotary=1, dtype="bfloat16", rows=4),
    dict(b=7, hq=8, hkv=2, d=128, cap=16, window=16, shared=True, rotary=1, rows=2),
    dict(b=8, hq=2, hkv=2, d=64, cap=20, window=7, shared=True, dtype="float32", rows=16),
    dict(b=8, hq=2, hkv=2, d=64, cap=13, window=10, shared=True, rows=4),
    # E_b above BLOCK_ROWS and below the rows kept: a block's every source is another block's row.
    dict(b=8, hq=4, hkv=2, d=64, cap=16, window=12, shared=True, rows=2, rotary=1),
    # Head sizes below BLOCK_D: the columns past D masked.
    dict(b=9, hq=4, hkv=2, d=80, cap=11, window=6, shared=True, packed=True, rotary=1, rows=4),
    dict(b=9, hq=2, hkv=1, d=48, cap=8, window=8, shared=True, dtype="bfloat16", rows=2),
]


def seqlens(c: dict, total_max: int) -> list[int]:
    """seqlens_k (T_b - 1) of the case: the rows every case needs, then random ones."""
    cap, gap = c["cap"], c["cap"] - c["window"] + 1
    special = [0, cap - 1, cap, total_max - 1, -1, total_max, 2147483647]  # T 1, C, C + 1, the most, impossible
    if gap > 1:
        special.append(cap + 1)  # past C, nothing dropped (E_b = 0)
    rng = np.random.default_rng(sum(map(ord, json.dumps(c))))
    return special + [int(x) for x in rng.integers(-2, total_max + 1, max(0, c["b"] - len(special)))]


@pytest.mark.parametrize("order", ["ascending", "descending"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_full_window_decode_matches_staged(case, order):
    run_interpreted(__file__, dict(case, order=order))


def _programs_in_descending_order():
    """The interpreter's programs run from the last grid index to the first (it runs them in
    ascending order, one after another)."""
    import triton.runtime.interpreter as interp

    builder = interp.interpreter_builder
    set_idx = builder.set_grid_idx
    builder.set_grid_idx = lambda x, y, z: set_idx(builder.grid_dim[0] - 1 - x, builder.grid_dim[1] - 1 - y,
                                                   builder.grid_dim[2] - 1 - z)


def check_case(c: dict) -> None:
    import torch

    from test_gqa_prepare_kernel import _round_bf16_like_gpu
    from test_kernel_interpreter import _patch_interpreter
    _patch_interpreter()
    _round_bf16_like_gpu()
    if c.pop("order") == "descending":
        _programs_in_descending_order()
    from aot.gqa_prepare import gqa_prepare

    c = dict(dict(dtype="float16", rotary=0, packed=False), **c)
    dt = getattr(torch, c["dtype"])
    bits = torch.int32 if dt == torch.float32 else torch.int16
    rng = np.random.default_rng(sum(map(ord, json.dumps(c))) + 1)
    bsz, hq, hkv, d, cap, window = (c[k] for k in ("b", "hq", "hkv", "d", "cap", "window"))
    gap = cap - window + 1
    total_max = 3 * cap + 2
    lens = seqlens(c, total_max)[:bsz]
    assert len(lens) == bsz
    max_pos = total_max + 4
    block_d = min(x for x in (64, 128, 256) if x >= d)

    def rand(*shape):
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(dt)

    def guarded(n, fill=float("nan"), dtype=dt):
        whole = torch.full((n + 2 * GUARD,), fill, dtype=dtype)
        return whole, whole[GUARD:GUARD + n]

    width = (hq + 2 * hkv) * d if c["packed"] else hq * d
    query = rand(bsz, 1, width)
    if c["packed"]:
        q_in, k_in, v_in = query, query[..., hq * d:], query[..., (hq + hkv) * d:]
    else:
        q_in, k_in, v_in = query, rand(bsz, 1, hkv * d), rand(bsz, 1, hkv * d)
    half = d // 2
    cos_t, sin_t = (torch.from_numpy(rng.uniform(-1, 1, (max_pos, half)).astype(np.float32)).to(dt) for _ in range(2))
    n_cache = bsz * hkv * cap * d
    past_k, past_v = rand(n_cache), rand(n_cache)  # the resident rows (a shared buffer's content)
    seqlens_t = torch.tensor(lens, dtype=torch.int32)

    def run(full: bool):
        """present K/V (guarded), totals, Q, and the attention's keys (stage or present, before the
        compaction) after one path."""
        pk_all, pk = guarded(n_cache)
        pv_all, pv = guarded(n_cache)
        if c["shared"]:
            pk.copy_(past_k)
            pv.copy_(past_v)
            pastk, pastv = pk, pv
        else:
            pastk, pastv = past_k.clone(), past_v.clone()
        stage_len = cap if full else cap + 1
        sk_all, sk = guarded(bsz * hkv * (cap + 1) * d)
        sv_all, sv = guarded(bsz * hkv * (cap + 1) * d)
        stage = (pk, pv) if full else (sk, sv)
        qr_all, qr = guarded(bsz * hq * d)
        tot_all, tot = guarded(bsz, -99, torch.int64)
        q_heads = hq if c["rotary"] else 0
        args = [q_in, k_in, v_in, pastk, pastv, pk, pv, qr, cos_t, sin_t, *stage, torch.zeros(1, dtype=torch.int64),
                seqlens_t, tot, torch.zeros(1, dtype=torch.int8), cos_t, cos_t,
                1, hq, hkv, d, q_heads, c["rotary"], half if c["rotary"] else 0, max_pos, 0,
                0, 0, total_max, cap, cap, 0, cap, gap, stage_len, int(c["shared"]), 1e-6,
                q_in.stride(0), q_in.stride(1), k_in.stride(0), k_in.stride(1), v_in.stride(0), v_in.stride(1)]
        kw = dict(BLOCK_D=block_d, GATHER_ROWS=4)
        rows = c["rows"]
        blocks = -(-cap // rows)
        save_n = bsz * hkv * blocks * min(gap, rows) * d
        save_k_all, save_k = guarded(save_n)
        save_v_all, save_v = guarded(save_n)
        if full and c["shared"]:  # cpp/gqa_launch.cc: the shift in place, its save then its move
            shift_args = list(args)
            shift_args[10:12] = [save_k, save_v]  # StageK / StageV: the save buffers
            for phase in (0, 1):
                gqa_prepare[(blocks, bsz * hkv)](*shift_args, BLOCK_ROWS=rows, MODE=3, shift_phase=phase, **kw)
        else:  # the past copy: into the stage, or a present of its own from row E_b
            gqa_prepare[(-(-cap // 8), bsz * hkv)](*args, BLOCK_ROWS=8, MODE=1, **kw)
        gqa_prepare[(bsz * -(-(q_heads + 2 * hkv) // 8),)](*args, BLOCK_ROWS=8, MODE=0, **kw)
        keys = tuple(x.view(bsz, hkv, stage_len, d).clone() for x in stage)
        if not (full and c["shared"]):
            gqa_prepare[(-(-cap // 8), bsz * hkv)](*args, BLOCK_ROWS=8, MODE=2, **kw)
        for whole in (pk_all, pv_all, sk_all, sv_all, qr_all, save_k_all, save_v_all):
            assert torch.isnan(whole[:GUARD].float()).all() and torch.isnan(whole[-GUARD:].float()).all(), \
                "a write outside a buffer"
        assert (tot_all[:GUARD] == -99).all() and (tot_all[-GUARD:] == -99).all(), "a write outside the lengths"
        if full:
            assert torch.isnan(sk.float()).all() and torch.isnan(sv.float()).all(), "the scratch stage was written"
        return (pk.view(bsz, hkv, cap, d), pv.view(bsz, hkv, cap, d)), tot, qr, keys

    staged, staged_tot, staged_q, stage = run(False)
    present, tot, q, keys = run(True)
    for got, want, what in ((present[0], staged[0], "present_key"), (present[1], staged[1], "present_value"),
                            (q, staged_q, "rotated Q")):
        np.testing.assert_array_equal(got.view(bits).numpy(), want.view(bits).numpy(), err_msg=what)
    for b, sk_ in enumerate(lens):
        t = sk_ + 1
        ok = 1 <= t <= total_max
        past = t - 1
        want_keys = kept(past + 1, cap, window) if ok else 0
        assert tot[b] == want_keys, f"row {b} (T {t}): {tot[b]} keys, not {want_keys}"
        assert staged_tot[b] == (kept(past, cap, window) + 1 if ok else 0)
        if not ok:
            if c["shared"]:  # untouched
                for x, p0 in ((present[0], past_k), (present[1], past_v)):
                    np.testing.assert_array_equal(x[b].view(bits).numpy(),
                                                  p0.view(bsz, hkv, cap, d)[b].view(bits).numpy())
            continue
        n, ts = want_keys, int(staged_tot[b])
        assert n >= min(window, ts), "the window's keys lie within the kept rows"
        for got, want, what in ((keys[0], stage[0], "keys"), (keys[1], stage[1], "values")):
            np.testing.assert_array_equal(got[b, :, :n].view(bits).numpy(), want[b, :, ts - n:ts].view(bits).numpy(),
                                          err_msg=f"row {b} (T {t}): the attention's {what}")


if __name__ == "__main__":
    check_case(json.loads(sys.argv[1]))
