"""Hand-built models whose attention sits in subgraphs: an Optimum-style merged decoder (an If on
``use_cache_branch`` whose two branches share value names), a Loop body, a Scan body and an If
nested in an If branch. Built with onnx.helper; every one loads in ONNX Runtime as it is.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

H, D = 2, 8
E = H * D
FMIN = float(np.finfo(np.float32).min)
PAST, SEQ, TOTAL = "past_sequence_length", "sequence_length", "past_sequence_length + sequence_length"


class Nodes:
    """Nodes named as torch's exporter names them: ``<prefix><op>`` with output
    ``<prefix><op>_output_0``; two branches built with the same prefix share every name."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.nodes = prefix, []

    def op(self, op_type, *inputs, name=None, **attrs):
        name = self.prefix + (name or op_type)
        self.nodes.append(helper.make_node(op_type, list(inputs), [name + "_output_0"], name=name,
                                           **attrs))
        return name + "_output_0"

    def const(self, name, value, dtype=np.int64):
        out = self.prefix + name
        if any(out in n.output for n in self.nodes):
            return out
        self.nodes.append(helper.make_node("Constant", [], [out], name=out + "_node",
                                           value=numpy_helper.from_array(np.array(value, dtype))))
        return out

    def rename(self, value, name):  # a subgraph output under its own name
        self.nodes.append(helper.make_node("Identity", [value], [name], name=name + "_identity"))
        return name


def attention(g: Nodes, q, k, v, *, mask=None, bias=None):
    """Eager attention over BNSH q, k, v: MatMul(q, kᵀ) / √D [+ bias] [+ mask] → Softmax → · v."""
    kt = g.op("Transpose", k, name="Transpose_k", perm=[0, 1, 3, 2])
    s = g.op("Div", g.op("MatMul", q, kt), g.const("sqrt_d", np.sqrt(D), np.float32))
    if bias is not None:
        s = g.op("Add", s, bias, name="Add_bias")
    if mask is not None:
        s = g.op("Add", s, mask, name="Add_mask")
    return g.op("MatMul", g.op("Softmax", s, axis=-1), v, name="MatMul_pv")


def _heads(g: Nodes, x, tag):  # (B, S, E) -> (B, H, S, D)
    x = g.op("Reshape", x, g.const("heads", [0, 0, H, D]), name=f"{tag}/Reshape")
    return g.op("Transpose", x, name=f"{tag}/Transpose", perm=[0, 2, 1, 3])


def _decoder_branch(with_past: bool, name: str) -> onnx.GraphProto:
    """One branch: projections, [Concat with the past], the padding mask, a per-head bias and
    self-attention, then cross-attention over the encoder states (the model's inputs, read from
    the outer scope) with their padding mask. The bias's shape is built differently in the two branches under one name
    (/decoder/attn/bias_shape: Concat in the cached branch, Max in the other), so ONNX's data
    propagation, which keeps one table by name, gave the second branch the first one's shape,
    which its Equal then cannot broadcast (as ONNX Runtime found in Optimum's merged decoders:
    "Node (/decoder/Equal) ... Incompatible dimensions")."""
    g = Nodes("/decoder/attn/")
    q, k, v = (_heads(g, g.op("MatMul", "hidden", w, name=f"{t}_proj/MatMul"), f"{t}_proj")
               for w, t in (("Wq", "q"), ("Wk", "k"), ("Wv", "v")))
    if with_past:
        k = g.op("Concat", "past_key", k, name="Concat_k", axis=2)
        v = g.op("Concat", "past_value", v, name="Concat_v", axis=2)
        one = g.const("one_dim", [1])
        shape = g.op("Concat", one, g.const("h_dim", [H]), one, one, name="bias_shape", axis=0)
    else:
        three = g.const("bias_dims", [H, 1, 1])
        shape = g.op("Max", three, three, name="bias_shape")
    bias = g.op("Reshape", "head_bias", shape, name="bias")
    # bias.expand(-1, ...) as torch exports it: Expand(bias, Where(Shape(bias) == -1, 1, Shape))
    rank = 4 if with_past else 3
    sizes = g.op("Shape", bias, name="Shape_bias")
    same = g.op("Equal", sizes, g.const("minus_ones", [-1] * rank))
    bias = g.op("Expand", bias, g.op("Where", same, g.const("ones", [1] * rank), sizes))
    y = attention(g, q, k, v, mask=_padding(g, "attention_mask"), bias=bias)
    y = g.op("Reshape", g.op("Transpose", y, name="Transpose_out", perm=[0, 2, 1, 3]),
             g.const("merge", [0, 0, E]), name="Reshape_out")
    # cross-attention over the outer scope's encoder states, as BART's decoder has
    c = Nodes("/decoder/encoder_attn/")
    cq = _heads(c, c.op("MatMul", "hidden", "Wq", name="q_proj/MatMul"), "q_proj")
    ck, cv = (_heads(c, c.op("MatMul", "encoder_hidden", w, name=f"{t}_proj/MatMul"), f"{t}_proj")
              for w, t in (("Wk", "k"), ("Wv", "v")))
    # BART materializes it as (B, 1, Sq, Skv): Expand to Concat(B, 1, Sq, Skv)
    dims = [c.op("Shape", x, name=f"Shape_{i}", start=a, end=a + 1)
            for i, (x, a) in enumerate((("hidden", 0), ("hidden", 1), ("encoder_hidden", 1)))]
    size = c.op("Concat", dims[0], c.const("one_dim", [1]), dims[1], dims[2], axis=0)
    mask = c.op("Expand", _padding(c, "encoder_attention_mask"), size)
    cross = attention(c, cq, ck, cv, mask=mask)
    cross = c.op("Reshape", c.op("Transpose", cross, name="Transpose_out", perm=[0, 2, 1, 3]),
                 c.const("merge", [0, 0, E]), name="Reshape_out")
    g.nodes += c.nodes
    y = g.op("Add", y, cross, name="Add_cross")
    outs = [g.rename(y, "/decoder/out"), g.rename(k, "/decoder/present_key"),
            g.rename(v, "/decoder/present_value")]
    kv = [None, H, TOTAL if with_past else SEQ, D]
    types = (["batch", SEQ, E], kv, kv)
    return helper.make_graph(g.nodes, name, [], [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, t) for n, t in zip(outs, types)])


def _padding(g: Nodes, mask: str):
    """Where(mask[b, key] != 0, 0, finfo.min) as (B, 1, 1, Skv), from a graph input."""
    m = g.op("Unsqueeze", g.op("Cast", mask, to=TensorProto.BOOL), g.const("axes", [1, 2]))
    return g.op("Where", m, g.const("zero", 0.0, np.float32), g.const("fmin", FMIN, np.float32),
                name="Where_mask")


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "model", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _weights(*names, shape=(E, E), seed=0):
    rng = np.random.default_rng(seed)
    return [numpy_helper.from_array((rng.standard_normal(shape) / 4).astype(np.float32), n)
            for n in names]


def merged_decoder() -> onnx.ModelProto:
    """decoder_model_merged.onnx in small: If(use_cache_branch) with the cached branch first."""
    f = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    inputs = [f("hidden", ["batch", SEQ, E]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", TOTAL]),
              f("past_key", ["batch", H, PAST, D]), f("past_value", ["batch", H, PAST, D]),
              f("encoder_hidden", ["batch", "encoder_sequence_length", E]),
              helper.make_tensor_value_info("encoder_attention_mask", TensorProto.INT64,
                                            ["batch", "encoder_sequence_length"]),
              helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1])]
    node = helper.make_node("If", ["use_cache_branch"], ["out", "present_key", "present_value"],
                            name="optimum::if", then_branch=_decoder_branch(True, "cached"),
                            else_branch=_decoder_branch(False, "uncached"))
    outputs = [f("out", ["batch", SEQ, E]), f("present_key", ["batch", H, None, D]),
               f("present_value", ["batch", H, None, D])]
    inits = _weights("Wq", "Wk", "Wv") + _weights("head_bias", shape=(H,), seed=1)
    return _model([node], inputs, outputs, inits)


def _bnsh(*names):
    return [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", H, SEQ, D]) for n in names]


def loop_model() -> onnx.ModelProto:
    """x <- attention(x, k, v) twice, in a Loop body; k and v come from the outer scope."""
    g = Nodes("/layer/")
    y = attention(g, "x_in", "k", "v")
    g.nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"], name="cond_identity"))
    g.rename(y, "x_out")
    body = helper.make_graph(
        g.nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []), *_bnsh("x_in")],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), *_bnsh("x_out")])
    trips = numpy_helper.from_array(np.array(2, np.int64), "trips")
    cond = numpy_helper.from_array(np.array(True), "cond")
    node = helper.make_node("Loop", ["trips", "cond", "q"], ["y"], name="loop", body=body)
    return _model([node], _bnsh("q", "k", "v"), _bnsh("y"), [trips, cond])


def scan_model() -> onnx.ModelProto:
    """Attention of each of T query blocks (axis 0 of q) against the outer k, v, in a Scan body."""
    g = Nodes("/scan/")
    y = attention(g, "q_t", "k", "v")
    g.nodes.append(helper.make_node("Identity", ["n_in"], ["n_out"], name="carry"))
    g.rename(y, "y_t")
    body = helper.make_graph(
        g.nodes, "scan_body",
        [helper.make_tensor_value_info("n_in", TensorProto.FLOAT, [1]), *_bnsh("q_t")],
        [helper.make_tensor_value_info("n_out", TensorProto.FLOAT, [1]), *_bnsh("y_t")])
    steps = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, "batch", H, SEQ, D])  # noqa: E731
    node = helper.make_node("Scan", ["n", "qs"], ["n_final", "ys"], name="scan", body=body,
                            num_scan_inputs=1)
    inputs = [helper.make_tensor_value_info("n", TensorProto.FLOAT, [1]), steps("qs"),
              *_bnsh("k", "v")]
    outputs = [helper.make_tensor_value_info("n_final", TensorProto.FLOAT, [1]), steps("ys")]
    return _model([node], inputs, outputs, [])


def nested_if_model() -> onnx.ModelProto:
    """If(outer) { If(inner) { attention } else { v } } else { q }, every name shared."""
    def leaf(with_attention, name):
        g = Nodes("/inner/")
        y = attention(g, "q", "k", "v") if with_attention else g.op("Identity", "v")
        return helper.make_graph(g.nodes + [helper.make_node("Identity", [y], ["leaf_y"])], name,
                                 [], _bnsh("leaf_y"))

    inner = helper.make_node("If", ["inner_cond"], ["mid_y"], name="inner_if",
                             then_branch=leaf(True, "inner_then"), else_branch=leaf(False, "inner_else"))
    then = helper.make_graph([inner], "outer_then", [], _bnsh("mid_y"))
    other = helper.make_graph([helper.make_node("Identity", ["q"], ["mid_y"])], "outer_else", [],
                              _bnsh("mid_y"))
    node = helper.make_node("If", ["outer_cond"], ["y"], name="outer_if", then_branch=then,
                            else_branch=other)
    conds = [helper.make_tensor_value_info(n, TensorProto.BOOL, []) for n in ("outer_cond", "inner_cond")]
    return _model([node], [*_bnsh("q", "k", "v"), *conds], _bnsh("y"), [])
