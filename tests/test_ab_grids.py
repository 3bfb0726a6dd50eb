"""lab/experiments/ab_grids.py: the comparison of the shipped table's op-suite rows against a candidate
grid's, medians over rounds, through ONNX Runtime and for the kernel alone."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("ab_grids", ROOT / "lab" / "experiments" / "ab_grids.py")
ab_grids = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab_grids)


def _doc(times: dict) -> dict:
    rows = []
    for (n, causal), (ours, kernel) in times.items():
        config = {"dtype": "float16", "d": 128, "heads": 16, "batch": 16384 // n, "seqlen": n, "causal": causal}
        rows += [{"peer": "ort_flash", "status": "ok", "ms": ours, "config": config},
                 {"peer": "ort_flash_kernel", "status": "ok", "ms": kernel, "config": config},
                 {"peer": "sdpa_cudnn", "status": "ok", "ms": 0.5, "config": config}]
    rows.append({"peer": "ort_flash", "status": "error", "reason": "x",
                 "config": {"dtype": "float16", "d": 128, "heads": 16, "batch": 1, "seqlen": 16384, "causal": True}})
    return {"suites": {"op": {"rows": rows}}}


def test_compare_takes_medians_per_side_and_the_ratio():
    shipped = [_doc({(8192, True): (1.0, 0.9)}), _doc({(8192, True): (1.2, 1.1)}), _doc({(8192, True): (5.0, 0.95)})]
    candidate = [_doc({(8192, True): (0.8, 1.0), (4096, False): (2.0, 2.0)})]
    rows = ab_grids.compare({"shipped": shipped, "candidate": candidate})
    by = {(r["config"]["seqlen"], r["config"]["causal"]): r for r in rows}
    assert set(by) == {(8192, True), (4096, False)}  # the error row is no time
    r = by[(8192, True)]
    assert r["ort_flash"]["shipped_ms"] == pytest.approx(1.2) and r["ort_flash"]["candidate_ms"] == pytest.approx(0.8)
    assert r["ort_flash"]["shipped_over_candidate"] == pytest.approx(1.5)
    assert r["ort_flash_kernel"]["shipped_over_candidate"] == pytest.approx(0.95)
    assert r["ort_flash"]["rounds"] == 1
    only = by[(4096, False)]["ort_flash"]
    assert "shipped_over_candidate" not in only and only["rounds"] == 0
    text = ab_grids.format_rows(rows)
    assert "1.500" in text and "0.950" in text and "n/a" in text


def test_compare_gqa_suite_rows():
    """--suite gqa: the drop-in (ort_flash) and the plain op on the same attention (ort_flash_fa)
    are the two rows compared; ONNX Runtime's own op is left out."""
    config = {"dtype": "float16", "hq": 32, "hkv": 8, "d": 128, "phase": "prefill", "batch": 128, "seqlen": 128}

    def doc(ours, plain):
        return {"suites": {"gqa": {"rows": [{"peer": "ort_flash", "status": "ok", "ms": ours, "config": config},
                                            {"peer": "ort_flash_fa", "status": "ok", "ms": plain, "config": config},
                                            {"peer": "ort_gqa", "status": "ok", "ms": 0.6, "config": config}]}}}
    rows = ab_grids.compare({"shipped": [doc(0.21, 0.14)], "candidate": [doc(0.175, 0.12)]}, "gqa")
    (r,) = rows
    assert set(r) == {"config", "ort_flash", "ort_flash_fa"}
    assert r["ort_flash"]["shipped_over_candidate"] == pytest.approx(1.2)
    assert r["ort_flash_fa"]["shipped_over_candidate"] == pytest.approx(0.14 / 0.12)
    text = ab_grids.format_rows(rows, "gqa")
    assert "plain-op ratio" in text and "1.200" in text and "prefill" in text
