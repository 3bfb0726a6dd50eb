"""Rule table for kv_cache (and causal_mask with a past) on small hand-built decoding steps.

Each graph concatenates a cache with the new keys and values (present = Concat(past, new) as a
graph output) and attends over them with a mask built from the past length. The Concat must
become the op's past_key/past_value + present outputs, with the graph's output names kept; the
mask must become ``is_causal`` only where its causal window is bottom-right (query i sees keys up
to i + past). Rewritten graphs are evaluated with onnx.reference against the original, presents
included.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_reference import run_reference
from ort_flash.rewriter import rewrite
from test_rewrite_masks import FMIN, Graph

H, D = 2, 8


def _length(g, value, axis=2):  # a 0-d int64 dim of a graph value
    return g.op("Squeeze", g.op("Shape", value, start=axis, end=axis + 1), g.const([0], np.int64))


def causal_with_past(g, *, offset=True, from_concat=False):
    """Where(key <= query + past and attention_mask[b, key], 0, finfo.min), (B, 1, S, P + S)."""
    past = _length(g, "past_key")
    total = _length(g, "key_all") if from_concat else g.op("Add", past, _length(g, "q"))
    keys = g.op("Unsqueeze", g.op("Range", g.const(0, np.int64), total, g.const(1, np.int64)),
                g.const([0], np.int64))
    start = past if offset else g.const(0, np.int64)
    stop = g.op("Add", start, _length(g, "q"))
    queries = g.op("Unsqueeze", g.op("Range", start, stop, g.const(1, np.int64)),
                   g.const([1], np.int64))
    padding = g.op("Unsqueeze", g.op("Cast", "attention_mask", to=TensorProto.BOOL),
                   g.const([1, 2], np.int64))
    visible = g.op("And", padding, g.op("LessOrEqual", keys, queries))
    return g.op("Where", visible, g.const(0.0, np.float32), g.const(FMIN, np.float32))


def no_mask(g):
    return None


def cached_model(build_mask, **kwargs) -> onnx.ModelProto:
    g = Graph()
    g.nodes.append(helper.make_node("Concat", ["past_key", "k"], ["key_all"], axis=2, name="cat_k"))
    g.nodes.append(helper.make_node("Concat", ["past_value", "v"], ["value_all"], axis=-2,
                                    name="cat_v"))
    mask = build_mask(g, **kwargs)
    kt = g.op("Transpose", "key_all", perm=[0, 1, 3, 2])
    scores = g.op("Mul", g.op("MatMul", "q", kt), g.const(D ** -0.5, np.float32))
    if mask is not None:
        scores = g.op("Add", scores, mask)
    g.nodes.append(helper.make_node("MatMul", [g.op("Softmax", scores, axis=-1), "value_all"],
                                    ["y"], name="pv"))
    value = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", H, s, D])  # noqa: E731
    inputs = [value("q", "S"), value("k", "S"), value("v", "S"), value("past_key", "P"),
              value("past_value", "P")]
    if mask is not None:
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                                    ["B", "P + S"]))
    outputs = [value("y", "S"), value("key_all", "P + S"), value("value_all", "P + S")]
    graph = helper.make_graph(g.nodes, "cached", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feeds(model, s=5, p=3, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal((2, H, s, D)).astype(np.float32) for n in "qkv"}
    for n in ("past_key", "past_value"):
        feeds[n] = rng.standard_normal((2, H, p, D)).astype(np.float32)
    if any(i.name == "attention_mask" for i in model.graph.input):
        pad = np.ones((2, p + s), np.int64)
        pad[1, -2:] = 0  # right padding
        feeds["attention_mask"] = pad
    return feeds


# id, mask builder and its arguments, (past absorbed, causal, mask kind), reason a rule declined
CASES = [
    ("causal_offset_by_past", causal_with_past, {}, (True, True, "additive (B,1,1,Skv)"), None),
    ("no_mask", no_mask, {}, (True, False, "none"), None),
    ("top_left_causal_is_not_bottom_right", causal_with_past, {"offset": False},
     (True, False, "additive (B,1,S,P + S)"), ("causal_mask", "offset by 0 (key <= query + 0), the "
                                               "op's is_causal here by P")),
    # the mask reads only the Concat's length (kv_cache.ConcatShape computes it from past, new)
    ("mask_reads_the_concat_length", causal_with_past, {"from_concat": True},
     (True, True, "additive (B,1,1,Skv)"), None),
]


@pytest.mark.parametrize("case_id, build, kwargs, expected, declined", CASES,
                         ids=[c[0] for c in CASES])
def test_kv_cache(case_id, build, kwargs, expected, declined):
    model = cached_model(build, **kwargs)
    result = rewrite(model, exact_masked_rows=False)
    (entry,) = result.report.fused
    assert (entry.cache == "past/present", entry.causal) == expected[:2], result.report.format_table()
    assert entry.mask == expected[2], entry
    assert result.report.unfused == []
    if declined is None:
        assert not result.report.declined.get(entry.fused_node, {}).get("kv_cache")
    else:
        rule, reason = declined
        assert reason in result.report.declined[entry.fused_node][rule], result.report.format_table()
    onnx.checker.check_model(result.model, full_check=True)
    assert [o.name for o in result.model.graph.output] == ["y", "key_all", "value_all"]
    concats = [n.name for n in result.model.graph.node if n.name in ("cat_k", "cat_v")]
    assert concats == ([] if expected[0] else ["cat_k", "cat_v"])
    feeds = _feeds(model)
    for got, want in zip(run_reference(result.model, feeds), run_reference(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
