"""The gqa suite (GroupQueryAttention, op level) on the CPU at a tiny grid: the JSON it
writes, both ops computing the same function on GenAI's inputs (packed QKV, rotary, the shared
max-length buffer), the correctness guard passing, and catching an op that computes another
function. Nothing here asserts a time."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ort_flash.bench import gqa_graphs, gqa_peers, gqa_probe, gqa_suite, results
from ort_flash.bench.measure import Context

TINY = ["--quick", "--seqlens", "64", "--caches", "128", "--batches", "1", "2"]


def _cpu_suite(tmp_path, *flags):
    """The gqa suite on the CPU at the tiny grid with `flags`: its suite JSON and, per config,
    (config, {peer: row})."""
    from ort_flash.cli import main

    out = tmp_path / "gqa.json"
    assert main(["bench", "--suite", "gqa", "--device", "cpu", *TINY, *flags, "--out", str(out)]) == 0
    suite = json.loads(out.read_text())["suites"]["gqa"]
    assert suite["status"] == "complete"
    return suite, [(cfg, {r["peer"]: r for r in group}) for cfg, group in results.group_by_config(suite["rows"])]


def test_gqa_suite_end_to_end_on_cpu(tmp_path, capsys):
    from ort_flash.cli import main

    out = tmp_path / "gqa.json"
    assert main(["bench", "--suite", "gqa", "--device", "cpu", *TINY, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert results.validate(doc) == []
    suite = doc["suites"]["gqa"]
    assert suite["status"] == "complete" and suite["device"] == "cpu" and not suite["not_run"]
    configs = [c for c, _ in results.group_by_config(suite["rows"])]
    assert [(c["phase"], c["batch"], c["seqlen"], c["cache"]) for c in configs] == [
        ("prefill", 8, 64, 64), ("decode", 1, 1, 128), ("decode", 2, 1, 128)]
    assert all(c["buffer"] > c["cache"] for c in configs)  # a max-length buffer, longer than the call
    for cfg, group in results.group_by_config(suite["rows"]):
        by = {r["peer"]: r for r in group}
        assert set(by) == {"ort_flash", "ort_gqa", "ort_flash_fa"}
        plain = by.pop("ort_flash_fa")  # the plain op on the same attention: first prompts only
        if cfg["phase"] == "prefill":
            assert plain["status"] == "ok" and plain["ref_err"] < 1e-4, plain
            assert by["ort_flash"]["vs_plain"] == plain["ms"] / by["ort_flash"]["ms"]
        else:
            assert plain["status"] == "unsupported" and "first prompts" in plain["reason"], plain
            assert "vs_plain" not in by["ort_flash"]
        for r in by.values():
            assert r["status"] == "ok", r
            assert r["ref_err"] < 1e-4, r
            assert r["tflops"] > 0 and r["gbps"] > 0 and r["ms"] > 0
        guard = by["ort_flash"]["guard"]
        assert guard["passed"] and guard["agree_err"] < 1e-5 and guard["present_err"] < 1e-6, guard
        assert by["ort_flash"]["vs_ort"] > 0 and "goal" not in by["ort_flash"]  # goals are CUDA's
    printed = capsys.readouterr().out
    assert "GroupQueryAttention prefill on cpu" in printed and "GroupQueryAttention decode on cpu" in printed


def test_gqa_suite_with_attention_sinks_on_cpu(tmp_path):
    """--sinks (gpt-oss's head_sink on every node): both ops checked against the float64 reference
    with the sinks in the softmax denominator (a reference without them is off by tens of percent),
    and against each other."""
    suite, configs = _cpu_suite(tmp_path, "--sinks")
    assert suite["grid"]["sinks"]
    for cfg, by in configs:
        assert cfg["sinks"]
        plain = by.pop("ort_flash_fa")
        assert plain["status"] == "unsupported", plain  # FlashAttention has no sinks
        for r in by.values():
            assert r["status"] == "ok" and r["ref_err"] < 1e-4, r
        assert by["ort_flash"]["guard"]["passed"], by["ort_flash"]["guard"]


def test_gqa_suite_with_qk_norms_on_cpu(tmp_path):
    """--qk-norm (Qwen3's per-head RMS norms on every node): ort_flash checked against the float64
    reference with the norms before the rotary; ONNX Runtime's CPU op refuses them (its schema:
    CUDA and WebGPU), a row that says so. Without the norms the reference is far off."""
    suite, configs = _cpu_suite(tmp_path, "--qk-norm")
    assert suite["grid"]["qk_norm"]
    for cfg, by in configs:
        assert cfg["qk_norm"]
        assert by["ort_flash"]["status"] == "ok" and by["ort_flash"]["ref_err"] < 1e-4, by["ort_flash"]
        assert by["ort_gqa"]["status"] == "unsupported" and "q_norm_weight" in by["ort_gqa"]["reason"]
    cfg = dict(dtype="float32", hq=4, hkv=2, d=16, phase="prefill", batch=1, seqlen=8, cache=8, buffer=16, qk_norm=True)
    ctx = Context.create("cpu", seed=0)
    sets, shared = gqa_peers.make_sets(ctx.tensors, cfg, 1)
    q_normed = gqa_peers.attention_inputs(cfg, sets[0], shared)[0].data
    del shared["q_norm_weight"], shared["k_norm_weight"]
    q_plain = gqa_peers.attention_inputs(cfg, sets[0], shared)[0].data
    assert np.abs(np.asarray(q_normed) - np.asarray(q_plain)).max() > 0.1


def test_gqa_suite_with_window_sized_cache_on_cpu(tmp_path):
    """--window W (local_window_size=W, sliding_window_cache=1, a buffer of W rows, as GenAI's
    builder writes Mistral's windowed layers): prompts shorter and longer than W and a decode step
    past W, whose every call moves the cache's rows (spot-checked on a first call). Both ops pass
    the guard and their checks; the plain op sits it out with its reason."""
    suite, configs = _cpu_suite(tmp_path, "--window", "48", "--seqlens", "32", "64", "--caches", "96",
                                "--batches", "1")
    assert suite["grid"]["window"] == 48
    assert [(c["phase"], c["seqlen"], c["cache"], c["buffer"], c["window"]) for c, _ in configs] == [
        ("prefill", 32, 32, 48, 48), ("prefill", 64, 64, 48, 48), ("decode", 1, 96, 48, 48)]
    for cfg, by in configs:
        plain = by.pop("ort_flash_fa")
        assert plain["status"] == "unsupported" and plain["reason"] == "the plain op has no window-sized cache"
        for r in by.values():
            assert r["status"] == "ok" and r["ref_err"] < 1e-4, r
            assert ("check" in r) == (cfg["phase"] == "decode"), r  # the first-call check past the window
        guard = by["ort_flash"]["guard"]
        assert guard["passed"] and guard["agree_err"] < 1e-5 and guard["present_err"] < 1e-6, guard
        assert by["ort_flash"]["vs_ort"] > 0
        if cfg["phase"] == "decode":  # the K and V of the window's 48 keys, not of the 96 tokens
            r = by["ort_flash"]
            assert r["gbps"] == pytest.approx(2 * 2 * 48 * 64 * 4 / (r["ms"] * 1e-3) / 1e9)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_gqa_window_checks_catch_a_wrong_window(monkeypatch, phase):
    """ort_flash's node given a window one short of W (its cache still W rows), on a prompt longer
    than W and on a decode step past W: the guard (against ONNX Runtime's op) and the spot check
    (the first call's, past the window) both fail it; ONNX Runtime's op passes."""
    real = gqa_graphs.gqa_model

    def skewed(inputs, domain="com.microsoft", **attrs):
        if domain == "ort_flash":
            attrs = dict(attrs, local_window_size=attrs["local_window_size"] - 1)
        return real(inputs, domain, **attrs)
    monkeypatch.setattr(gqa_graphs, "gqa_model", skewed)
    n, total = (40, 40) if phase == "prefill" else (1, 40)
    cfg = dict(dtype="float32", hq=4, hkv=2, d=32, phase=phase, batch=2, seqlen=n, cache=total, buffer=16, window=16)
    ctx = Context.create("cpu", seed=5, target_s=0.01)
    rows = gqa_suite.run_config(ctx, cfg, gqa_peers.peers_for("cpu"), {})
    by = {r["peer"]: r for r in rows}
    assert by["ort_gqa"]["status"] == "ok" and by["ort_gqa"]["ref_err"] < 1e-4, by["ort_gqa"]
    ours = by["ort_flash"]
    assert ours["status"] == "mismatch" and not ours["guard"]["passed"], ours
    assert ours["ref_err"] > ours["guard"]["limit"] and "float64 reference" in ours["reason"], ours


def test_gqa_suite_in_bfloat16_on_cpu(tmp_path):
    """--dtypes bfloat16 (the dtype the next GPU run times against ONNX Runtime's op): the suite's
    inputs, rotary tables and reference in bfloat16 (the tables numpy's ml_dtypes on the CPU);
    ort_flash's rows checked against the float64 reference, ONNX Runtime's CPU op, which has no
    bfloat16 kernel, a row that says so."""
    suite, configs = _cpu_suite(tmp_path, "--dtypes", "bfloat16")
    assert suite["grid"]["dtype"] == "bfloat16"
    for cfg, by in configs:
        assert cfg["dtype"] == "bfloat16"
        assert by["ort_flash"]["status"] == "ok" and by["ort_flash"]["ref_err"] < 3e-2, by["ort_flash"]
        assert by["ort_gqa"]["status"] == "unsupported" and "GroupQueryAttention" in by["ort_gqa"]["reason"]


def test_gqa_guard_catches_another_function(monkeypatch):
    """ort_flash's node given twice the scale: the guard fails on the output and the row is a
    mismatch without a ratio."""
    real = gqa_graphs.gqa_model

    def skewed(inputs, domain="com.microsoft", **attrs):
        if domain == "ort_flash":
            attrs = dict(attrs, scale=2 * attrs["scale"])
        return real(inputs, domain, **attrs)
    monkeypatch.setattr(gqa_graphs, "gqa_model", skewed)
    cfg = dict(dtype="float32", hq=4, hkv=2, d=32, phase="decode", batch=2, seqlen=1, cache=96, buffer=128)
    ctx = Context.create("cpu", seed=3, target_s=0.01)
    rows = gqa_suite.run_config(ctx, cfg, gqa_peers.peers_for("cpu"), {})
    by = {r["peer"]: r for r in rows}
    assert by["ort_gqa"]["status"] == "ok"
    ours = by["ort_flash"]
    assert ours["status"] == "mismatch" and not ours["guard"]["passed"], ours
    assert "output vs ONNX Runtime's" in ours["reason"] and "vs_ort" not in ours


def test_gqa_layered_sessions_and_sdpa_on_cpu(monkeypatch):
    """What CUDA runs, forced on the CPU: three copies of the node per session run (the layers
    under CUDA graphs, every copy appending into its set's shared buffer) and the SDPA peer on the
    rotated Q, K, V with the KV heads repeated (torch's default backend here; cuDNN on CUDA)."""
    from ort_flash.bench import torch_calls

    class Sdpa(torch_calls.SdpaCalls):
        def __init__(self, *args, backend="default", **kwargs):
            super().__init__(*args, backend="default", **kwargs)
    monkeypatch.setattr(gqa_peers, "copies", lambda ctx, cfg: 3)
    monkeypatch.setattr(gqa_peers, "SdpaCalls", Sdpa)
    peers = dict(gqa_peers.peers_for("cpu"), sdpa=gqa_peers.sdpa)
    for cfg in (dict(dtype="float32", hq=4, hkv=2, d=32, phase="decode", batch=2, seqlen=1, cache=96, buffer=128),
                dict(dtype="float32", hq=4, hkv=2, d=32, phase="prefill", batch=2, seqlen=48, cache=48, buffer=64)):
        rows = gqa_suite.run_config(Context.create("cpu", seed=1, target_s=0.01), cfg, peers, {})
        by = {r["peer"]: r for r in rows}
        for name in peers:
            if name == "ort_flash_fa" and cfg["phase"] == "decode":
                assert by[name]["status"] == "unsupported", by[name]
                continue
            assert by[name]["status"] == "ok" and by[name]["ref_err"] < 1e-4, by[name]
        assert by["ort_flash"]["layers"] == 3 and by["ort_gqa"]["layers"] == 3
        if cfg["phase"] == "prefill":
            assert by["ort_flash_fa"]["layers"] == 3


def test_gqa_probe_reads_ort_kernel_line():
    line = "\x1b[36mOperator=GroupQueryAttention Node=n DataType=fp16 SdpaKernel=FLASH_ATTENTION\x1b[0m\n"
    assert gqa_probe._kernel("AttentionKernelOptions: FLASH_ATTENTION=1\n" + line) == "FLASH_ATTENTION"
    assert gqa_probe._kernel("").startswith("not printed")


def test_gqa_grid_takes_one_dtype_a_run():
    """--dtypes names the suite's one dtype; several are refused by name, never timed as the first."""
    assert gqa_suite.grid("cuda", True, {"dtypes": ["bfloat16"]})["dtype"] == "bfloat16"
    with pytest.raises(ValueError, match="--dtypes float16 bfloat16: the gqa suite times one dtype a run"):
        gqa_suite.grid("cuda", True, {"dtypes": ["float16", "bfloat16"]})


def test_gqa_grids():
    cuda = gqa_suite.configs(gqa_suite.grid("cuda", quick=False))
    prefill = [c for c in cuda if c["phase"] == "prefill"]
    assert {c["batch"] * c["seqlen"] for c in prefill} == {16384}
    assert {(c["hq"], c["hkv"], c["dtype"]) for c in cuda} == {(32, 8, "float16")}
    decode = {(c["batch"], c["cache"]) for c in cuda if c["phase"] == "decode" and c["d"] == 128}
    assert decode == {(b, c) for b in (1, 8, 32) for c in (1024, 4096, 16384, 32768, 131072)}
    assert gqa_suite.goal(prefill[2]) == 2.0 and gqa_suite.goal(prefill[3]) == 1.2  # 2k, 8k
    assert [gqa_suite.plain_goal(c) for c in prefill[:3]] == [0.75, 0.75, 0.9]  # 128, 512, 2k


@pytest.mark.slow
def test_genai_e2e_on_cpu(tmp_path):
    """The genai suite at its smallest: GenAI's builder on a 1-layer random LLaMA, the folder
    rewritten (every GQA node swapped), both generating the same tokens; no time asserted."""
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")
    from ort_flash.cli import main

    out = tmp_path / "genai.json"
    assert main(["bench", "--suite", "genai", "--device", "cpu", "--quick", "--genai-model", "1", "128", "4", "2",
                 "--seqlens", "32", "--caches", "64", "--cache-dir", str(tmp_path / "cache"), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert results.validate(doc) == []
    suite = doc["suites"]["genai"]
    assert suite["status"] == "complete", suite["notes"]
    assert suite["model"]["gqa_nodes"] == {"original": {"com.microsoft": 1}, "rewritten": {"ort_flash": 1}}
    by = {(r["config"]["kind"], r["peer"]): r for r in suite["rows"]}
    assert set(by) == {(k, v) for k in ("ttft", "decode") for v in ("original", "ort_flash")}
    for kind in ("ttft", "decode"):
        ours = by[(kind, "ort_flash")]
        assert ours["status"] == "ok" and ours["identical"], ours
        assert ours["tokens"] == by[(kind, "original")]["tokens"] and ours["vs_original"] > 0
    assert by[("decode", "ort_flash")]["tok_s"] > 0


class _ForcedRunner:
    """A genai_e2e runner whose logits are a table (step x vocabulary): feeding any token moves
    to the next row; the timed decode returns ``tokens``."""

    def __init__(self, logits, tokens=None):
        self.logits, self.tokens, self.fed = logits, tokens, []

    def start_forced(self, ids, steps):
        self.fed.clear()
        return "gen", self.logits[0]

    def feed(self, gen, token):
        self.fed.append(token)
        return self.logits[len(self.fed)]

    def start_decode(self, ids, steps):
        return object()

    def decode(self, gen, context, steps):
        return 1e-3, self.tokens


def test_genai_first_flip_tells_a_tie_from_an_error():
    """genai_e2e.first_flip: both fed the original's greedy tokens; the first step where ours'
    argmax differs, the original's margin there against the two runs' logit difference (a tie when
    the margin is below it), None where they agree at every fed step."""
    from ort_flash.bench import genai_e2e

    rng = np.random.default_rng(3)
    lo = rng.standard_normal((6, 11)).astype(np.float32)
    lf = lo + np.float32(1e-3) * rng.standard_normal((6, 11)).astype(np.float32)
    agree = genai_e2e.first_flip({"original": _ForcedRunner(lo), "ort_flash": _ForcedRunner(lf)}, None, 5)
    assert agree["step"] is None and 0 < agree["noise"] < 1e-2
    assert "same token at every step" in genai_e2e.flip_note(agree)
    k = 3
    a = int(lo[k].argmax())
    b = int(np.argsort(lo[k])[-2])
    lo[k, b] = lo[k, a] - np.float32(1e-3)  # the original's runner-up 1e-3 behind: a near tie
    tie = lo + np.float32(1e-3) * rng.standard_normal(lo.shape).astype(np.float32)
    tie[k, b] = tie[k, a] + np.float32(1e-4)
    runners = {"original": _ForcedRunner(lo), "ort_flash": _ForcedRunner(tie)}
    d = genai_e2e.first_flip(runners, None, 5)
    assert (d["step"], d["original_token"], d["ours_token"]) == (k, a, b)
    assert runners["ort_flash"].fed == [int(t) for t in lo[:k].argmax(1)]  # the original's choices
    assert d["original_margin"] == pytest.approx(1e-3, rel=1e-2)
    assert d["noise"] >= float(np.abs(lo[:k] - tie[:k]).max())
    assert d["tie"] and "a tie within rounding" in genai_e2e.flip_note(d)
    off = tie.copy()
    off[k, b] = off[k, a] + 0.5  # ours off by half a logit at one token, rounding elsewhere
    lo2 = lo.copy()
    lo2[k, b] = lo2[k, a] - 0.3
    f = genai_e2e.first_flip({"original": _ForcedRunner(lo2), "ort_flash": _ForcedRunner(off)}, None, 5)
    assert f["step"] == k and not f["tie"] and f["diff_at_tokens"] > 0.3, f
    assert "NOT a tie" in genai_e2e.flip_note(f)
    first = genai_e2e.first_flip({"original": _ForcedRunner(lo2[k:]), "ort_flash": _ForcedRunner(off[k:])}, None, 2)
    assert first["step"] == 0 and not first["tie"]  # at the prompt: the rest of the vocabulary is the noise


def test_genai_decode_mismatch_row_carries_the_flip():
    """time_decode: where the timed greedy tokens differ, the teacher-forced check gives the row its
    flip (step, margin, tie) and extends its reason; the ratio stands."""
    from ort_flash.bench import genai_e2e

    rng = np.random.default_rng(5)
    logits = {v: rng.standard_normal((9, 9)).astype(np.float32) for v in genai_e2e.VARIANTS}
    lo = logits["original"]
    a, b = int(lo[2].argmax()), int(np.argsort(lo[2])[-2])
    lo[2, b] = lo[2, a] - 1e-3  # the runner-up 1e-3 behind
    logits["ort_flash"] = lo + np.float32(1e-3) * rng.standard_normal(lo.shape).astype(np.float32)
    logits["ort_flash"][2, b] = logits["ort_flash"][2, a] + 1e-4  # the tie flipped at step 2
    timed = {"original": [1, 2, 3, 4, 5, 6], "ort_flash": [1, 2, 7, 4, 5, 6]}
    runners = {v: _ForcedRunner(logits[v], timed[v]) for v in genai_e2e.VARIANTS}
    g = dict(rounds=2, steps=6)
    cfg = {"kind": "decode", "tokens": 4}
    rows = genai_e2e.time_decode(runners, np.zeros(4, np.int32), g, cfg)
    ours = rows[-1]
    assert ours["status"] == "mismatch" and ours["flip"]["step"] == 2 and ours["flip"]["tie"], ours
    assert "(first at step 2): teacher-forced from the prompt" in ours["reason"] and "a tie within rounding" in ours["reason"]
    _, table = genai_e2e.summary({"rows": rows, "device": "cpu"}, "decode")
    assert table[0][5] == "no (a tie)", table
    assert ours["vs_original"] == 1.0  # timed all the same: the same steps over the same lengths


def test_genai_fp8_variant_rows_and_columns():
    """--with-fp8's third variant: timed in the same rounds, its row gives ours over the original
    and over the fp16 rewrite, its tokens compared without marking the row (FP8 may move a near
    tie), and the summary adds its columns."""
    from ort_flash.bench import genai_e2e

    logits = np.zeros((9, 9), np.float32)
    timed = {"original": [1, 2, 3], "ort_flash": [1, 2, 3], genai_e2e.FP8_VARIANT: [1, 5, 3]}
    runners = {v: _ForcedRunner(logits, timed[v]) for v in timed}
    rows = genai_e2e.time_decode(runners, np.zeros(4, np.int32), dict(rounds=2, steps=3), {"kind": "decode", "tokens": 4})
    by = {r["peer"]: r for r in rows}
    assert list(by) == ["original", "ort_flash", genai_e2e.FP8_VARIANT]
    assert by["ort_flash"]["status"] == "ok" and by["ort_flash"]["identical"]
    f = by[genai_e2e.FP8_VARIANT]
    assert f["status"] == "ok" and f["identical"] is False and f["vs_original"] == 1.0 and f["vs_rewrite"] == 1.0, f
    header, table = genai_e2e.summary({"rows": rows, "device": "cpu"}, "decode")
    assert header[-4:] == ["fp8 tok/s", "fp8/original", "fp8/ort_flash", "fp8 tokens identical"]
    assert table[0][-3:] == ["1.00x", "1.00x", False]
    plain = genai_e2e.summary({"rows": [r for r in rows if r["peer"] != genai_e2e.FP8_VARIANT], "device": "cpu"},
                              "decode")[0]
    assert "fp8/original" not in plain
