"""The benchmark harness on the CPU at tiny shapes: the JSON it writes, the FLOP and byte counts,
every peer computing the right function, and the report generator (markdown + PNGs from a
synthetic result). Nothing here asserts a time."""
from __future__ import annotations

import json
import math

import pytest

from ort_flash.bench import (
    cpu_suite, decode_e2e_suite, decode_peers, decode_suite, onnx_graphs, op_peers, op_suite, results, targets,
)
from ort_flash.bench.measure import Context, add_ratios
from ort_flash.bench.tensors import rotation_sets
from ort_flash.bench.workload import attention_flops, floor_ms, kv_read_bytes, tbps, tflops

CEILINGS = {"matmul_tflops": 1.0, "copy_tbps": 0.01}


def test_flop_formula():
    # 4·B·H·Sq·Skv·D: two matmuls of 2·M·N·K each
    assert attention_flops(2, 3, 5, 7, 11) == 4 * 2 * 3 * 5 * 7 * 11
    assert attention_flops(2, 3, 5, 7, 11, causal=True) == 2 * 2 * 3 * 5 * 7 * 11
    assert attention_flops(1, 1, 4, 4, 8, dv=16) == 2 * 4 * 4 * (8 + 16)
    # the benchmark issue's shape: 16k tokens, hidden 2048, N = 8k, d = 128 -> B 2, H 16
    assert attention_flops(2, 16, 8192, 8192, 128) == pytest.approx(1.0995e12, rel=1e-4)
    assert tflops(1e12, 1000.0) == pytest.approx(1.0)


def test_byte_counts():
    # decode issue: B1, Hkv 8, 32k cache, d128, fp16 -> K and V are 2 * 8 * 32768 * 128 * 2 bytes
    assert kv_read_bytes(1, 8, 32768, 128, "float16") == 2 * 8 * 32768 * 128 * 2
    assert tbps(4e12, 1000.0) == pytest.approx(4.0)
    assert floor_ms(1e12, 1e9, {"matmul_tflops": 1.0, "copy_tbps": 1.0}) == pytest.approx(1000.0)


def test_rotation_sets():
    assert rotation_sets(1e3) == 8
    assert rotation_sets(200 * 2**20) == 2
    assert rotation_sets(4 * 2**30) == 1  # a 4 GiB KV cache needs no company


def test_ratios_name_the_best_competitor():
    rows = [{"peer": "ort_flash", "status": "ok", "tflops": 90.0},
            {"peer": "ort_mha", "status": "ok", "tflops": 100.0},
            {"peer": "sdpa", "status": "ok", "tflops": 60.0},
            {"peer": "unfused", "status": "unsupported", "reason": "x"}]
    add_ratios(rows, "tflops")
    assert rows[0]["best_peer"] == "ort_mha" and rows[0]["vs_best_peer"] == pytest.approx(0.9)
    assert op_suite.verdict(0.9) == "0.90x (peer wins)" and op_suite.verdict(1.1) == "1.10x"


def _ctx():
    return Context.create("cpu", seed=1, target_s=0.01)


def test_op_peers_compute_attention_on_cpu():
    cfg = dict(dtype="float32", d=32, heads=2, batch=2, seqlen=48, causal=True)
    rows = op_suite.run_config(_ctx(), cfg, op_peers.peers_for("cpu"), CEILINGS)
    by = {r["peer"]: r for r in rows}
    assert set(by) == {"ort_flash", "ort_flash_kernel", "ort_mha", "onnx_attention", "unfused", "sdpa"}
    for name in ("ort_flash", "ort_flash_kernel", "ort_mha", "unfused"):
        assert by[name]["status"] == "ok", by[name]
        assert by[name]["ref_err"] < 1e-4, by[name]
        assert by[name]["tflops"] > 0
    assert "vs_best_peer" in by["ort_flash"]


def test_op_fp8_peer_runs_the_opt_in_and_has_a_column():
    """The CUDA op suite's FP8 peer is ort_flash's node with attention_precision="fp8" and the FP8
    error limit (run here on the CPU, where the node computes in its dtype: within the fp32 limit,
    so the limit is the only difference); the summary gives it a column and a ratio to the best
    competitor."""
    assert "ort_flash_fp8" in op_peers.peers_for("cuda") and "ort_flash_fp8" not in op_peers.peers_for("cpu")
    cfg = dict(dtype="float32", d=32, heads=2, batch=1, seqlen=40, causal=True)
    peers = {"ort_flash_fp8": op_peers.ort_flash_fp8, "unfused": op_peers.unfused}
    rows = op_suite.run_config(_ctx(), cfg, peers, CEILINGS)
    by = {r["peer"]: r for r in rows}
    assert by["ort_flash_fp8"]["status"] == "ok" and by["ort_flash_fp8"]["ref_err"] < 1e-4, by["ort_flash_fp8"]
    assert "vs_best_peer" in by["ort_flash_fp8"]
    built = op_peers.ort_flash_fp8(_ctx(), cfg, [{n: _ctx().tensors.randn((1, 2, 40, 32), "float32")
                                                   for n in ("q", "k", "v")}])
    assert built.error_limit == op_peers.FP8_LIMIT
    header, table = op_suite.summary({"rows": rows})
    assert "ort_flash_fp8" in header and "fp8/best" in header
    assert table[0][header.index("fp8/best")] == op_suite.verdict(by["ort_flash_fp8"]["vs_best_peer"])


def test_op_layered_peers_time_one_node_of_a_multi_node_run(monkeypatch):
    """With CUDA graphs (the op suite's default on CUDA) the four ONNX Runtime peers run a model of
    several copies of their node, as a model's layers, and report a node's share: forced here on
    the CPU at 3 copies, every peer still computes the function and the calls count nodes. On
    CUDA, copies fill about a millisecond a run: many at BERT's shapes, one at long ones."""
    monkeypatch.setattr(op_peers, "copies", lambda ctx, cfg: 3)
    cfg = dict(dtype="float32", d=32, heads=2, batch=2, seqlen=40, causal=False)
    peers = {k: v for k, v in op_peers.peers_for("cpu").items() if k in ("ort_flash", "ort_mha", "onnx_attention",
                                                                           "unfused")}
    by = {r["peer"]: r for r in op_suite.run_config(_ctx(), cfg, peers, CEILINGS)}
    for name in ("ort_flash", "ort_mha", "unfused"):
        assert by[name]["status"] == "ok" and by[name]["ref_err"] < 1e-4, by[name]
        assert by[name]["layers"] == 3 and by[name]["calls"] % 3 == 0, by[name]
    assert by["onnx_attention"]["status"] in ("ok", "unsupported"), by["onnx_attention"]
    monkeypatch.undo()
    gpu = Context("cuda", None, None, 0.1, cuda_graph=True)  # copies reads only these fields
    bert = dict(dtype="float16", d=64, heads=12, batch=32, seqlen=128, causal=False)
    assert op_peers.copies(gpu, bert) == 32
    assert op_peers.copies(gpu, dict(bert, heads=16, d=128, batch=2, seqlen=8192)) == 1
    assert op_peers.copies(Context("cuda", None, None, 0.1, cuda_graph=False), bert) == 1


def test_decode_peers_compute_attention_on_cpu():
    cfg = dict(dtype="float32", hq=4, hkv=2, d=32, batch=1, sq=4, cache=96)
    rows = decode_suite.run_config(_ctx(), cfg, decode_peers.peers_for("cpu"), CEILINGS)
    by = {r["peer"]: r for r in rows}
    for name in ("ort_flash", "ort_flash_past", "ort_flash_kernel", "ort_gqa", "sdpa"):
        assert by[name]["status"] == "ok", by[name]
        assert by[name]["ref_err"] < 1e-4, by[name]
        assert by[name]["kv_tbps"] > 0
    assert "ref_err" not in by["ort_mha"]  # MHA is not causal here: timed, not compared


def test_decode_layered_peers_time_one_node_of_a_multi_node_run(monkeypatch):
    """With CUDA graphs the decode suite runs ort_flash, ort_gqa and ort_mha as a model of many
    copies of their node (a model's layers), node j of run i on input set (i + j) mod sets, and
    reports a node's share; forced here on the CPU at 3 copies: every copy must compute the
    function on its own set, and the time is divided by the copies."""
    import onnx

    one = onnx_graphs.flash_attention("float32", {"Q": 4, "K": 4, "V": 4}, {"Y": 4}, is_causal=1)
    three = onnx.load_from_string(onnx_graphs.replicate(one, 3))
    onnx.checker.check_model(three)
    assert [n.op_type for n in three.graph.node] == ["FlashAttention"] * 3
    assert [i.name for i in three.graph.input][:4] == ["Q__0", "K__0", "V__0", "Q__1"]
    assert len({n.name for n in three.graph.node}) == 3

    monkeypatch.setattr(decode_peers, "_layers", lambda ctx, cfg: 3)
    cfg = dict(dtype="float32", hq=4, hkv=2, d=32, batch=2, sq=1, cache=80)
    peers = {k: v for k, v in decode_peers.peers_for("cpu").items() if k in ("ort_flash", "ort_gqa", "ort_mha")}
    rows = decode_suite.run_config(_ctx(), cfg, peers, CEILINGS)
    by = {r["peer"]: r for r in rows}
    for name in peers:
        assert by[name]["status"] == "ok", by[name]
        assert by[name]["layers"] == 3 and by[name]["sets"] >= 2, by[name]
        assert by[name]["ref_err"] < 1e-4, by[name]
        assert by[name]["calls"] % 3 == 0, by[name]
    monkeypatch.undo()
    gpu = Context("cuda", None, None, 0.1, cuda_graph=True)  # _layers reads only these fields
    for (b, cache), want in (((1, 4096), 32), ((8, 32768), 4), ((16, 131072), 1)):
        assert decode_peers._layers(gpu, dict(cfg, hkv=8, d=128, dtype="float16", batch=b, cache=cache)) == want


def test_cli_writes_a_valid_result(tmp_path):
    from ort_flash.cli import main

    out = tmp_path / "r.json"
    assert main(["bench", "--suite", "op", "--device", "cpu", "--quick", "--seqlens", "64",
                 "--dtypes", "float32", "--peers", "ort_flash", "unfused", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert results.validate(doc) == []
    suite = doc["suites"]["op"]
    assert suite["status"] == "complete" and suite["device"] == "cpu"
    assert {r["peer"] for r in suite["rows"]} == {"ort_flash", "unfused"}
    assert all(r["status"] == "ok" for r in suite["rows"])
    for key in ("date", "git", "versions", "host"):
        assert key in doc["environment"]
    assert doc["ceilings"]["matmul_tflops"] > 0 and doc["ceilings"]["source"] == "measured"


def test_validate_reports_problems():
    doc = results.new_document({"date": "d", "device": "cpu", "versions": {}, "git": {}}, {})
    suite = results.new_suite("cpu", {}, None)
    suite["status"] = "complete"
    suite["rows"] = [{"config": {}, "peer": "x", "status": "ok"},
                     {"config": {}, "peer": "y", "status": "error"}]
    doc["suites"]["op"] = suite
    problems = results.validate(doc)
    assert any("without a time" in p for p in problems)
    assert any("without a reason" in p for p in problems)


def test_cpu_workers_time_round_robin_and_read_memory():
    cfg = dict(dtype="float32", batch=1, heads=2, d=32, seqlen=128, causal=True)
    timed = cpu_suite.run_worker({"mode": "timing", "peers": ["ort_flash", "unfused"], "config": cfg,
                                  "target_s": 0.01, "sets": 2})
    for peer in ("ort_flash", "unfused"):
        assert timed[peer]["status"] == "ok", timed
        assert timed[peer]["ref_err"] < 1e-4 and timed[peer]["calls"] >= 5
    mem = cpu_suite.run_worker({"mode": "memory", "peers": ["unfused"], "config": cfg})
    assert mem["unfused"]["work_mb"] >= 0, mem


def test_growth_exponent():
    assert targets.growth_exponent([(512, 10.0), (1024, 20.0), (2048, 40.0)]) == pytest.approx(1.0)
    assert targets.growth_exponent([(512, 10.0), (1024, 40.0)]) == pytest.approx(2.0)
    assert targets.growth_exponent([(512, 10.0)]) is None


def _synthetic_document() -> dict:
    env = {"date": "2026-11-29T12:00:00+00:00", "device": "cuda",
           "host": {"cpu": "x", "cores": 16}, "gpu": {"name": "NVIDIA H200", "driver_version": "580.1"},
           "versions": {"onnxruntime": "1.31.1", "torch": "2.11", "triton": "3.6.0", "aot_triton": "3.6.0"},
           "git": {"commit": "0123456789abcdef", "dirty": False}}
    doc = results.new_document(env, {"matmul_tflops": 790.0, "copy_tbps": 4.3, "source": "measured"})
    op = results.new_suite("cuda", {}, 300)
    for n, ours, mha in ((512, 400.0, 425.0), (8192, 700.0, 654.0)):
        cfg = dict(dtype="float16", d=128, heads=16, batch=16384 // n, seqlen=n, causal=False)
        rows = [{"config": cfg, "peer": "ort_flash", "status": "ok", "ms": 1.0, "tflops": ours,
                 "ceiling_fraction": ours / 790},
                {"config": cfg, "peer": "ort_mha", "status": "ok", "ms": 1.0, "tflops": mha},
                {"config": cfg, "peer": "onnx_attention", "status": "unsupported",
                 "reason": "no CUDA kernel for Attention(23) bfloat16"}]
        add_ratios(rows, "tflops")
        op["rows"] += rows
    dec = results.new_suite("cuda", {"dtype": "float16", "hq": 32, "hkv": 8, "d": 128}, 120)
    for cache, ours, gqa in ((4096, 1.2, 0.4), (32768, 3.1, 1.6)):
        cfg = dict(dtype="float16", hq=32, hkv=8, d=128, batch=1, sq=1, cache=cache)
        rows = [{"config": cfg, "peer": "ort_flash", "status": "ok", "ms": 0.01, "kv_tbps": ours},
                {"config": cfg, "peer": "ort_gqa", "status": "ok", "ms": 0.02, "kv_tbps": gqa}]
        add_ratios(rows, "kv_tbps")
        dec["rows"] += rows
    e2e = results.new_suite("cuda", {"dtype": "float16"}, 300)
    for n in (2048, 8192):
        cfg = {"model": "bert-base", "layers": 4, "seqlen": n, "batch": 1, "dtype": "float16"}
        e2e["rows"] += [{"config": cfg, "peer": v, "status": "ok", "ms": ms, "peak_mb": mb, "act_mb": mb}
                        for v, ms, mb in (("original", 30.0, 4000.0), ("ort_flash", 8.0, 300.0),
                                          ("ort_optimizer", 9.0, 350.0))]
    e2e["models"] = {"bert-base": {"spec": {"parameters": 5e7, "layers": 4}}}
    step = results.new_suite("cuda", {"dtype": "float16"}, 170)
    for past, times in ((1024, (2.0, 1.8, 1.9)), (16384, (4.0, 2.5, 3.9))):
        cfg = {"model": "llama-1b", "layers": 4, "batch": 8, "past": past, "dtype": "float16"}
        group = [{"config": cfg, "peer": v, "status": "ok", "ms": ms, "ort_mb": 700.0, "cache_mb": past / 16}
                 for v, ms in zip(decode_e2e_suite.VARIANTS, times)]
        decode_e2e_suite._ratios(group)
        step["rows"] += group
    step["models"] = {"llama-1b": {"spec": {"parameters": 3.1e8, "layers": 4},
                                   "rewrite": {"fused": 4, "past_present": 4, "masks": ["additive"]},
                                   "verify": {"passed": True}}}
    for s in (op, dec, e2e, step):
        s["status"] = "complete"
    doc["suites"].update(op=op, decode=dec, e2e=e2e, decode_e2e=step)
    return doc


def test_report_from_synthetic_result(tmp_path):
    from ort_flash.bench.report import write_report

    path = tmp_path / "gpu.json"
    results.save(_synthetic_document(), path)
    md = tmp_path / "docs" / "PERFORMANCE.md"
    text = write_report([path], md)
    assert md.read_text() == text
    assert "NVIDIA H200" in text and "580.1" in text and "0123456789" in text
    assert "(peer wins)" in text  # N=512: ORT MHA is faster, and the table says so
    assert "no CUDA kernel for Attention(23)" in text
    assert "## CPU EP (fp32)\n\nNot yet measured." in text
    assert "| missed |" in text and "| met |" in text
    assert "## Decode step, end to end (CUDA, fp16)" in text and "1.60x" in text  # 4.0 / 2.5 ms
    e2e = text.split("## End to end (CUDA, fp16)")[1].split("\n## ")[0]
    assert "| ort_flash vs ORT optimizer |" in e2e and "ort_flash_opt" not in e2e  # a result without it
    for png in ("op_tflops_float16.png", "decode_bandwidth.png", "e2e_latency.png", "e2e_memory.png",
                "decode_e2e_latency.png"):
        p = md.parent / "performance" / png
        assert p.is_file() and p.read_bytes()[:4] == b"\x89PNG", png
        assert f"performance/{png}" in text


def test_report_renders_ort_flash_opt(tmp_path):
    """A result with the fourth e2e variant: its columns, ratios, model note and goal row; the
    synthetic result above (three variants, as results before it) renders without them."""
    from ort_flash.bench.report import write_report

    doc = _synthetic_document()
    e2e = doc["suites"]["e2e"]
    for cfg, ms in ((e2e["rows"][0]["config"], 6.0), (e2e["rows"][3]["config"], 10.0)):
        e2e["rows"].append({"config": cfg, "peer": "ort_flash_opt", "status": "ok", "ms": ms, "peak_mb": 290.0,
                            "act_mb": 290.0})
    e2e["models"]["bert-base"]["ort_flash_opt"] = {
        "fused_ops": {"SkipLayerNormalization": 8, "BiasGelu": 4}, "rewrite": {"fused": 4, "unfused": []},
        "verify": {"passed": True, "worst": {"output": "last_hidden_state", "max_abs": 0.004}}}
    path = tmp_path / "gpu.json"
    results.save(doc, path)
    text = write_report([path], tmp_path / "docs" / "PERFORMANCE.md")
    assert "| ort_flash_opt ms |" in text and "| ort_flash_opt vs ORT optimizer |" in text
    assert "| 6 |" in text and "1.50x |" in text  # N 2048: 9.0 / 6.0 ms over the ORT optimizer
    assert "0.90x (peer wins)" in text  # N 8192: 9.0 / 10.0
    assert "ort_flash_opt: ORT fused {'SkipLayerNormalization': 8, 'BiasGelu': 4}" in text
    assert "verify passed" in text
    goals = {g[0]: g[1] for g in targets.all_goals(doc["suites"])}
    assert goals["e2e: rewritten + ORT's other fusions (ort_flash_opt) ≥ 1.0× the ORT-optimizer model at 2k"] == "met"


def test_report_renders_the_llm_suites(tmp_path):
    """The gqa suite's run (here on the CPU at a tiny grid, plain and with Q/K norms) gets a section
    per variant with its first-prompt and decode tables; a later run of the same variant replaces
    the earlier one; its run is listed."""
    from ort_flash.bench.report import write_report
    from ort_flash.cli import main

    tiny = ["--quick", "--seqlens", "64", "--caches", "128", "--batches", "1"]
    paths = []
    for name, extra in (("plain", []), ("qk", ["--qk-norm"]), ("plain-again", [])):
        paths.append(tmp_path / f"gqa-{name}.json")
        assert main(["bench", "--suite", "gqa", "--device", "cpu", *tiny, *extra, "--out", str(paths[-1])]) == 0
    text = write_report(paths, tmp_path / "docs" / "PERFORMANCE.md")
    assert text.count("## GroupQueryAttention, GenAI's attention op (CPU EP, float32)") == 1
    assert "## GroupQueryAttention, GenAI's attention op (CPU EP, float32, Q/K norms)" in text
    section = text.split("(CPU EP, float32, Q/K norms)")[1].split("\n## ")[0]
    assert "### First prompt" in section and "### Decode" in section and "| ort_flash ms |" in section
    assert "q_norm_weight" in section  # ONNX Runtime's CPU op refuses the norms: its reason is shown
    runs = text.split("## Runs")[1].split("## Goals")[0]
    assert runs.count("| gqa | cpu |") == 2  # the plain run replaced by the later one, and the Q/K norm run


def test_targets_on_synthetic_result():
    goals = {g[0]: g[1:] for g in targets.all_goals(_synthetic_document()["suites"])}
    first = next(k for k in goals if k.startswith("op: ≥ 1.05×"))
    assert goals[first][0] == "missed" and "N512" in goals[first][1]
    assert goals["e2e: rewritten ≥ 1.0× the ORT-optimizer model at 2k"][0] == "met"
    assert goals["cpu: fused ≥ 1.0× ORT CPU MHA"][0] == "not measured"
    assert not math.isnan(targets.growth_exponent([(1, 1.0), (2, 2.0)]))


@pytest.mark.slow
def test_e2e_suite_on_cpu_with_a_tiny_model(tmp_path):
    """Export (fp32 on the CPU), rewrite, ORT optimizer, ORT optimizer without attention fusion +
    rewrite (verified against the original), four sessions, latency and memory."""
    import argparse

    from ort_flash.bench import e2e_suite
    from ort_flash.bench.measure import Budget

    g = e2e_suite.grid("cpu", quick=True, overrides={"models": ["bert-base"], "seqlens": [32], "layers": 1})
    suite = results.new_suite("cpu", g, None)
    e2e_suite.run(_ctx(), suite, CEILINGS, Budget(None), argparse.Namespace(cache_dir=str(tmp_path)),
                  save=lambda: None, progress=lambda it, **kw: it)
    by = {r["peer"]: r for r in suite["rows"]}
    assert set(by) == set(e2e_suite.VARIANTS) == {"original", "ort_flash", "ort_optimizer", "ort_flash_opt"}
    assert all(r["status"] == "ok" for r in by.values()), by
    info = suite["models"]["bert-base"]
    assert info["rewrite"]["fused"] == 1 and info["attention_nodes"]["ort_flash"] == {"FlashAttention": 1}
    assert "speedup_vs_original" in by["ort_flash"] and by["ort_flash"]["peak_mb"] is not None
    # ort_flash_opt: ORT's LayerNorm / Gelu fusions, no ORT attention, every attention ort_flash's
    opt = info["ort_flash_opt"]
    assert opt["rewrite"] == {"fused": 1, "unfused": []}, opt
    assert info["attention_nodes"]["ort_flash_opt"] == {"FlashAttention": 1}
    assert {"SkipLayerNormalization", "BiasGelu"} <= set(opt["fused_ops"]) and "Attention" not in opt["fused_ops"]
    assert opt["verify"]["passed"] and opt["verify"]["failed"] == [], opt["verify"]
    for peer in ("ort_flash", "ort_flash_opt"):
        assert {"speedup_vs_original", "speedup_vs_ort_optimizer"} <= set(by[peer]), by[peer]
    assert "best_peer" in by["ort_flash"] and by["ort_flash"]["best_peer"] != "ort_flash_opt"
    assert by["ort_flash_opt"]["peak_mb"] is not None and by["ort_flash_opt"]["ms"] > 0
    header, rows = e2e_suite.summary(suite)
    assert "ort_flash_opt ms" in header and "ort_flash_opt vs ORT optimizer" in header
    assert len(rows) == 1 and len(rows[0]) == len(header)
    doc = results.new_document({"date": "d", "device": "cpu", "versions": {}, "git": {}}, {})
    suite["status"] = "complete"
    doc["suites"]["e2e"] = suite
    assert results.validate(doc) == []


def test_decode_e2e_rows_say_why_there_is_no_time():
    """A rewrite that fused nothing gives ort_flash rows without a time or a ratio, with the
    reason; outputs that differ from the original are marked WRONG, with no ratio either."""
    info = {"rewrite": {"fused": 0, "unfused": ["no attention pattern matched"]}}
    reason = decode_e2e_suite._blocked("ort_flash", {"ort_flash": "model.flash.onnx"}, info)
    assert "fused no attention" in reason and "no attention pattern matched" in reason
    assert decode_e2e_suite._blocked("original", {"original": "model.onnx"}, info) is None
    assert decode_e2e_suite._blocked("ort_optimizer", {}, {"ort_optimizer_error": "optimizer failed: x"}) \
        == "optimizer failed: x"
    cfg = {"model": "llama-1b", "layers": 1, "batch": 1, "past": 64, "dtype": "float32"}
    for ours in ({"status": "unsupported", "reason": reason},
                 {"status": "mismatch", "ms": 1.0, "reason": "ort_flash.verify against the original failed"}):
        group = [{"config": cfg, "peer": "original", "status": "ok", "ms": 2.0},
                 {"config": cfg, "peer": "ort_flash", **ours}]
        decode_e2e_suite._ratios(group)
        assert "speedup_vs_original" not in group[1] and "vs_best_peer" not in group[1]
        (row,) = decode_e2e_suite.summary({"rows": group})[1]
        assert row[6] == ("n/a" if ours["status"] == "unsupported" else "1 WRONG") and row[-2] is None


@pytest.mark.slow
def test_decode_e2e_suite_on_cpu_with_a_tiny_model(tmp_path):
    """The LLaMA-style cached step exported (fp32, tiny width, one layer), rewritten (the cache
    absorbed as past/present), verified against the original, optimized by ORT; the three
    variants timed per (batch, past) with device-bound buffers, ratios on ours."""
    import argparse

    from ort_flash.bench.measure import Budget

    g = decode_e2e_suite.grid("cpu", quick=True, overrides={"layers": 1, "batches": [1, 2], "caches": [16, 48]})
    suite = results.new_suite("cpu", g, None)
    decode_e2e_suite.run(_ctx(), suite, CEILINGS, Budget(None), argparse.Namespace(cache_dir=str(tmp_path)),
                         save=lambda: None, progress=lambda it, **kw: it)
    assert len(suite["rows"]) == 4 * len(decode_e2e_suite.VARIANTS)
    assert all(r["status"] == "ok" and r["ms"] > 0 for r in suite["rows"]), suite["rows"]
    info = suite["models"]["llama-1b"]
    assert info["rewrite"]["fused"] == 1 and info["rewrite"]["past_present"] == 1, info["rewrite"]
    assert info["attention_nodes"]["ort_flash"] == {"FlashAttention": 1}
    assert info["verify"]["passed"] and info["verify"]["outputs"] == 3, info["verify"]
    ours = [r for r in suite["rows"] if r["peer"] == "ort_flash"]
    assert {(r["config"]["batch"], r["config"]["past"]) for r in ours} == {(1, 16), (1, 48), (2, 16), (2, 48)}
    assert all("speedup_vs_original" in r and "speedup_vs_ort_optimizer" in r for r in ours)
    header, rows = decode_e2e_suite.summary(suite)
    assert len(rows) == 4 and "ort_flash vs original" in header
    doc = results.new_document({"date": "d", "device": "cpu", "versions": {}, "git": {}}, {})
    suite["status"] = "complete"
    doc["suites"]["decode_e2e"] = suite
    assert results.validate(doc) == []


def test_interleaved_medians_time_every_session_in_each_round():
    """The demo's timing: one run of each session per round, the order rotating, so a slow spell
    of the machine lands on every session; each gets the median of its own runs."""
    import time

    from ort_flash.timing import interleaved_medians

    calls = []

    class Fake:
        def __init__(self, name, ms):
            self.name, self.ms = name, ms

        def run_once(self, i=0):
            calls.append(self.name)
            time.sleep(self.ms / 1e3)

    timers = [Fake("a", 1.0), Fake("b", 6.0), Fake("c", 3.0)]
    medians = interleaved_medians(timers, repeat=6, warmup=1)
    assert calls[:3] == ["a", "b", "c"]                  # warm-up
    rounds = [calls[3 + 3 * r: 6 + 3 * r] for r in range(6)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert rounds[0][0] == "a" and rounds[1][0] == "b" and rounds[2][0] == "c"
    assert medians[0] < medians[2] < medians[1]
    assert 0.9 <= medians[0] and 5.5 <= medians[1]
