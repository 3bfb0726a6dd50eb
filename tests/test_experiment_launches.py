"""The launches the JIT experiments make (lab/experiments/gluon_attn.py run_gluon and run_ws,
gluon_mask.py run_ws_masked, tune.py launch, gqa_append.py's fused kernel and the prepare path it
is measured against), recorded on CPU tensors instead of run: each passes
one argument per runtime parameter of the kernel it launches, and read by the kernel's own
parameter names (its `params`, not aot/contract.py, which builds the lists) each argument is what
the call means: the tensors, shapes, strides, mask and the experiment's own switches
(DYNAMIC_TILES' counter in TileCounter, a null pointer where there is none; PERSISTENT_GRID's B * Hq
read from Q's descriptor, no window). They need a GPU to run (tests/test_experiments.py checks that
they start)."""
from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
torch = pytest.importorskip("torch", reason="the experiments launch on torch tensors")
pytest.importorskip("triton", reason="the experiments JIT-compile Triton and Gluon kernels")


@pytest.fixture(scope="module")
def exp():
    sys.path[:0] = [str(ROOT / "lab" / "experiments"), str(ROOT)]
    import gluon_attn
    import gluon_mask
    import tune
    from aot import flash_fwd_gluon, flash_fwd_gluon_ws
    return SimpleNamespace(attn=gluon_attn, mask=gluon_mask, tune=tune, fg=flash_fwd_gluon, fws=flash_fwd_gluon_ws)


class _Recorder:
    """Stands in for a JIT kernel: `kernel[grid](*args, **constexprs)` records the launch."""

    def __init__(self, real):
        self.real, self.launches = real, []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.launches.append((grid, args, kw))


def _record(monkeypatch, owner, name: str, call) -> dict:
    """The arguments of the one launch `call` makes of owner.name, by the kernel's parameter names."""
    rec = _Recorder(getattr(owner, name))
    monkeypatch.setattr(owner, name, rec)
    call()
    (_, args, kw), = rec.launches
    runtime = [p.name for p in rec.real.params if not p.is_constexpr]
    assert len(args) == len(runtime), (name, len(args), runtime)
    assert not set(kw) & set(runtime), kw  # the runtime arguments are positional, the constexprs named
    return dict(zip(runtime, args))


def _tensors(b=2, hq=4, hkv=2, sq=100, skv=103, d=64):
    """GQA (B, H, S, D) views; K stored (B, S, H, D), so its strides differ from V's."""
    q = torch.randn(b, hq, sq, d, dtype=torch.float16)
    k = torch.randn(b, skv, hkv, d, dtype=torch.float16).transpose(1, 2)
    v = torch.randn(b, hkv, skv, d, dtype=torch.float16)
    return q, k, v, torch.empty_like(q), torch.empty(b, hq, sq)


def _check(a: dict, q, k, v, y, lse, **want):
    """The call's arguments: Q, K, V, Y (or descriptors over them) and Lse, the shapes and strides
    of the tensors, then `want` (a tensor by identity) over the defaults: no mask, window, softcap,
    offset, causality or key lengths, Lse stored."""
    for name, t in zip("QKVY", (q, k, v, y)):
        assert getattr(a[name], "base", a[name]) is t, name
    b, hq, sq, d = q.shape
    expect = dict(Lse=lse, scale=1.0 / math.sqrt(d), softcap=0.0, Hq=hq, group=hq // k.shape[1], Sq=sq,
                  Skv=k.shape[2], D=d, Dv=d, offset=0, causal=0, window_left=-1, window_right=-1,
                  mask_len=k.shape[2], has_seqlens=0, store_lse=1, stride_mb=0, stride_mh=0, stride_mm=0)
    for t, x in zip("qkvy", (q, k, v, y)):
        expect.update(zip((f"stride_{t}b", f"stride_{t}h", f"stride_{t}{'m' if t in 'qy' else 'n'}"), x.stride()[:3]))
    expect.update(want)
    for name, value in expect.items():
        if isinstance(value, torch.Tensor):
            assert a[name] is value, name
        else:
            assert a[name] == value, (name, a[name], value)


def test_run_gluon(exp, monkeypatch):
    q, k, v, y, lse = _tensors()
    a = _record(monkeypatch, exp.fg, "flash_fwd_gluon",
                lambda: exp.attn.run_gluon(q, k, v, y, lse, True, offset=3, store_lse=False))
    _check(a, q, k, v, y, lse, Mask=lse, SeqlensK=lse, TileCounter=exp.tune.NULL, offset=3, causal=1, store_lse=0,
           **exp.tune.NO_ROTARY)
    assert exp.tune.NULL.data_ptr() == 0


@pytest.mark.parametrize("cfg, want", [
    (None, {}),
    # A persistent grid with DYNAMIC_TILES: the counter pair in TileCounter where the CTAs claim
    # tiles through it (1), a null pointer where they take them round robin (2) or none is used.
    ({"PERSISTENT_GRID": 2, "DYNAMIC_TILES": 1}, {"TileCounter": "counter"}),
    ({"PERSISTENT_GRID": 1, "DYNAMIC_TILES": 2}, {}),
    ({"PERSISTENT_GRID": 1}, {}),
])
def test_run_ws(exp, monkeypatch, cfg, want):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: SimpleNamespace(multi_processor_count=132))
    q, k, v, y, lse = _tensors()
    a = _record(monkeypatch, exp.fws, "flash_fwd_gluon_ws",
                lambda: exp.attn.run_ws(q, k, v, y, lse, True, offset=5, cfg=cfg))
    want = dict({"Mask": lse, "SeqlensK": lse, "TileCounter": exp.tune.NULL, **exp.tune.NO_ROTARY}, **want)
    if want["TileCounter"] == "counter":
        want["TileCounter"] = exp.attn.counter(q.device)
    _check(a, q, k, v, y, lse, offset=5, causal=1, **want)
    assert list(a["Q"].shape) == list(q.shape)  # (B, Hq, Sq, D): a persistent grid's B * Hq


@pytest.mark.parametrize("kind, heads, mask_len", [("bool", 1, None), ("add", 4, 90)])
def test_run_ws_masked(exp, monkeypatch, kind, heads, mask_len):
    q, k, v, y, lse = _tensors()
    mask = (torch.ones(2, heads, 1, 103, dtype=torch.uint8) if kind == "bool"
            else torch.zeros(2, heads, 1, 103, dtype=torch.float16))
    a = _record(monkeypatch, exp.fws, "flash_fwd_gluon_ws",
                lambda: exp.mask.run_ws_masked(q, k, v, y, lse, mask, kind, causal=True, offset=3, mask_len=mask_len))
    _check(a, q, k, v, y, lse, Mask=mask, SeqlensK=lse, TileCounter=exp.tune.NULL, offset=3, causal=1,
           mask_len=mask_len or 103, **exp.tune.NO_ROTARY,
           stride_mb=mask.stride(0), stride_mh=mask.stride(1) if heads > 1 else 0)


@pytest.mark.parametrize("tma, mask_rows, mask_keys", [(False, 0, False), (True, 0, False), (False, 100, False),
                                                        (True, 1, True)])
def test_tune_launch(exp, monkeypatch, tma, mask_rows, mask_keys):
    q, k, v, y, lse = _tensors(hkv=4, skv=100)
    mask = torch.zeros(2, 1, mask_rows, 100, dtype=torch.float16) if mask_rows else None
    cfg = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    a = _record(monkeypatch, exp.tune, "flash_fwd",
                lambda: exp.tune.launch(q, k, v, y, lse, True, cfg, tma=tma, mask=mask, mask_keys=mask_keys))
    want = dict(causal=1)
    if mask is None:
        assert a["Mask"].dtype == torch.int8 and a["Mask"].numel() == 1
    else:
        want.update(Mask=mask, stride_mb=mask.stride(0), stride_mm=mask.stride(2) if mask_rows > 1 else 0)
    assert a["SeqlensK"].dtype == torch.int64
    _check(a, q, k, v, y, lse, **want)


@pytest.fixture()
def append_case(monkeypatch):
    """lab/experiments/gqa_append.py's Case on CPU tensors: a right-padded first prompt, packed QKV."""
    sys.path[:0] = [str(ROOT / "lab" / "experiments"), str(ROOT)]
    import gqa_append
    monkeypatch.setattr(gqa_append, "DEVICE", "cpu")
    return gqa_append, gqa_append.Case(torch, 2, 77, 64, torch.float16, [77, 30], cap_extra=9, seed=0)


def _descriptor_of(desc, t):
    """A TMA descriptor's tensor is `t` (the same storage, offset, shape and strides)."""
    return (desc.base.data_ptr(), tuple(desc.shape), tuple(desc.strides)) == (t.data_ptr(), tuple(t.shape), t.stride())


def test_gqa_append_launches(append_case, monkeypatch):
    """The fused kernel reads K and V from packed QKV and writes present's first S rows; the path it
    is measured against runs the prepare kernel over the same buffers, then the shipped kernel over
    present; both turn Q on load, bound each row's keys at T_b and are causal."""
    m, c = append_case
    q, k, v = m._views(c.qkv, c.d)
    fused = _record(monkeypatch, m, "flash_fwd_gluon_append", c.run_fused)
    attn = _record(monkeypatch, m.fg, "flash_fwd_gluon", c.run_attention)
    for a, keys in ((fused, (k, v)), (attn, (c.pk[:, :, :c.s], c.pv[:, :, :c.s]))):
        assert _descriptor_of(a["Q"], q) and _descriptor_of(a["Y"], c.y)
        assert _descriptor_of(a["K"], keys[0]) and _descriptor_of(a["V"], keys[1])
        assert (a["Sq"], a["Skv"], a["Hq"], a["group"], a["causal"], a["has_seqlens"], a["offset"]) == (
            77, 77, m.HQ, m.HQ // m.HKV, 1, 1, 0)
        assert a["SeqlensK"] is c.totals and c.totals.tolist() == [77, 30]
        assert (a["Cos"], a["Sin"], a["rotary_half"], a["max_position"]) == (c.cos, c.sin, 32, c.cos.shape[0])
        assert a["stride_kn"] == keys[0].stride(2) and a["stride_qm"] == q.stride(2)
    assert _descriptor_of(fused["Kout"], c.pk[:, :, :c.s]) and _descriptor_of(fused["Vout"], c.pv[:, :, :c.s])


def test_gqa_append_prepare_launch(append_case, monkeypatch):
    """The prepare kernel as the op launches it for a first prompt whose Q turns on load: K and V
    heads only (q_heads 0), half-split rotary over the head, present a buffer shared with the past
    (no windowed cache), seqlens_k = T_b - 1, packed QKV's strides."""
    import inspect

    import aot.gqa_prepare as gp
    m, c = append_case
    rec = _Recorder(gp.gqa_prepare)
    monkeypatch.setattr(gp, "gqa_prepare", rec)
    c.prepare()
    (_, args, kw), = rec.launches
    options = {k_: kw.pop(k_) for k_ in ("num_warps", "num_stages") if k_ in kw}  # launch options
    assert options == {"num_warps": 4}, options
    bound = inspect.signature(rec.real.fn).bind(*args, **kw)  # every parameter, by its own name
    bound.apply_defaults()
    a = bound.arguments
    assert (a["MODE"], a["shift_phase"]) == (0, 0)
    assert a["Q"] is c.qkv and a["K"].data_ptr() == c.qkv.data_ptr() + m.HQ * c.d * 2
    assert a["V"].data_ptr() == c.qkv.data_ptr() + (m.HQ + m.HKV) * c.d * 2
    for name in ("PastK", "PresentK", "StageK"):
        assert a[name] is c.pk, name
    assert a["Seqlens"].tolist() == [76, 29]
    want = dict(S=77, Hq=m.HQ, Hkv=m.HKV, D=64, q_heads=0, rotary=1, rotary_half=32, max_position=c.cos.shape[0],
                has_position_ids=0, first_prompt=1, write_mask=0, total_max=77, present_len=c.cap, past_len=c.cap,
                qk_norm=0, cap=0, stage_len=0, shared=1, stride_qb=c.qkv.stride(0), stride_qs=c.qkv.stride(1),
                stride_kb=c.qkv.stride(0), stride_ks=c.qkv.stride(1))
    assert {n: a[n] for n in want} == want
