"""lab/experiments/merged_variants.py (its pairs in merged_pairs.py) times each rare-class call through the variant an unmerged build
(aot/build.py --unmerged) compiles and the superset variant the merged build compiles. It runs on a GPU machine;
here, without one, its pairs are checked: the dry run passes, each pair is what the C++ dispatcher
picks from the unmerged and from today's table (with its KV splits), and each variant is compiled
with the constexprs, signature and options aot/build.py gives it."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "lab" / "experiments" / "merged_variants.py"

pytest.importorskip("torch", reason="the script times torch tensors")
pytest.importorskip("triton", reason="the script compiles the Triton kernels")


@pytest.fixture(scope="module")
def mv():
    sys.path.insert(0, str(ROOT / "lab" / "experiments"))
    import merged_variants
    return merged_variants


def test_dry_run_prints_every_pair(tmp_path):
    # From another folder, so only the script's own sys.path set-up finds aot/ and ort_flash/.
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if " -> " in ln]
    # A merged call runs an EDGE_LOOP superset; a call kept exact (variants.kept_exact) its own variant.
    same = [ln for ln in lines if ln.split("->")[0].split()[-1] == ln.split("->")[1].split()[0]]
    assert len(lines) >= 12 and all("EDGE_LOOP" in ln for ln in lines if ln not in same), proc.stdout
    assert same and all("EDGE_LOOP" not in ln for ln in same), proc.stdout
    assert f"{len(lines)} pairs" in proc.stdout


def test_pairs_cover_the_merged_classes(mv):
    pairs = mv.make_pairs()
    got = {(p.call.kind, p.call.dtype, p.call.d, p.call.causal, p.call.mask != "none") for p in pairs}
    for want in [("fwd", "fp32", 64, False, False), ("fwd", "fp32", 64, True, False),
                 ("fwd", "fp16", 32, False, False), ("fwd", "fp16", 32, True, False),
                 ("fwd", "fp16", 32, False, True), ("fwd", "fp16", 256, False, False),
                 ("fwd", "fp16", 256, True, False), ("fwd", "fp16", 256, False, True),
                 ("fwd", "fp16", 80, True, False), ("decode", "fp32", 64, True, False),
                 ("decode", "fp16", 32, True, False), ("decode", "fp16", 256, True, False)]:
        assert want in got, want
    assert any(p.after.mask_keys for p in pairs)  # a key-vector mask variant among them
    assert all(e is False and path is None for p in pairs for v, e, path in p.jobs if v == p.before)


def test_a_call_that_is_not_merged_is_refused(mv):
    hot = mv.Call("hot", "fp16", 1, 2, 2, 100, 100, 64)
    with pytest.raises(ValueError, match="still compiled"):
        mv.make_pairs([hot])
    with pytest.raises(ValueError, match="no variant"):
        sys.modules["merged_pairs"].pick(dataclasses.replace(hot, d=512), {})


def _params(mv, call):
    from ort_flash import _C

    t = mv.make_inputs(call, "meta")
    p = _C.FlashParams()
    p.dtype = getattr(_C.DType, {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}[call.dtype])
    p.fp32_precision = getattr(_C.Fp32Precision, call.prec)
    p.batch, p.hq, p.hkv, p.sq, p.skv, p.d, p.dv = call.b, call.hq, call.hkv, call.sq, call.skv, call.d, call.d
    p.q_stride, p.k_stride = list(t["q"].stride()[:3]), list(t["k"].stride()[:3])
    p.v_stride, p.y_stride = list(t["v"].stride()[:3]), list(t["y"].stride()[:3])
    p.q = p.k = p.v = p.y = 1 << 20
    p.scale, p.causal, p.offset = 0.1, call.causal, call.skv - call.sq
    p.mask_kind = getattr(_C.MaskKind, call.mask)
    if call.mask != "none":
        p.mask, p.mask_len = 1 << 20, call.skv
        p.mask_stride = [*t["mask_strides"], 1]
    return p


def test_pairs_are_what_the_cpp_dispatcher_picks(mv):
    """Before: the dispatcher over the unmerged product; after: over today's table; the decode
    calls' KV splits and the fused merge as the script plans them."""
    from _table_rows import table_rows
    from ort_flash import _C

    today = table_rows(mv.ARCH)
    unmerged = table_rows(mv.ARCH, combinations=True)
    for pair in mv.make_pairs():
        p = _params(mv, pair.call)
        kind, after, _, splits = _C.plan_with_table(p, today, arch=mv.ARCH, sm_count=mv.H200_SMS,
                                                    tensor_maps=False)
        assert (kind, after) == (pair.call.kind, pair.after.name), pair.call.label
        kind, before, _, _ = _C.plan_with_table(p, unmerged, arch=mv.ARCH, sm_count=mv.H200_SMS,
                                                tensor_maps=False)
        assert (kind, before) == (pair.call.kind, pair.before.name), pair.call.label
        if kind == "decode":
            assert splits == mv.decode_plan(pair.call, pair.after, mv.H200_SMS)[0], pair.call.label


class _Captured(Exception):
    pass


def test_variants_compile_as_the_build_compiles_them(mv, monkeypatch, tmp_path):
    """aot/build.py's _compile_one, stopped at triton.compile: the same source, constexprs (with
    EDGE_LOOP where edge_loop says), signature, hints and options as the script's."""
    import triton

    seen = {}

    def fake_compile(src, target=None, options=None):
        seen.update(src=src, target=target, options=options)
        raise _Captured

    monkeypatch.setattr(triton, "compile", fake_compile)
    pairs = mv.make_pairs()
    variants = {v for p in pairs for v, _, _ in p.jobs} | {mv.combine_variant(p.after) for p in pairs
                                                         if p.call.kind == "decode"}
    for var in variants:
        with pytest.raises(RuntimeError):
            sys.modules["merged_pairs"].build._compile_one((var, mv.ARCH, mv.V.get_fwd_config(mv.ARCH, var), str(tmp_path)))
        src, opts, _, _ = mv.source(var, mv.ARCH, mv.V.edge_loop(var))
        built = seen["src"]
        assert built.fn is src.fn and built.constants == src.constants, var.name
        assert built.signature == src.signature and built.attrs == src.attrs, var.name
        assert seen["options"] == opts and seen["target"].arch == mv.ARCH, var.name
    assert not list(tmp_path.iterdir())  # nothing was compiled or cached


def test_launches_fill_every_runtime_parameter(mv, monkeypatch):
    """The launches the script makes (recorded, not run): grids as cpp/cuda_launch.cc's, an argument
    for every kernel parameter, the combine kernel where the merge is not fused."""
    pairs = mv.make_pairs()
    fwd = next(p for p in pairs if p.call.kind == "fwd")
    kern = mv.Recorder()
    mv.runner(fwd, fwd.after, kern, None, mv.inputs(fwd, "meta"), mv.H200_SMS)()
    (grid, args), = kern.launches
    _, _, names, _ = mv.source(fwd.after, mv.ARCH, True)
    cfg = mv.V.get_fwd_config(mv.ARCH, fwd.after)
    assert grid == (-(-fwd.call.sq // cfg.block_m), fwd.call.b * fwd.call.hq, 1) and len(args) == len(names)

    dec = next(p for p in pairs if p.call.kind == "decode")
    t = mv.inputs(dec, "meta")
    monkeypatch.setattr(mv, "decode_plan", lambda *a: (40, False))
    kern, comb = mv.Recorder(), mv.Recorder()
    mv.runner(dec, dec.after, kern, comb, t, mv.H200_SMS)()
    assert kern.launches[0][0][0] == 40 and comb.launches[0][0] == (dec.call.b * dec.call.hq, 1, 1)
    del t["opart"]
    with pytest.raises(ValueError, match="OPart"):
        mv.runner(dec, dec.after, kern, comb, t, mv.H200_SMS)


def _small(c):
    """The call at a size the CPU computes in moments (its class, mask, layout and offset kept)."""
    sq, skv = (1, 300) if c.kind == "decode" else ((277, 301) if c.sq < c.skv else (37, 37))
    if c.mask_rows:  # past 256 rows: the check's two row ranges
        sq = skv = 290
    return dataclasses.replace(c, b=2, hq=4, hkv=2 if c.hkv < c.hq else 4, sq=sq, skv=skv)


def _exact(c, t):
    """A correct result, computed apart from ort_flash.reference: float64 attention in torch."""
    import torch
    g = c.hq // c.hkv
    q, k, v = t["q"].double(), t["k"].double().repeat_interleave(g, 1), t["v"].double().repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) / c.d ** 0.5
    if c.softcap:
        s = c.softcap * torch.tanh(s / c.softcap)
    if c.mask == "add":
        s = s + t["mask"].double()
    elif c.mask == "bool":
        s = s.masked_fill(~t["mask"], float("-inf"))
    if c.causal:
        late = torch.arange(c.skv)[None, :] > torch.arange(c.sq)[:, None] + (c.skv - c.sq)
        s = s.masked_fill(late, float("-inf"))
    lse = torch.logsumexp(s, -1)
    t["y"].copy_(torch.exp(s - lse[..., None]) @ v)
    t["lse"].copy_(lse)


def test_the_check_accepts_a_correct_result_and_rejects_wrong_ones(mv):
    import torch
    for call in mv.CALLS:
        c = _small(call)
        pair = dataclasses.replace(mv.make_pairs([call])[0], call=c)
        torch.manual_seed(0)
        t = mv.inputs(pair, "cpu")
        assert mv.check(pair, lambda: _exact(c, t), t)["ok"], c
        wrong = [lambda: (_exact(c, t), t["y"].add_(0.1)),
                 lambda: (_exact(c, t), t["lse"].add_(0.05)),
                 lambda: (_exact(c, t), t["y"][-1, -1, -1, -1].fill_(float("nan")))]
        if c.layout == "pad":  # a write past Dv, into the row's padding
            wrong.append(lambda: (_exact(c, t), t["y"].as_strided((1,), (1,), c.d).fill_(0.0)))
        for fn in wrong:
            assert not mv.check(pair, fn, t)["ok"], c


def test_main_checks_times_and_writes_every_call(mv, monkeypatch, tmp_path):
    """main() end to end with the GPU parts stood in (a correct float64 result for the before side,
    a wrong one for the after side of one call, do_bench a constant): the table, the JSON, the exit status."""
    import json
    import types

    import torch
    calls = [_small(c) for c in mv.CALLS if c.label in ("fp32 d64 causal", "fp16 d256 causal chunk", "decode fp16 d32")]
    monkeypatch.setattr(mv, "CALLS", calls)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stand-in")
    monkeypatch.setattr(mv, "compile_all", lambda jobs, arch, workers: {j: None for j in jobs})
    real_inputs = mv.inputs
    monkeypatch.setattr(mv, "inputs", lambda p, device: real_inputs(p, "cpu"))

    def runner(p, v, kern, comb, t, sms, folder=None):
        wrong = v == p.after and p.call.kind == "decode"
        return lambda: (_exact(p.call, t), t["y"].mul_(2.0) if wrong else None)

    monkeypatch.setattr(mv, "runner", runner)
    monkeypatch.setattr(mv.triton.testing, "do_bench", lambda fn, warmup, rep, return_mode: (fn(), 0.1)[1])
    out = tmp_path / "merged.json"
    assert mv.main(["--out", str(out), "--rounds", "3"]) == 1  # one call WRONG
    rows = json.loads(out.read_text())["results"]
    assert [r["call"]["label"] for r in rows] == [c.label for c in calls]
    for r in rows:
        assert r["before_us"] == r["after_us"] == 100.0 and len(r["after_rounds_us"]) == 3
        assert r["check_before"]["ok"] and r["check_after"]["ok"] == (r["kind"] != "decode")
    assert rows[-1]["splits"] >= 1


def test_ab_pairs_compile_one_variant_from_two_sources(mv, tmp_path):
    """--before-source: every call whose variant compiles with EDGE_LOOP, softcap, full-mask and
    decode calls among them, one variant per pair compiled from the given folder's kernel files
    and from aot/; the launch carries the call's softcap and the check holds a softcapped result
    to the reference."""
    import torch
    old = tmp_path / "old"
    old.mkdir()
    for name in ("flash_fwd.py", "flash_decode.py"):
        (old / name).write_text((ROOT / "aot" / name).read_text())
    pairs = mv.ab_pairs(str(old))
    assert pairs and all(p.before == p.after and mv.V.edge_loop(p.after) for p in pairs)
    labels = {p.call.label for p in pairs}
    assert {"fp32 d64 softcap", "fp16 d256 softcap causal gqa", "fp16 d64m full mask",
            "decode fp16 d256"} <= labels, labels
    assert all(p.after.extras for p in pairs if p.call.softcap)
    for p in pairs:
        (vb, eb, pb), (va, ea, pa) = p.jobs
        assert (vb, eb, pb) == (va, ea, str(old)) and pa is None
        src_old, _, _, _ = mv.source(vb, mv.ARCH, eb, pb)
        src_new, _, _, _ = mv.source(va, mv.ARCH, ea, pa)
        assert src_old.fn is not src_new.fn and src_old.fn.fn.__module__ != src_new.fn.fn.__module__
        assert src_old.constants == src_new.constants and src_old.signature == src_new.signature
    cap = next(p for p in pairs if p.call.softcap)
    kern = mv.Recorder()
    mv.runner(cap, cap.after, kern, None, mv.inputs(cap, "meta"), mv.H200_SMS)()
    (_, args), = kern.launches
    _, _, names, _ = mv.source(cap.after, mv.ARCH, True)
    assert args[names.index("softcap")] == cap.call.softcap
    c = _small(cap.call)
    small = dataclasses.replace(cap, call=c)
    torch.manual_seed(0)
    t = mv.inputs(small, "cpu")
    assert mv.check(small, lambda: _exact(c, t), t)["ok"]
    assert not mv.check(small, lambda: _exact(dataclasses.replace(c, softcap=0.0), t), t)["ok"]


def test_ab_pairs_tile_table_from_folder(mv, tmp_path):
    """--before-source with a variants.py: the "before" side compiles and launches at that table's
    tile (here one with 4 warps for every fp32 IEEE tile), aot/'s kernel files standing in for the
    ones the folder lacks; the "after" side at aot/variants.py's."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "variants.py").write_text((ROOT / "aot" / "variants.py").read_text().replace(
        'warps = 8 if v.precision == "ieee" and v.head_dim >= 64 else 4', "warps = 4"))
    pairs = {p.call.label: p for p in mv.ab_pairs(str(old))}
    p = pairs["fp32 d128"]
    (vb, eb, pb), (va, ea, pa) = p.jobs
    src_old, opts_old, _, _ = mv.source(vb, mv.ARCH, eb, pb)
    src_new, opts_new, _, _ = mv.source(va, mv.ARCH, ea, pa)
    assert src_old.fn is src_new.fn  # no flash_fwd.py in the folder: aot/'s kernel
    assert (opts_old["num_warps"], opts_new["num_warps"]) == (4, 8)
    for folder in (pb, None):
        kern = mv.Recorder()
        mv.runner(p, vb, kern, None, mv.inputs(p, "meta"), mv.H200_SMS, folder)()
        (grid, _), = kern.launches
        assert grid[0] == -(-p.call.sq // mv.fwd_config(vb, mv.ARCH, folder).block_m)
    full = pairs["fp16 d32 full mask"]
    assert mv.fwd_config(full.after, mv.ARCH).num_warps == 8
    assert mv.fwd_config(full.after, mv.ARCH, pb).num_warps == 8  # that table keeps the new full-mask tile

