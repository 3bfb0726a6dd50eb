"""``merge_reshape``: the Reshapes after a 3-D FlashAttention that give back its Y's shape (the
split into heads layout_3d writes and the export's merge of them) go, with the shape arithmetic
that fed them; checked with onnx.checker, loaded and verified on the CPU EP against the original."""

from __future__ import annotations

import collections

import numpy as np
import onnx
from onnx import helper

from ort_flash.rewriter import rewrite
from test_rewrite_packed_qkv import _verified, encoder_model


def _ops(model):
    return collections.Counter(n.op_type for n in model.graph.node)


def test_split_and_merge_of_the_heads_go():
    result = _verified(encoder_model(out_proj="add"))
    (fused,) = result.report.fused
    assert fused.refined_by[-1] == "merge_reshape", fused
    assert _ops(result.model)["Reshape"] == 0, _ops(result.model)
    (flash,) = [n for n in result.model.graph.node if n.op_type == "FlashAttention"]
    (matmul,) = [n for n in result.model.graph.node if n.op_type == "MatMul" and flash.output[0] in n.input]
    assert matmul.input[0] == flash.output[0]


def test_the_merge_read_from_shape_nodes_goes_with_them():
    # The TorchScript export's merge: Reshape(x, Concat(Shape(x)[0], Shape(x)[1], hidden)).
    model = encoder_model(out_proj="add")
    (merge,) = [n for n in model.graph.node if n.op_type == "Reshape" and n.output[0].startswith("reshape")
                and any(i.startswith("transpose") for i in n.input)][-1:]
    extra = [helper.make_node("Shape", ["x"], ["x_shape"]),
             helper.make_node("Gather", ["x_shape", "zero"], ["b"], axis=0),
             helper.make_node("Gather", ["x_shape", "one"], ["s"], axis=0),
             helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
             helper.make_node("Unsqueeze", ["s", "axes"], ["s1"]),
             helper.make_node("Concat", ["b1", "s1", "hidden"], ["merge_shape"], axis=0)]
    model.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                                    (("zero", 0), ("one", 1), ("axes", [0]), ("hidden", [32]))])
    index = list(model.graph.node).index(merge)
    for k, node in enumerate(extra):
        model.graph.node.insert(index + k, node)
    merge.input[1] = "merge_shape"
    result = _verified(model)
    ops = _ops(result.model)
    assert ops["Reshape"] == 0 and ops["Shape"] == 0 and ops["Concat"] == 0, ops


def test_a_reshape_to_another_shape_stays():
    # The merge flattens to (B * S, hidden): not Y's shape, so the Reshapes stay.
    model = encoder_model(out_proj="add")
    for node in model.graph.node:
        if node.op_type == "Reshape" and any(i.startswith("transpose") for i in node.input):
            merge = node
    shape = [i for i in model.graph.initializer if i.name == merge.input[1]][0]
    shape.CopyFrom(onnx.numpy_helper.from_array(np.array([-1, 32], np.int64), shape.name))
    # The projection then reads (B * S, hidden) and the residual Add broadcasts back.
    result = rewrite(model)
    assert result.report.total_fused == 1
    assert _ops(result.model)["Reshape"] >= 1
    (fused,) = result.report.fused
    assert "merge_reshape" not in fused.refined_by
