"""Every GenAI builder family of lab/models/genai_family.py as a CUDA user builds it (GenAI's builder,
``-p fp16 -e cuda``: Qwen3's Q/K norms fused into GroupQueryAttention, Gemma 2's softcap, the
windows), rewritten by ``ort-flash rewrite`` with every node ort_flash's CUDA op computes mapped
(``gqa_cuda="all"``: these tiny families have heads of 32, which the default leaves to ONNX
Runtime), and checked teacher-forced against the original through ONNX Runtime CUDA sessions fed
as GenAI feeds them (``genai_fidelity.check``): the logits of every step within the rounding
bound, every differing argmax a tie. Every node is mapped, a window-sized KV cache's too (the
session driver gives those layers buffers of the window's length, as ONNX Runtime's CUDA op needs;
its batch of two has rows of one length: such a cache takes no padding, nor do the convolution
and recurrent states of LFM2 and Qwen 3.5). GPU only (marked gpu)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime_genai", reason="onnxruntime_genai (onnxruntime-genai-cuda) is not installed")

from lab.models.families import ExportFailure  # noqa: E402
from lab.models.genai_family import FAMILIES, build  # noqa: E402
from ort_flash.bench import genai_e2e, genai_fidelity as fid  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

PROMPT, STEPS = 40, 24


def _gqa_nodes(folder):
    m = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    return [n for n in m.graph.node if n.op_type == "GroupQueryAttention"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cuda_build_rewritten_and_within_rounding(family, tmp_path):
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime has no CUDA execution provider")
    try:
        original = build(family, precision="fp16", ep="cuda")
    except ExportFailure as e:
        pytest.skip(f"GenAI's builder refuses {family} for CUDA: {str(e).splitlines()[-1][:200]}")
    nodes = _gqa_nodes(original)
    assert nodes, "the builder wrote no GroupQueryAttention"
    windowed = sum(1 for n in nodes for a in n.attribute if a.name == "sliding_window_cache" and a.i == 1)
    rewritten = tmp_path / "flash"
    info = genai_e2e.rewrite_folder(original, rewritten, gqa_cuda="all")
    assert info["fused"] == len(nodes), (info, len(nodes), windowed)
    kept = [n for n in _gqa_nodes(rewritten) if n.domain == "com.microsoft"]
    assert not kept, [n.name for n in kept]
    if family == "qwen3":  # the CUDA build fuses the norms into the node, and the rewrite keeps them
        assert all(n.input[14] and n.input[15] for n in _gqa_nodes(rewritten)), "no Q/K norm inputs"
    sessions = {v: fid.SessionDriver(f, "cuda") for v, f in (("original", original), ("ort_flash", rewritten))}
    assert len(sessions["original"].windows) == windowed
    vocab = json.loads((original / "genai_config.json").read_text())["model"]["vocab_size"]
    for batch in (1, 2):
        rows = fid.prompt_rows(np.random.default_rng(batch), PROMPT, batch, vocab)
        if windowed or sessions["original"].states:
            # No padding into a window-sized cache, nor into a convolution or recurrent state
            # (it would carry the pad tokens into the shorter row's later steps): rows of one length.
            rows = [np.resize(r, PROMPT) for r in rows]
        s = fid.check(sessions, sessions["original"], rows, STEPS, "float16")
        assert s["passed"], {k: s[k] for k in ("steps_over_bound", "unexplained", "worst_diff_over_bound", "max_diff")}
