"""The op contract on CUDAExecutionProvider: the shared case table (tests/cases.py) through ONNX
Runtime, and the bundled demo model in a CUDA session against the unfused original."""
from __future__ import annotations

import pytest

from cases import CASES, case_id, run_case

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_case_on_cuda(case):
    run_case(case, "CUDAExecutionProvider")


def test_demo_model_verifies_on_cuda():
    import onnx

    from ort_flash.demo import demo_model_path
    from ort_flash.rewriter import rewrite
    from ort_flash.verify import verify

    original = onnx.load(demo_model_path("cuda"))
    result = rewrite(original)
    assert result.report.total_fused == 2
    check = verify(original, result.model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
                   batch=2, seq_len=300)
    print(check.format_table())
    assert check.passed
    assert check.rewritten_providers[0] == "CUDAExecutionProvider"


def test_fused_op_runs_on_cuda_provider():
    """ONNX Runtime's profiler shows where each node ran: every FlashAttention on CUDA."""
    import onnx

    import ort_flash
    from ort_flash.demo import demo_model_path
    from ort_flash.rewriter import rewrite
    from ort_flash.timing import node_placements
    from ort_flash.verify import make_inputs

    original = onnx.load(demo_model_path("cuda"))
    model = rewrite(original).model.SerializeToString()
    placed = node_placements(model, make_inputs(original, batch=1, seq_len=77, seed=1),
                             ["CUDAExecutionProvider", "CPUExecutionProvider"], ort_flash.session_options())
    fa = {prov: n for (op, prov), n in placed.items() if op == "FlashAttention"}
    assert fa == {"CUDAExecutionProvider": 2}, placed
