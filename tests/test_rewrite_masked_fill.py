"""Eager masked_fill with a finite fill that does not absorb the scores (float16's finfo.min
-65504): kept by default, fused as -inf with ``exact_masked_rows=False`` (masked_fill.py).

Each graph is Div(MatMul(q, kᵀ), √D) → Where(keep, S, c) | Where(hide, c, S) → Softmax → @ v,
in GPT-2's form (a (B, 1, Sq, Skv) bool condition) and DistilBERT's (Equal(attention_mask, 0)
unsqueezed to (B, 1, 1, S) and expanded to Shape(S)), on odd shapes with query rows whose every
key is hidden and rows with some keys hidden. The fused model in ONNX Runtime is compared with
the float64 reference (softmax over the visible keys) on every row with a visible key, within
the 2× plain-low-precision contract; its fully hidden rows must be 0, where the original gives
the uniform average of V.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ort_flash
from cases import FLOORS
from ort_flash.reference import attention_lowp, attention_reference, error_bound
from ort_flash.rewriter import rewrite
from test_rewrite_masks import Graph

ort = pytest.importorskip("onnxruntime")

B, H, SQ, SKV, D = 2, 3, 13, 21, 24  # Sq != Skv, neither a power of two
TYPES = {"float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT}


def masked_fill_model(dtype: str, c: float, form: str) -> onnx.ModelProto:
    """``form``: "keep" (GPT-2: Where(keep, S, c), keep a bool input (B, 1, Sq, Skv)) or
    "expand_hide" (DistilBERT: Where(Cast(Expand(Unsqueeze(mask == 0), Shape(S))), c, S))."""
    g, elem = Graph(), TYPES[dtype]
    np_dtype = np.dtype(dtype)
    scores = g.op("Div", g.op("MatMul", "q", g.op("Transpose", "k", perm=[0, 1, 3, 2])),
                  g.const(D ** 0.5, np_dtype))
    fill = g.const(c, np_dtype)
    if form == "keep":
        scores = g.op("Where", "keep", scores, fill)
        cond = helper.make_tensor_value_info("keep", TensorProto.BOOL, ["B", 1, "Sq", "Skv"])
    else:
        hide = g.op("Unsqueeze", g.op("Equal", "attention_mask", g.const(0, np.int64)),
                    g.const([1, 2], np.int64))
        hide = g.op("Cast", g.op("Expand", hide, g.op("Shape", scores)), to=TensorProto.BOOL)
        scores = g.op("Where", hide, fill, scores)
        cond = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "Skv"])
    g.nodes.append(helper.make_node("MatMul", [g.op("Softmax", scores, axis=-1), "v"], ["y"],
                                    name="pv"))
    info = lambda n, s: helper.make_tensor_value_info(n, elem, ["B", H, s, D])  # noqa: E731
    graph = helper.make_graph(g.nodes, "masked_fill",
                              [info("q", "Sq"), info("k", "Skv"), info("v", "Skv"), cond],
                              [info("y", "Sq")], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def feeds_and_keep(dtype: str, form: str, seed: int = 0):
    """Random Q, K, V and the condition; ``keep`` (B, 1, Sq, Skv) bool: True = visible. Query
    row 0 of batch 0 sees no key ("keep"); batch 1 sees no key at all ("expand_hide")."""
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal((B, H, s, D)).astype(dtype)
             for n, s in (("q", SQ), ("k", SKV), ("v", SKV))}
    if form == "keep":
        keep = rng.random((B, 1, SQ, SKV)) < 0.6
        keep[0, 0, 0, :] = False
        feeds["keep"] = keep
    else:
        attention_mask = (rng.random((B, SKV)) < 0.7).astype(np.int64)
        attention_mask[1] = 0
        feeds["attention_mask"] = attention_mask
        keep = np.broadcast_to(attention_mask[:, None, None, :] != 0, (B, 1, SQ, SKV))
    return feeds, keep


def run(model: onnx.ModelProto, feeds: dict, fused: bool) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    make = ort_flash.InferenceSession if fused else ort.InferenceSession
    sess = make(model.SerializeToString(), sess_options=so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0].astype(np.float64)


CASES = [("float16", -65504.0, "keep"), ("float16", -65504.0, "expand_hide"),
         ("float32", -65504.0, "keep"), ("float32", -1e9, "expand_hide")]


@pytest.mark.parametrize("dtype, c, form", CASES, ids=[f"{d}-{c:g}-{f}" for d, c, f in CASES])
def test_finite_fill_is_kept_by_default_and_fused_as_minus_inf_on_opt_in(dtype, c, form):
    model = masked_fill_model(dtype, c, form)
    exact = rewrite(model)
    assert exact.report.total_fused == 0, exact.report.format_table()
    (unfused,) = exact.report.unfused
    assert "does not absorb the scores" in unfused.reason, unfused.reason
    assert "exact_masked_rows=False takes it as -inf" in unfused.reason, unfused.reason
    assert "--fast-padded-rows" in exact.report.format_table()

    fast = rewrite(model, exact_masked_rows=False)
    assert fast.report.total_fused == 1 and fast.report.unfused == [], fast.report.format_table()
    (entry,) = fast.report.fused
    assert "taken as -inf" in entry.note and "give 0" in entry.note, entry.note
    assert entry.mask == ("additive (B,1,Sq,Skv)" if form == "keep" else "additive (B,1,1,Skv)")
    onnx.checker.check_model(fast.model, full_check=True)

    feeds, keep = feeds_and_keep(dtype, form)
    y = run(fast.model, feeds, fused=True)
    y_original = run(model, feeds, fused=False)
    qkv = (feeds["q"], feeds["k"], feeds["v"])
    ref = attention_reference(*qkv, attn_mask=keep)[0]
    low = attention_lowp(*qkv, attn_mask=keep)[0].astype(np.float64)
    visible = np.broadcast_to(keep.any(axis=-1, keepdims=True), ref.shape)
    some_hidden = keep.any(axis=-1) & ~keep.all(axis=-1)
    assert some_hidden.any() and not keep.any(axis=-1).all()  # both kinds of row are there
    bound = error_bound(ref[visible], low[visible], FLOORS[dtype][0])
    err = np.abs(y - ref)[visible].max()
    assert err <= bound, (err, bound)
    # The original agrees on those rows too: its hidden weights exp(c - max) are 0.
    assert np.abs(y_original - ref)[visible].max() <= bound
    # Rows with every key hidden: the op gives 0, the original the mean of V over the keys.
    assert np.all(y[~visible] == 0.0)
    mean_v = np.broadcast_to(feeds["v"].astype(np.float64).mean(axis=2, keepdims=True), ref.shape)
    np.testing.assert_allclose(y_original[~visible], mean_v[~visible], atol=FLOORS[dtype][0] * 4)


def test_fill_above_float16_min_is_kept_even_on_opt_in():
    result = rewrite(masked_fill_model("float32", -1e4, "keep"), exact_masked_rows=False)
    assert result.report.total_fused == 0
    (unfused,) = result.report.unfused
    assert "-10000 does not absorb" in unfused.reason, unfused.reason
    assert "not taken as -inf even with exact_masked_rows=False" in unfused.reason, unfused.reason
