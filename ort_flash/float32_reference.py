"""The float32 reference of a float16 / bfloat16 model: the same graph, computing in float32.

``verify`` of a model with FP8 attention measures both the FP8 run and the model's-dtype run
against it (on the CPU EP), so that the error FP8 adds is seen beside the dtype's own rounding.

    model = float32_model("model.fp16.onnx")   # None: the model holds no float16 / bfloat16
    save(model, "ref/model.onnx")              # + ref/model.onnx.data
    outputs = session.run(None, float32_feeds(feeds))

Every float16 / bfloat16 tensor the model names becomes float32, in every graph (If branches,
Loop / Scan bodies) and function: initializers and tensor attributes (Constant, ConstantOfShape),
the types of graph inputs, outputs and intermediate values, and the targets of Cast (``to``)
and of ops that make a tensor of a given ``dtype`` (EyeLike, RandomNormal, ...). Each op then
runs its float32 kernel on the same values, widened exactly. Weights are converted one at a time
as ``save`` writes them, so memory holds one tensor, not the model.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnx_ir as ir

LOW = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
_DTYPE_ATTRIBUTES = ("to", "dtype")  # Cast's target; EyeLike's, RandomNormal's, ... dtype


def float32_model(model_or_path: onnx.ModelProto | str | os.PathLike,
                  base_dir: str | os.PathLike = "") -> ir.Model | None:
    """The model (a path, or a ModelProto whose external data lies in ``base_dir``) with every
    float16 / bfloat16 tensor, type and cast target made float32; None where it has none."""
    if isinstance(model_or_path, onnx.ModelProto):
        model = ir.from_proto(model_or_path)
        ir.external_data.set_base_dir(model.graph, os.path.abspath(os.fspath(base_dir) or "."))
    else:
        model = ir.load(os.fspath(model_or_path))
    return model if to_float32(model) else None


def to_float32(model: ir.Model) -> int:
    """Make ``model`` compute in float32 in place (the module docstring); returns how many
    values, tensors and attributes changed (0: it computed in float32 already)."""
    graphs = [model.graph, *model.graph.subgraphs(), *model.functions.values()]
    graphs += [g for f in model.functions.values() for g in f.graph.subgraphs()]
    changed = 0
    for graph in graphs:
        values = [*graph.inputs, *graph.outputs, *(o for n in graph for o in n.outputs)]
        for value in values:
            if value.dtype in LOW:
                value.dtype = ir.DataType.FLOAT
                changed += 1
        for value in getattr(graph, "initializers", {}).values():
            if value.const_value is not None and value.const_value.dtype in LOW:
                value.const_value = _widened(value.const_value)
                value.dtype = ir.DataType.FLOAT
                changed += 1
        for node in graph:
            changed += _widen_attributes(node)
    return changed


def save(model: ir.Model, path: str | os.PathLike) -> None:
    """Write ``model`` to ``path``, its weights to ``path + ".data"`` beside it."""
    path = os.fspath(path)
    ir.save(model, path, external_data=os.path.basename(path) + ".data")


def float32_feeds(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feeds`` with float16 / bfloat16 arrays widened to float32 (the reference's inputs)."""
    low = {np.dtype(np.float16), np.dtype(ir.DataType.BFLOAT16.numpy())}
    return {k: v.astype(np.float32) if v.dtype in low else v for k, v in feeds.items()}


def _widened(tensor) -> ir.LazyTensor:
    """``tensor`` as float32, read and converted only when written or read."""
    return ir.LazyTensor(lambda: ir.tensor(tensor.numpy().astype(np.float32)), ir.DataType.FLOAT,
                         tensor.shape, name=tensor.name)


def _widen_attributes(node: ir.Node) -> int:
    changed = 0
    for name, attr in list(node.attributes.items()):
        if attr.type == ir.AttributeType.TENSOR and attr.value.dtype in LOW:
            node.attributes[name] = ir.AttrTensor(name, _widened(attr.value))
        elif attr.type == ir.AttributeType.TENSORS and any(t.dtype in LOW for t in attr.value):
            node.attributes[name] = ir.AttrTensors(
                name, [_widened(t) if t.dtype in LOW else t for t in attr.value])
        elif (name in _DTYPE_ATTRIBUTES and node.domain in ("", "ai.onnx")
              and attr.type == ir.AttributeType.INT and attr.value in LOW):
            node.attributes[name] = ir.AttrInt64(name, ir.DataType.FLOAT)
        else:
            continue
        changed += 1
    return changed
