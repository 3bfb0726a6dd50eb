"""The last gate of a rewrite: the output must pass onnx.checker and load in ONNX Runtime.

A rewrite that breaks a model is the worst outcome the tool can have, so ``rewrite`` hands back
no model it has not seen load: ``onnx.checker.check_model(full_check=True)`` (types and shapes
in every graph, subgraphs included), then an ONNX Runtime CPU session with the ort_flash library
registered. Creating the session resolves every graph and runs ONNX Runtime's own type and shape
inference (where inferred ``value_info`` that contradicts the graph is found); nothing is run.
A model with no CPU kernel for some node (float16 or bfloat16 ops, a CUDA-only contrib op) has
passed those checks when ONNX Runtime says so, and is accepted. Where the input itself fails
the checker (ops ONNX Runtime's optimizer writes into the ONNX domain, which onnx does not
know), the checker cannot judge the output either, and ONNX Runtime alone does. Where the
ort_flash library itself cannot be loaded (a source tree not built), only the checker runs, with
a warning.
"""

from __future__ import annotations

import logging
import os
import tempfile

import onnx

# Above this size the model is checked from a file (external data), as protobuf cannot hold
# more than 2 GB and serializing a large model twice costs memory.
PATH_FORM_BYTES = 256 << 20
_log = logging.getLogger(__name__)


class RewriteRefusedError(ValueError):
    """The rewritten model does not pass onnx.checker or does not load in ONNX Runtime; the
    message says why in one line, and no output is written."""


def check_output(model: onnx.ModelProto, original: onnx.ModelProto | None = None) -> None:
    """Raise RewriteRefusedError unless ``model`` (rewritten from ``original``) passes the
    checks in the module docstring."""
    if model.ByteSize() <= PATH_FORM_BYTES:
        _check(model, model.SerializeToString(), original)
        return
    with tempfile.TemporaryDirectory(prefix="ort_flash_check_") as folder:
        path = os.path.join(folder, "model.onnx")
        copy = onnx.ModelProto()
        copy.CopyFrom(model)  # saving with external data moves the tensors out of the proto
        onnx.save_model(copy, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location="model.onnx.data")
        del copy
        _check(path, path, original)


def _check(checked: onnx.ModelProto | str, source: bytes | str,
           original: onnx.ModelProto | None) -> None:
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    import ort_flash

    try:
        onnx.checker.check_model(checked, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        if original is None or _passes_checker(original):
            raise RewriteRefusedError(f"the rewritten model fails onnx.checker: "
                                      f"{_first_line(e)}") from e
    try:
        options = ort_flash.session_options()
    except OSError as e:  # FileNotFoundError included: no library to load the fused op with
        _log.warning("the rewritten model was not loaded in ONNX Runtime: %s", e)
        return
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # the refusal below is the message; no ORT warnings
    try:
        ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except getattr(state, "NotImplemented", ()) as e:
        if "Could not find an implementation" not in str(e):
            raise RewriteRefusedError(f"ONNX Runtime cannot load the rewritten model: "
                                      f"{_first_line(e)}") from e
    except Exception as e:  # noqa: BLE001 - ORT's exceptions (Fail, InvalidGraph, ...) differ
        raise RewriteRefusedError(f"ONNX Runtime cannot load the rewritten model: "
                                  f"{_first_line(e)}") from e


def _passes_checker(model: onnx.ModelProto) -> bool:
    if model.ByteSize() >= 2**31 - 1:
        return False  # too large to check from memory: not judged
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return False
    return True


def _first_line(error: Exception, limit: int = 400) -> str:
    """The message on one line (ORT's name the node on the next), cut to ``limit`` characters."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    text = text or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
