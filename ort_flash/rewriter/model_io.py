"""Loading a model the user named, with one clear error for anything that is not an ONNX model."""

from __future__ import annotations

import os

import onnx
from google.protobuf.message import DecodeError


class ModelLoadError(ValueError):
    """The path does not hold a readable ONNX model (missing, not ONNX, truncated)."""


def load_model(model_or_path: onnx.ModelProto | str | os.PathLike | bytes) -> onnx.ModelProto:
    """Return a ModelProto that the caller may change: a copy, never the caller's object."""
    if isinstance(model_or_path, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model_or_path)
        return copy
    if isinstance(model_or_path, bytes):
        return _validate(_check(_parse(model_or_path, "<bytes>"), "<bytes>"), "<bytes>")
    path = os.fspath(model_or_path)
    if not os.path.exists(path):
        raise ModelLoadError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ModelLoadError(f"{path}: is a directory, not an ONNX model")
    try:
        model = onnx.load(path)
    except (DecodeError, RuntimeError, ValueError, OSError, onnx.checker.ValidationError) as e:
        # ValidationError: external data (a tensor stored beside the model) missing or unreadable
        raise ModelLoadError(f"{path}: not a readable ONNX model ({_short(e)})") from e
    return _validate(_check(model, path), path)


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    try:
        return onnx.load_from_string(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(f"{where}: not a readable ONNX model ({_short(e)})") from e


def _check(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    # Protobuf parses many non-ONNX byte strings "successfully" into a near-empty message.
    if model.ir_version <= 0 or not model.opset_import or not model.HasField("graph"):
        raise ModelLoadError(f"{where}: not an ONNX model (no ir_version, opset or graph)")
    return model


def _validate(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """onnx.checker on what the user gave (a rewrite must start from a valid graph: a node reading
    a tensor nothing produces would otherwise be "fixed" by the graph library without a word).
    Models past protobuf's 2 GB limit are checked from their path."""
    try:
        if model.ByteSize() < 2**31 - 1:
            onnx.checker.check_model(model)
        elif where not in ("<bytes>", "<model>"):
            onnx.checker.check_model(where)
    except onnx.checker.ValidationError as e:
        raise ModelLoadError(f"{where}: not a valid ONNX model: {_short(e)}") from e
    return model


def _short(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
