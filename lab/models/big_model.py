"""A decoder-shaped ONNX model of any size, built in seconds with onnx helpers (no export).

    python lab/models/big_model.py OUT_FOLDER --gb 2.2 [--float16]

writes ``OUT_FOLDER/model.onnx`` + ``model.onnx.data`` (all weights as one external data file,
as ONNX Runtime GenAI and Optimum write them). Each layer is pre-norm attention plus an MLP:

    n = LayerNorm(x); q/k/v = MatMul(n, Wq/Wk/Wv) -> Reshape(0,0,H,D) -> Transpose
    Softmax(MatMul(q, k^T) * 1/sqrt(D)) @ v -> Transpose -> Reshape -> MatMul(Wo); x += that
    x += MatMul(Relu(MatMul(LayerNorm(x), W1)), W2)

the eager-attention form ``ort_flash.rewriter`` fuses (with packed QKV). The weights are
written one tensor at a time (the builder's memory is one tensor), filled from a fixed random
block so that every tensor differs and the file is cheap to write. The size model
``layers_for(gb)`` picks the layer count for a target size of weights. Used by
tests/test_big_models.py (a model past 2 GB) and lab/experiments/bench_big_models.py.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper

ALIGN = 64 << 10


def layer_params(hidden: int, ffn: int) -> int:
    return 4 * hidden * hidden + 2 * hidden * ffn + 4 * hidden


def layers_for(gb: float, hidden: int = 2048, ffn: int = 5632, itemsize: int = 4) -> int:
    return max(1, round(gb * 1e9 / (layer_params(hidden, ffn) * itemsize)))


def build(folder: str, layers: int, *, hidden: int = 2048, heads: int = 16, ffn: int = 5632,
          vocab: int = 1024, float16: bool = False, name: str = "model.onnx",
          genai_ops: bool = False) -> str:
    """Write the model into ``folder`` (created); returns the model's path. ``genai_ops``: norms
    are ``SimplifiedLayerNormalization`` in the ONNX domain and the MLP's activation is
    ``com.microsoft.Gelu``, as ONNX Runtime GenAI's builder writes them (ONNX Runtime runs both;
    onnx.checker knows neither)."""
    os.makedirs(folder, exist_ok=True)
    dtype = np.float16 if float16 else np.float32
    elem = TensorProto.FLOAT16 if float16 else TensorProto.FLOAT
    path = os.path.join(folder, name)
    location = name + ".data"
    block = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32) * 0.02
    initializers, nodes = [], []

    with open(os.path.join(folder, location), "wb") as data:
        def weight(tensor_name: str, shape: tuple, fill: float | None = None) -> str:
            size = int(np.prod(shape))
            if fill is not None:
                array = np.full(shape, fill, dtype)
            else:  # a rotation of the random block per tensor: distinct tensors, cheap to make
                start = (len(initializers) * 7919) % block.size
                array = np.resize(np.roll(block, -start), size).reshape(shape).astype(dtype)
            tensor = TensorProto(name=tensor_name, data_type=elem, dims=shape)
            offset = -(-data.tell() // ALIGN) * ALIGN
            data.seek(offset)
            data.write(array.tobytes())
            onnx.external_data_helper.set_external_data(
                _with_raw(tensor), location, offset, array.nbytes)
            tensor.ClearField("raw_data")
            initializers.append(tensor)
            return tensor_name

        def const(tensor_name: str, values, np_dtype) -> str:
            initializers.append(onnx.numpy_helper.from_array(np.array(values, np_dtype), tensor_name))
            return tensor_name

        def norm(inputs, outputs):
            op = "SimplifiedLayerNormalization" if genai_ops else "LayerNormalization"
            return helper.make_node(op, inputs, outputs, axis=-1, epsilon=1e-5)

        d = hidden // heads
        const("split_heads", [0, 0, heads, d], np.int64)
        const("merge_heads", [0, 0, hidden], np.int64)
        const("scale", 1.0 / np.sqrt(d), dtype)
        x = "x0"
        nodes.append(helper.make_node("Gather", [weight("embed", (vocab, hidden)), "input_ids"], [x]))
        for i in range(layers):
            p = f"l{i}_"
            nodes.append(norm([x, weight(p + "ln1", (hidden,), 1.0)], [p + "n1"]))
            for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
                nodes += [
                    helper.make_node("MatMul", [p + "n1", weight(p + "w" + t, (hidden, hidden))], [p + t]),
                    helper.make_node("Reshape", [p + t, "split_heads"], [p + t + "4"]),
                    helper.make_node("Transpose", [p + t + "4"], [p + t + "t"], perm=perm),
                ]
            nodes += [
                helper.make_node("MatMul", [p + "qt", p + "kt"], [p + "s"]),
                helper.make_node("Mul", [p + "s", "scale"], [p + "ss"]),
                helper.make_node("Softmax", [p + "ss"], [p + "p"], axis=-1),
                helper.make_node("MatMul", [p + "p", p + "vt"], [p + "o"]),
                helper.make_node("Transpose", [p + "o"], [p + "ot"], perm=[0, 2, 1, 3]),
                helper.make_node("Reshape", [p + "ot", "merge_heads"], [p + "om"]),
                helper.make_node("MatMul", [p + "om", weight(p + "wo", (hidden, hidden))], [p + "a"]),
                helper.make_node("Add", [x, p + "a"], [p + "x1"]),
                norm([p + "x1", weight(p + "ln2", (hidden,), 1.0)], [p + "n2"]),
                helper.make_node("MatMul", [p + "n2", weight(p + "w1", (hidden, ffn))], [p + "h"]),
                (helper.make_node("Gelu", [p + "h"], [p + "r"], domain="com.microsoft") if genai_ops
                 else helper.make_node("Relu", [p + "h"], [p + "r"])),
                helper.make_node("MatMul", [p + "r", weight(p + "w2", (ffn, hidden))], [p + "m"]),
                helper.make_node("Add", [p + "x1", p + "m"], [p + "x2"]),
            ]
            x = p + "x2"
        nodes.append(helper.make_node("Identity", [x], ["hidden_states"]))

    graph = helper.make_graph(
        nodes, "big_decoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("hidden_states", elem, ["batch", "sequence", hidden])],
        initializers)
    opsets = [helper.make_opsetid("", 21)] + ([helper.make_opsetid("com.microsoft", 1)] if genai_ops else [])
    model = helper.make_model(graph, opset_imports=opsets,
                              producer_name="ort_flash.models.big_model")
    model.ir_version = 10
    onnx.save_model(model, path)
    return path


def _with_raw(tensor: onnx.TensorProto) -> onnx.TensorProto:
    tensor.raw_data = b""  # set_external_data asks for the field
    return tensor


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("--gb", type=float, required=True, help="size of the weights in GB (1e9 bytes)")
    p.add_argument("--float16", action="store_true")
    args = p.parse_args(argv)
    layers = layers_for(args.gb, itemsize=2 if args.float16 else 4)
    print(build(args.folder, layers, float16=args.float16), f"({layers} layers)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
