"""Loading a model the user named, with one clear error for anything that is not an ONNX model.

A model is loaded as its graph: large external-data tensors stay in their files
(``external_data.load_graph``). Whether it is valid is judged once, here (``runtime_refusal``):
onnx.checker first, and where the checker refuses it, an ONNX Runtime CPU session (ort_flash
registered, nothing run) decides, as ONNX Runtime registers ops of its own in the ONNX domain
(GenAI's ``SimplifiedLayerNormalization``) that onnx does not know. A model ONNX Runtime
loads is never refused."""

from __future__ import annotations

import os

import onnx
from google.protobuf.message import DecodeError

from ort_flash.rewriter import external_data


class ModelLoadError(ValueError):
    """The path does not hold a readable ONNX model (missing, not ONNX, truncated)."""


def load_model(model_or_path: onnx.ModelProto | str | os.PathLike | bytes) -> onnx.ModelProto:
    """Return a ModelProto that the caller may change: a copy, never the caller's object. From
    a path, large external-data tensors stay references to their files (``external_data``)."""
    return load(model_or_path)[0]


def load(model_or_path: onnx.ModelProto | str | os.PathLike | bytes) -> tuple[onnx.ModelProto, bool]:
    """``load_model``, and whether the model keeps its weights as external data (a file whose
    tensors were all small enough to read in counts too)."""
    if isinstance(model_or_path, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model_or_path)
        return copy, external_data.has_external_data(copy)
    if isinstance(model_or_path, bytes):
        return _validate(_check(_parse(model_or_path, "<bytes>"), "<bytes>"), "<bytes>"), False
    path = os.fspath(model_or_path)
    if not os.path.exists(path):
        raise ModelLoadError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ModelLoadError(f"{path}: is a directory, not an ONNX model")
    try:
        model, external = external_data.load_graph(path)
    except external_data.ExternalDataError as e:
        raise ModelLoadError(f"{path}: {e}") from e
    except (DecodeError, RuntimeError, ValueError, OSError, onnx.checker.ValidationError) as e:
        # ValidationError: external data (a tensor stored beside the model) unreadable
        raise ModelLoadError(f"{path}: not a readable ONNX model ({_short(e)})") from e
    return _validate(_check(model, path), path), external


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
    """The module docstring's rule on what the user gave (a rewrite must start from a valid
    graph: a node reading a tensor nothing produces would otherwise be "fixed" by the graph
    library without a word). A path is checked from the file (external data included)."""
    path = where not in ("<bytes>", "<model>")
    try:
        onnx.checker.check_model(where if path else model)
    except onnx.checker.ValidationError as e:
        refusal = runtime_refusal(where if path else model.SerializeToString())
        if refusal is not None:
            raise ModelLoadError(f"{where}: not a valid ONNX model: {_short(e)}") from e
    return model


def runtime_refusal(source: str | bytes, folder: str | None = None) -> str | None:
    """Why an ONNX Runtime CPU session cannot be created from ``source`` (a path, or bytes whose
    external data lies in ``folder``), or None where it can. ort_flash's library is registered
    where it is built; graph optimizations are off and weights are not prepacked (nothing runs).
    A node with no CPU kernel (a float16 op, a CUDA-only contrib op) does not count: the graph
    resolved and typed before ONNX Runtime looked for kernels."""
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    from ort_flash._library import session_options

    try:
        options = session_options()
    except OSError:  # FileNotFoundError included: a source tree with no library built
        options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # the refusal is the message; no ORT warnings
    options.add_session_config_entry("session.disable_prepacking", "1")
    if folder is not None:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
    try:
        ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except getattr(state, "NotImplemented", ()) as e:
        if "Could not find an implementation" not in str(e):
            return first_line(e)
    except Exception as e:  # noqa: BLE001 - ORT's exceptions (Fail, InvalidGraph, ...) differ
        return first_line(e)
    return None


def first_line(error: Exception, limit: int = 400) -> str:
    """The message on one line (ORT's name the node on the next), cut to ``limit`` characters."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    text = text or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
