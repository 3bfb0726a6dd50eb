"""The random inputs ``verify`` (and the demo, the benchmarks) feed a model: what a real caller
would feed. Token ids inside the vocabulary (read from the embedding Gather the input feeds),
0/1 attention masks padded at the end of some rows (never a whole row), floats from N(0, 1).

Sizes: axis 0 of every input is the batch, a named dim whose name contains "past" (a KV cache's
length) is ``past_len``, every other dim is ``seq_len``; the same name gets the same size
everywhere, and a dim named by an expression of other names ("past_sequence + sequence", the
attention mask of a cached decoding step) gets its value. An image input (rank 4, feeding a
Conv) gets the Conv's input channels and square pixels where its dims are dynamic: for a patch
embedding (a Conv whose kernel is its stride, as ViT's and CLIP's) the size its position table
holds ((rows - 1) = (size / patch)², one row the class token's), else IMAGE_SIZE. ``shapes`` (``--shape NAME=d0,d1,...``) sets one input's shape outright, and the
names of its dims take those sizes everywhere else.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx

DEFAULT_SEQ_LEN = 37  # odd on purpose: exercises the kernels' partial tiles
DEFAULT_PAST_LEN = 12  # a KV cache's length; past + seq stays within small position tables
IMAGE_SIZE = 32  # height and width of an image input whose spatial dims are dynamic
SMALL_INT_RANGE = 4  # ids for integer inputs that feed no embedding Gather


class InputShapeError(ValueError):
    """A shape asked for (``--shape``) names no input of the model or does not fit its type."""


def parse_shape(text: str) -> tuple[str, list[int]]:
    """``"pixel_values=2,3,224,224"`` -> ("pixel_values", [2, 3, 224, 224]) (argparse type)."""
    import argparse

    name, sep, dims = text.rpartition("=")
    try:
        shape = [int(d) for d in dims.split(",")] if dims.strip() else []
    except ValueError:
        shape = None
    if not sep or not name or shape is None or any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(
            f"expected NAME=d0,d1,... with sizes >= 0 (e.g. pixel_values=2,3,224,224), not {text!r}")
    return name, shape


def branch_conditions(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Boolean graph inputs of one element that decide an If (directly or through Identity,
    Not, Cast, Reshape, Squeeze or Unsqueeze), with their shapes: name -> [] or [1]."""
    passthrough = {"Identity", "Not", "Cast", "Reshape", "Squeeze", "Unsqueeze"}
    consumers = _consumers(model.graph, nested=True)
    found = {}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
        if tensor.elem_type != onnx.TensorProto.BOOL or dims not in ([], [1]):
            continue
        frontier, seen = [value.name], {value.name}
        while frontier and value.name not in found:
            name = frontier.pop()
            for node in consumers.get(name, []):
                if node.op_type == "If" and node.input[0] == name:
                    found[value.name] = dims
                elif node.op_type in passthrough and node.input[0] == name:
                    frontier += [o for o in node.output if o not in seen]
                    seen.update(node.output)
    return found


def _consumers(graph: onnx.GraphProto, *, nested: bool = False) -> dict[str, list[onnx.NodeProto]]:
    """Value name -> the nodes reading it (``nested``: in subgraphs too, which read the outer
    scope by name; an If nested in a branch decides on a graph input so)."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
        for attr in node.attribute if nested else ():
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                for name, nodes in _consumers(sub, nested=True).items():
                    consumers.setdefault(name, []).extend(nodes)
    return consumers


def make_inputs(model: onnx.ModelProto, *, batch: int, seq_len: int, seed: int,
                past_len: int = DEFAULT_PAST_LEN,
                shapes: dict[str, Sequence[int]] | None = None) -> dict:
    """Random feeds for every graph input that is not an initializer (sizes: module docstring)."""
    rng = np.random.default_rng(seed)
    initializers = {i.name for i in model.graph.initializer}
    vocab = _embedding_vocab_sizes(model)
    inputs = [v for v in model.graph.input if v.name in set(v.name for v in model.graph.input)
              - initializers]
    fixed = _fixed_shapes(model, inputs, shapes or {}, batch)
    sizes: dict[str, int] = {}
    for value in inputs:  # the fixed shapes name their dims first
        for dim, size in zip(value.type.tensor_type.shape.dim, fixed.get(value.name, ())):
            if dim.dim_param:
                sizes.setdefault(dim.dim_param, size)
    for value in inputs:  # plain names first, so that expressions of them can be evaluated
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param and dim.dim_param.isidentifier():
                sizes.setdefault(dim.dim_param, batch if axis == 0 else
                                 past_len if "past" in dim.dim_param else seq_len)
    feeds = {}
    for value in inputs:
        tensor_type = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if value.name in fixed:
            feeds[value.name] = _random_input(value.name, dtype, list(fixed[value.name]),
                                              vocab.get(value.name), rng)
            continue
        shape = []
        for axis, dim in enumerate(tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                shape.append(dim.dim_value)
                continue
            size = batch if axis == 0 else seq_len
            if dim.dim_param:
                size = sizes.setdefault(dim.dim_param, _dim_expression(dim.dim_param, sizes, size))
            shape.append(size)
        feeds[value.name] = _random_input(value.name, dtype, shape, vocab.get(value.name), rng)
    return feeds


def _fixed_shapes(model: onnx.ModelProto, inputs: list, shapes: dict[str, Sequence[int]],
                  batch: int) -> dict[str, list[int]]:
    """The shapes asked for, checked against the inputs' types, plus the default of each image
    input (rank 4, feeding a Conv) that was not asked for."""
    by_name = {v.name: v for v in inputs}
    fixed = {}
    for name, shape in shapes.items():
        if name not in by_name:
            raise InputShapeError(f"--shape {name}: the model has no input {name!r} (inputs: "
                                  f"{', '.join(by_name) or 'none'})")
        dims = by_name[name].type.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise InputShapeError(f"--shape {name}: {len(shape)} dims given, the input has rank "
                                  f"{len(dims)}")
        for axis, (dim, size) in enumerate(zip(dims, shape)):
            if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != size:
                raise InputShapeError(f"--shape {name}: dim {axis} is {dim.dim_value} in the "
                                      f"model, not {size}")
        fixed[name] = list(shape)
    for name, (channels, size) in _image_inputs(model).items():
        if name in by_name and name not in fixed:
            static = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                      for d in by_name[name].type.tensor_type.shape.dim]
            default = [batch, channels, size, size]
            fixed[name] = [s or d for s, d in zip(static, default)]
    return fixed


def _image_inputs(model: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """Float inputs of rank 4 that a Conv reads (through Cast/Identity) -> (its input channels,
    the image size: module docstring)."""
    weights = {i.name: list(i.dims) for i in model.graph.initializer}
    consumers = _consumers(model.graph)
    found = {}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        if len(tensor.shape.dim) != 4 or tensor.elem_type not in _FLOAT_TYPES:
            continue
        frontier = [value.name]
        while frontier and value.name not in found:
            for node in consumers.get(frontier.pop(), []):
                if node.op_type == "Conv" and len(weights.get(node.input[1], ())) == 4:
                    group = next((a.i for a in node.attribute if a.name == "group"), 1)
                    found[value.name] = (weights[node.input[1]][1] * group,
                                         _patch_image_size(node, weights))
                elif node.op_type in ("Cast", "Identity"):
                    frontier += list(node.output)
    return found


def _patch_image_size(conv: onnx.NodeProto, weights: dict[str, list[int]]) -> int:
    """The image size a patch-embedding Conv's position table was made for, else IMAGE_SIZE."""
    attrs = {a.name: list(a.ints) for a in conv.attribute}
    width, kernel = weights[conv.input[1]][0], weights[conv.input[1]][2:]
    patch = attrs.get("strides", [1, 1])
    if kernel != patch or len(set(patch)) != 1 or any(attrs.get("pads", [0])):
        return IMAGE_SIZE
    rows = [dims[-2] for dims in weights.values()
            if dims[-1:] == [width] and (len(dims) == 2 or dims[:-2] == [1])]
    for extra in (1, 0):  # a class token's row first
        sides = {round((n - extra) ** 0.5) for n in rows if n > extra
                 and round((n - extra) ** 0.5) ** 2 == n - extra}
        if len(sides) == 1:
            return sides.pop() * patch[0]
    return IMAGE_SIZE


_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                onnx.TensorProto.DOUBLE)


def _dim_expression(text: str, sizes: dict[str, int], default: int) -> int:
    """The value of a dim named like "past_sequence + sequence" (+, -, * of known names and
    integers), or ``default`` where the name is not such an expression."""
    import ast

    def value(node):
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Name) and node.id in sizes:
            return sizes[node.id]
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            a, b = value(node.left), value(node.right)
            return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(
                node.op, ast.Sub) else a * b
        raise ValueError(text)

    try:
        result = value(ast.parse(text, mode="eval"))
    except (SyntaxError, ValueError):
        return default
    return result if result > 0 else default


def _random_input(name, dtype, shape, vocab, rng) -> np.ndarray:
    if np.issubdtype(dtype, np.floating) or dtype.kind == "V":  # "V": ml_dtypes bfloat16
        return rng.standard_normal(shape).astype(dtype)
    if "mask" in name.lower() and len(shape) >= 1:
        return _padding_mask(shape, rng).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, vocab or SMALL_INT_RANGE, shape).astype(dtype)


def _padding_mask(shape: list[int], rng) -> np.ndarray:
    """1 = attend; odd rows lose a random tail of at most half their length, row 0 none."""
    mask = np.ones(shape, dtype=np.int64)
    if mask.size == 0:
        return mask
    rows = mask.reshape(-1, shape[-1])
    for r in range(1, rows.shape[0], 2):
        if shape[-1] > 1:
            rows[r, shape[-1] - int(rng.integers(1, shape[-1] // 2 + 1)):] = 0
    return mask


def _embedding_vocab_sizes(model: onnx.ModelProto) -> dict[str, int]:
    """Graph input -> rows of the embedding table that its values index (via Gather axis 0)."""
    tables = {i.name: i.dims[0] for i in model.graph.initializer if len(i.dims) >= 1}
    passthrough = {"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Cast", "Identity", "Expand"}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    sizes = {}
    for value in model.graph.input:
        frontier, seen = [value.name], set()
        while frontier:
            name = frontier.pop()
            for node in consumers.get(name, []):
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                if (node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name
                        and node.input[0] in tables and axis == 0):
                    sizes[value.name] = min(sizes.get(value.name, 1 << 62), tables[node.input[0]])
                elif node.op_type in passthrough and node.input[0] == name:
                    frontier += [o for o in node.output if o not in seen]
                    seen.update(node.output)
    return sizes
