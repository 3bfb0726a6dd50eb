"""Rule tables for the mask, GQA and node-level rules on small hand-built graphs.

Masks as exporters spell them (Trilu on ones, Range + Less, a constant table, key padding with
bool or additive values, a sliding window) must become ``is_causal`` (and ``left_window_size``)
and/or a (B, 1, 1, S) mask; look-alikes (a shifted diagonal, a mask value that does not hide,
query-axis padding) must keep their mask, with the reason in the report. Every rewritten graph is
evaluated with onnx.reference (FlashAttention = the package's reference attention) against the
original.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_reference import run_reference
from ort_flash.rewriter import rewrite

H, D = 2, 8
FMIN = float(np.finfo(np.float32).min)


class Graph:
    """A little node builder: ``g.op("Add", a, b)`` returns the output name."""

    def __init__(self) -> None:
        self.nodes, self.inits, self.n = [], [], 0

    def op(self, op_type, *inputs, **attrs):
        self.n += 1
        out = f"{op_type.lower()}_{self.n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def const(self, value, dtype=None):
        self.n += 1
        name = f"c_{self.n}"
        self.inits.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))
        return name


def _seq(g):  # the sequence length as a 0-d int64, read from Q's shape
    return g.op("Squeeze", g.op("Shape", "q", start=2, end=3), g.const([0], np.int64))


def _causal(g, offset=0, op="LessOrEqual"):
    r = g.op("Range", g.const(0, np.int64), _seq(g), g.const(1, np.int64))
    key = g.op("Unsqueeze", r, g.const([0], np.int64))  # (1, S)
    query = g.op("Unsqueeze", r, g.const([1], np.int64))  # (S, 1)
    if offset:
        query = g.op("Add", query, g.const(offset, np.int64))
    return g.op(op, key, query)


def _padding(g):  # (B, 1, 1, S) bool from the 0/1 attention_mask input
    return g.op("Unsqueeze", g.op("Cast", "attention_mask", to=TensorProto.BOOL),
                g.const([1, 2], np.int64))


def mask_trilu(g):  # torch SDPA's is_causal: Where(Trilu(ones) == 0, -inf, 0)
    size = g.op("Concat", g.op("Shape", "q", start=2, end=3), g.op("Shape", "k", start=2, end=3),
                axis=0)
    ones = g.op("Expand", g.const(1.0, np.float32), size)
    low = g.op("Trilu", ones, upper=0)
    return g.op("Where", g.op("Equal", low, g.const(0.0, np.float32)),
                g.const(-np.inf, np.float32), g.const(0.0, np.float32))


def mask_range_less(g):  # j < i + 1 with finfo.min
    return g.op("Where", _causal(g, offset=1, op="Less"), g.const(0.0, np.float32),
                g.const(FMIN, np.float32))


def mask_table(g):  # a constant lower-triangular table, sliced to the (static) sequence
    table = g.const(np.tril(np.ones((6, 6), bool)))
    sliced = g.op("Slice", table, g.const([0, 0], np.int64), g.const([6, 6], np.int64))
    return g.op("Where", sliced, g.const(0.0, np.float32), g.const(-1e4, np.float32))


def mask_causal_padding(g):
    visible = g.op("And", _padding(g), _causal(g))
    return g.op("Where", visible, g.const(0.0, np.float32), g.const(-np.inf, np.float32))


def mask_padding_materialized(g):  # padding expanded to (B, 1, S, S)
    rows = g.op("Concat", g.op("Shape", "q", start=0, end=1), g.const([1], np.int64),
                g.op("Shape", "q", start=2, end=3), g.op("Shape", "k", start=2, end=3), axis=0)
    visible = g.op("Expand", _padding(g), rows)
    return g.op("Where", visible, g.const(0.0, np.float32), g.const(FMIN, np.float32))


def _inverted(g, value=1.0):  # transformers' 1 - mask.float(), (B, 1, S, S)
    rows = g.op("Concat", g.op("Shape", "q", start=0, end=1), g.const([1], np.int64),
                g.op("Shape", "q", start=2, end=3), g.op("Shape", "k", start=2, end=3), axis=0)
    expanded = g.op("Expand", g.op("Unsqueeze", "attention_mask", g.const([1, 2], np.int64)), rows)
    return g.op("Sub", g.const(value, np.float32), g.op("Cast", expanded, to=TensorProto.FLOAT))


def mask_inverted_where(g):  # Where(Cast(bool, 1 - m.float()), finfo.min, 0)
    hidden = g.op("Cast", _inverted(g), to=TensorProto.BOOL)
    return g.op("Where", hidden, g.const(FMIN, np.float32), g.const(0.0, np.float32))


def mask_inverted_masked_fill(g):  # inverted.masked_fill(inverted.bool(), finfo.min)
    inverted = _inverted(g)
    hidden = g.op("Cast", g.op("Cast", inverted, to=TensorProto.BOOL), to=TensorProto.BOOL)
    return g.op("Where", hidden, g.const(FMIN, np.float32), inverted)


def mask_inverted_product(g):  # (1 - m.float()) * finfo.min: a mask only for 0/1 inputs
    return g.op("Mul", _inverted(g), g.const(FMIN, np.float32))


def mask_inverted_half(g):  # Where(Cast(bool, 0.5 - m.float()), ...): m == 0.5 never holds
    hidden = g.op("Cast", _inverted(g, 0.5), to=TensorProto.BOOL)
    return g.op("Where", hidden, g.const(FMIN, np.float32), g.const(0.0, np.float32))


def _triu_times_greater(g):  # triu(full(min), 1) * (arange > cache_position[:, None]), (S, S)
    size = g.op("Concat", g.op("Shape", "q", start=2, end=3), g.op("Shape", "k", start=2, end=3),
                axis=0)
    full = g.op("ConstantOfShape", size, value=numpy_helper.from_array(np.array([FMIN], np.float32)))
    upper = g.op("Trilu", full, g.const(1, np.int64), upper=1)
    r = g.op("Range", g.const(0, np.int64), _seq(g), g.const(1, np.int64))
    later = g.op("Greater", r, g.op("Reshape", r, g.const([-1, 1], np.int64)))
    return g.op("Mul", upper, g.op("Cast", later, to=TensorProto.FLOAT))


def _identity_indices(g, x):  # ScatterND indices of every element of the 4-D x, in order
    parts = []
    for axis in range(4):
        n = g.op("Squeeze", g.op("Shape", x, start=axis, end=axis + 1), g.const([0], np.int64))
        r = g.op("Range", g.const(0, np.int64), n, g.const(1, np.int64))
        r = g.op("Reshape", r, g.const([-1] + [1] * (3 - axis), np.int64))
        parts.append(g.op("Unsqueeze", g.op("Expand", r, g.op("Shape", x)), g.const([-1], np.int64)))
    return g.op("Concat", *parts, axis=-1)


def mask_triu_greater(g):
    return g.op("Unsqueeze", _triu_times_greater(g), g.const([0, 1], np.int64))


def mask_scatternd_padding(g, padding="attention_mask"):
    """transformers 4.4x's causal_mask[..., :L] = causal_mask[..., :L].masked_fill(
    (causal_mask[..., :L] + attention_mask[:, None, None, :]) == 0, min), L the key length."""
    rows = g.op("Concat", g.op("Shape", "q", start=0, end=1), g.const([1], np.int64),
                g.op("Shape", "q", start=2, end=3), g.op("Shape", "k", start=2, end=3), axis=0)
    causal = g.op("Expand", mask_triu_greater(g), rows)
    if padding != "attention_mask":  # no attention_mask given: transformers uses ones
        padding = g.op("ConstantOfShape", g.op("Shape", "attention_mask"),
                       value=numpy_helper.from_array(np.array([1], np.int64)))
    pad = g.op("Cast", g.op("Unsqueeze", padding, g.const([1, 2], np.int64)), to=TensorProto.FLOAT)
    hidden = g.op("Equal", g.op("Add", causal, pad), g.const(0.0, np.float32))
    updates = g.op("Where", hidden, g.const(FMIN, np.float32), causal)
    return g.op("ScatterND", causal, _identity_indices(g, causal), updates)


def mask_scatternd_first_key(g):  # ScatterND over key 0 only: part of the tensor
    rows = g.op("Concat", g.op("Shape", "q", start=0, end=1), g.const([1], np.int64),
                g.op("Shape", "q", start=2, end=3), g.op("Shape", "k", start=2, end=3), axis=0)
    causal = g.op("Expand", mask_triu_greater(g), rows)
    first = g.op("Slice", causal, g.const([0], np.int64), g.const([1], np.int64),
                 g.const([3], np.int64))
    return g.op("ScatterND", causal, _identity_indices(g, first),
                g.op("Mul", first, g.const(0.0, np.float32)))


def mask_scatternd_ones(g):
    return mask_scatternd_padding(g, padding="ones")


def mask_shifted(g):  # j <= i + 1: not causal
    return g.op("Where", _causal(g, offset=1), g.const(0.0, np.float32), g.const(FMIN, np.float32))


def mask_window(g):  # causal and j > i - 3: a sliding window
    r = g.op("Range", g.const(0, np.int64), _seq(g), g.const(1, np.int64))
    key = g.op("Unsqueeze", r, g.const([0], np.int64))
    low = g.op("Sub", g.op("Unsqueeze", r, g.const([1], np.int64)), g.const(3, np.int64))
    visible = g.op("And", _causal(g), g.op("Greater", key, low))
    return g.op("Where", visible, g.const(0.0, np.float32), g.const(FMIN, np.float32))


def mask_small_value(g):  # -1 does not hide a key
    return g.op("Where", _causal(g), g.const(0.0, np.float32), g.const(-1.0, np.float32))


def mask_query_padding(g):  # padding on the query axis (B, 1, S, 1)
    pad = g.op("Unsqueeze", g.op("Cast", "attention_mask", to=TensorProto.BOOL),
               g.const([1, 3], np.int64))
    return g.op("Where", pad, g.const(0.0, np.float32), g.const(FMIN, np.float32))


def masked_model(build_mask, *, seq="S") -> onnx.ModelProto:
    g = Graph()
    mask = build_mask(g)
    kt = g.op("Transpose", "k", perm=[0, 1, 3, 2])
    scores = g.op("Mul", g.op("MatMul", "q", kt), g.const(D ** -0.5, np.float32))
    probs = g.op("Softmax", g.op("Add", scores, mask), axis=-1)
    g.nodes.append(helper.make_node("MatMul", [probs, "v"], ["y"], name="pv"))
    value = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", H, seq, D])  # noqa: E731
    inputs = [value("q"), value("k"), value("v"),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", seq])]
    graph = helper.make_graph(g.nodes, "masked", inputs, [value("y")], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feeds(model, s=6, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal((2, H, s, D)).astype(np.float32) for n in "qkv"}
    pad = np.ones((2, s), np.int64)
    pad[1, s - 2:] = 0  # right padding
    feeds["attention_mask"] = pad
    return feeds


# id, mask builder, static sequence, (causal, mask kind) after rewriting
MAPPED = [
    ("trilu_is_causal", mask_trilu, "S", (True, "none")),
    ("range_less", mask_range_less, "S", (True, "none")),
    ("constant_table", mask_table, 6, (True, "none")),
    ("causal_and_padding", mask_causal_padding, "S", (True, "additive (B,1,1,Skv)")),
    ("padding_expanded", mask_padding_materialized, "S", (False, "additive (B,1,1,Skv)")),
    ("padding_inverted_float", mask_inverted_where, "S", (False, "additive (B,1,1,Skv)")),
    ("padding_inverted_masked_fill", mask_inverted_masked_fill, "S",
     (False, "additive (B,1,1,Skv)")),
    ("triu_times_greater", mask_triu_greater, "S", (True, "none")),
    ("sliding_window", mask_window, "S", (True, "none, left window 2")),
    ("scatternd_padding_of_ones", mask_scatternd_ones, "S", (True, "none")),
]
# id, mask builder, reason substring
KEPT = [
    ("shifted_diagonal", mask_shifted, "causal window is offset by 1"),
    ("mask_value_too_small", mask_small_value, "not a mask value"),
    ("query_axis_padding", mask_query_padding, "neither causal nor key padding"),
    ("padding_times_min", mask_inverted_product, "input's values is not modelled"),
    ("padding_compared_with_half", mask_inverted_half, "padding compared with 0.5"),
    ("scatternd_of_part", mask_scatternd_first_key, "writes part of the tensor"),
]


@pytest.mark.parametrize("case_id, build, seq, expected", MAPPED, ids=[c[0] for c in MAPPED])
def test_mask_mapped(case_id, build, seq, expected):
    model = masked_model(build, seq=seq)
    result = rewrite(model)
    (entry,) = result.report.fused
    assert (entry.causal, entry.mask) == expected
    assert result.report.counts["causal_mask"] == 1 and not result.report.declined
    onnx.checker.check_model(result.model, full_check=True)
    feeds = _feeds(model)
    (want,) = run_reference(model, feeds)
    (got,) = run_reference(result.model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case_id, build, reason", KEPT, ids=[c[0] for c in KEPT])
def test_mask_kept_with_reason(case_id, build, reason):
    result = rewrite(masked_model(build))
    (entry,) = result.report.fused  # still fused, with the mask as it was
    assert not entry.causal and entry.mask.startswith("additive (")
    declined = result.report.declined[entry.fused_node]["causal_mask"]
    assert reason in declined, declined
    assert reason in result.report.format_table()


def test_exact_masked_rows_keeps_finite_causal_padding_mask():
    def build(g):
        visible = g.op("And", _padding(g), _causal(g))
        return g.op("Where", visible, g.const(0.0, np.float32), g.const(FMIN, np.float32))

    loose, exact = rewrite(masked_model(build), exact_masked_rows=False), rewrite(masked_model(build))
    assert loose.report.fused[0].causal and "left-padded" in loose.report.fused[0].note
    assert not exact.report.fused[0].causal
    assert "exact_masked_rows" in exact.report.declined[exact.report.fused[0].fused_node]["causal_mask"]


# ---------------------------------------------------------------- repeat_kv


def gqa_model(unsqueeze_axis=2, n_rep=2, hkv=2) -> onnx.ModelProto:
    g = Graph()

    def repeat(x):
        u = g.op("Unsqueeze", x, g.const([unsqueeze_axis], np.int64))
        full = g.op("Concat", g.op("Shape", x, start=0, end=1),
                    g.const([hkv, n_rep] if unsqueeze_axis == 2 else [n_rep, hkv], np.int64),
                    g.op("Shape", x, start=2, end=4), axis=0)
        e = g.op("Expand", u, full)
        shape4 = g.op("Concat", g.op("Shape", x, start=0, end=1), g.const([hkv * n_rep], np.int64),
                      g.op("Shape", x, start=2, end=4), axis=0)
        return g.op("Reshape", e, shape4)

    k, v = repeat("k"), repeat("v")
    kt = g.op("Transpose", k, perm=[0, 1, 3, 2])
    probs = g.op("Softmax", g.op("Div", g.op("MatMul", "q", kt), g.const(D ** 0.5, np.float32)))
    g.nodes.append(helper.make_node("MatMul", [probs, v], ["y"], name="pv"))
    info = lambda n, h: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", h, "S", D])  # noqa: E731
    graph = helper.make_graph(g.nodes, "gqa", [info("q", hkv * n_rep), info("k", hkv), info("v", hkv)],
                              [info("y", hkv * n_rep)], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_repeat_kv_absorbed():
    model = gqa_model()
    result = rewrite(model)
    (entry,) = result.report.fused
    assert (entry.heads, entry.kv_heads) == (4, 2) and result.report.counts["repeat_kv"] == 1
    assert not [n for n in result.model.graph.node if n.op_type in ("Expand", "Reshape")]
    rng = np.random.default_rng(0)
    feeds = {"q": rng.standard_normal((2, 4, 5, D), np.float32)}
    feeds.update({n: rng.standard_normal((2, 2, 5, D), np.float32) for n in "kv"})
    np.testing.assert_allclose(run_reference(result.model, feeds)[0], run_reference(model, feeds)[0],
                               rtol=1e-5, atol=1e-5)


def test_repeat_in_other_order_kept():
    """x[:, None].expand(B, n, Hkv, ...) interleaves heads h -> h % Hkv: not the op's grouping."""
    result = rewrite(gqa_model(unsqueeze_axis=1))
    (entry,) = result.report.fused
    assert entry.kv_heads == 4  # fused with the repeated K/V as they are
    assert "axis other than 2" in result.report.declined[entry.fused_node]["repeat_kv"]


# ---------------------------------------------------------------- ONNX Attention, MultiHeadAttention


def attention_node_model(opset, *, qk_output=False, causal=0) -> onnx.ModelProto:
    info = lambda n, h: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", h, "S", D])  # noqa: E731
    outputs = ["y", "", "", "qk"] if qk_output else ["y"]
    node = helper.make_node("Attention", ["q", "k", "v", "m"], outputs, is_causal=causal, name="attn")
    qk = helper.make_tensor_value_info("qk", TensorProto.FLOAT, ["B", 4, "S", "S"])
    graph_outputs = [info("y", 4)] + ([qk] if qk_output else [])
    mask = helper.make_tensor_value_info("m", TensorProto.BOOL, ["B", 1, "S", "S"])
    graph = helper.make_graph([node], "attn", [info("q", 4), info("k", 2), info("v", 2), mask],
                              graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("opset", [23, 24, 25])
@pytest.mark.parametrize("causal", [0, 1])
def test_onnx_attention_mapped_one_to_one(opset, causal):
    model = attention_node_model(opset, causal=causal)
    result = rewrite(model)
    (entry,) = result.report.fused
    assert (entry.rule, entry.causal, entry.heads, entry.kv_heads) == ("onnx_attention", bool(causal), 4, 2)
    (node,) = result.model.graph.node
    assert (node.domain, node.op_type) == ("ort_flash", "FlashAttention")
    rng = np.random.default_rng(1)
    feeds = {"q": rng.standard_normal((2, 4, 5, D), np.float32),
             "k": rng.standard_normal((2, 2, 5, D), np.float32),
             "v": rng.standard_normal((2, 2, 5, D), np.float32),
             "m": rng.random((2, 1, 5, 5)) < 0.8}
    feeds["m"][..., 0] = True
    np.testing.assert_allclose(run_reference(result.model, feeds)[0], run_reference(model, feeds)[0],
                               rtol=1e-5, atol=1e-5)


def test_onnx_attention_with_qk_output_left_alone():
    result = rewrite(attention_node_model(24, qk_output=True))
    assert result.report.total_fused == 0
    (unfused,) = result.report.unfused
    assert "qk_matmul_output is used" in unfused.reason


def mha_model(*, bias=False, causal=0) -> onnx.ModelProto:
    hidden = 4 * D
    info = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", s, hidden])  # noqa: E731
    inputs = ["q", "k", "v", "b" if bias else "", "pad"]
    node = helper.make_node("MultiHeadAttention", inputs, ["y"], domain="com.microsoft", num_heads=4,
                            unidirectional=causal, name="mha")
    graph_inputs = [info("q", "S"), info("k", "S"), info("v", "S"),
                    helper.make_tensor_value_info("pad", TensorProto.INT32, ["B", "S"])]
    inits = [numpy_helper.from_array(np.zeros(3 * hidden, np.float32), "b")] if bias else []
    graph = helper.make_graph([node], "mha", graph_inputs, [info("y", "S")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("causal", [0, 1])
def test_multihead_attention_mapped(causal):
    from ort_flash.verify import verify

    model = mha_model(causal=causal)
    result = rewrite(model)
    (entry,) = result.report.fused
    assert (entry.rule, entry.causal, entry.layout, entry.mask) == (
        "ms_multihead_attention", bool(causal), "BSD", "additive (B,1,1,Skv)")
    check = verify(model, result.model, seq_len=7, seed=0)  # ORT's own kernel vs the op (CPU)
    assert check.passed, check.format_table()


def test_multihead_attention_with_bias_left_alone():
    result = rewrite(mha_model(bias=True))
    assert result.report.total_fused == 0
    assert "bias is not mapped" in result.report.unfused[0].reason


@pytest.mark.parametrize("build", [mask_inverted_where, mask_inverted_masked_fill])
def test_inverted_float_padding_is_exact_for_any_mask_values(build):
    """1 - m.float() hides every key whose mask value is not 1 (2, -1 too): the compact mask
    compares m with 1, so the rewrite is the same function for any values; ORT agrees."""
    from ort_flash.verify import verify

    model = masked_model(build)
    result = rewrite(model)
    assert result.report.fused[0].mask == "additive (B,1,1,Skv)"
    feeds = _feeds(model)
    feeds["attention_mask"] = np.array([[1, 2, 1, 0, 1, -1], [1, 1, 0, 1, 3, 1]], np.int64)
    (want,) = run_reference(model, feeds)
    (got,) = run_reference(result.model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    check = verify(model, result.model, seq_len=7, seed=0)
    assert check.passed, check.format_table()


def test_scatternd_causal_padding_becomes_causal_and_a_key_mask():
    """transformers 4.4x's causal + padding mask written through ScatterND (finite min: the
    fully masked rows differ, so only with exact_masked_rows=False); ORT agrees."""
    from ort_flash.verify import verify

    model = masked_model(mask_scatternd_padding)
    exact = rewrite(model)
    assert not exact.report.fused[0].causal
    assert "exact_masked_rows" in exact.report.declined[exact.report.fused[0].fused_node]["causal_mask"]
    result = rewrite(model, exact_masked_rows=False)
    (entry,) = result.report.fused
    assert (entry.causal, entry.mask) == (True, "additive (B,1,1,Skv)"), result.report.format_table()
    assert "ScatterND" not in [n.op_type for n in result.model.graph.node]
    check = verify(model, result.model, seq_len=7, seed=0)  # right padding: no fully masked row
    assert check.passed, check.format_table()


@pytest.mark.parametrize("build", [mask_triu_greater, mask_scatternd_ones])
def test_triu_greater_scatternd_forms_verify_in_ort(build):
    from ort_flash.verify import verify

    model = masked_model(build)
    result = rewrite(model)
    assert result.report.fused[0].causal
    check = verify(model, result.model, seq_len=7, seed=0)
    assert check.passed, check.format_table()


def mask_causal_plus_padding(g):  # CLIP: Where(causal, 0, min) + Where(padding, 0, min): -inf
    causal = g.op("Where", _causal(g), g.const(0.0, np.float32), g.const(FMIN, np.float32))
    return g.op("Add", causal, g.op("Where", _padding(g), g.const(0.0, np.float32),
                                    g.const(FMIN, np.float32)))


def test_hidden_values_summed_to_minus_inf_are_merged_only_when_asked():
    """min + min = -inf where both hide a key: one hidden value (min) is the same function in
    every row that keeps a visible key; only exact_masked_rows=False merges them."""
    from ort_flash.verify import verify

    model = masked_model(mask_causal_plus_padding)
    exact = rewrite(model)
    node = exact.report.fused[0].fused_node
    assert "several values" in exact.report.declined[node]["causal_mask"]
    result = rewrite(model, exact_masked_rows=False)
    (entry,) = result.report.fused
    assert (entry.causal, entry.mask) == (True, "additive (B,1,1,Skv)")
    assert "several mask values" in entry.note
    check = verify(model, result.model, seq_len=7, seed=0)  # right padding: every row keeps a key
    assert check.passed, check.format_table()


def test_sliding_window_runs_as_the_ops_left_window_in_ort():
    from ort_flash.verify import verify

    model = masked_model(mask_window)
    result = rewrite(model)
    (node,) = [n for n in result.model.graph.node if n.op_type == "FlashAttention"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["is_causal"], attrs["left_window_size"]) == (1, 2)
    check = verify(model, result.model, seq_len=7, seed=0)
    assert check.passed, check.format_table()
