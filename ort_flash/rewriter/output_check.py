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

A model whose weights are external data is checked as its graph: onnx's strict type and shape
inference on the graph (onnx.checker would want the data files beside a file it reads), then the
ONNX Runtime session from the serialized graph with the weights read from their folder
(``model_io.runtime_refusal``): no copy of the model is written anywhere.
"""

from __future__ import annotations

import logging
import os
import tempfile

import onnx

from ort_flash.rewriter import external_data
from ort_flash.rewriter.model_io import first_line as _first_line
from ort_flash.rewriter.model_io import runtime_refusal

# Above this size the model is checked from a file (external data), as protobuf cannot hold
# more than 2 GB and serializing a large model twice costs memory.
PATH_FORM_BYTES = 256 << 20
_log = logging.getLogger(__name__)


class RewriteRefusedError(ValueError):
    """The rewritten model does not pass onnx.checker or does not load in ONNX Runtime; the
    message says why in one line, and no output is written."""


def check_output(model: onnx.ModelProto, original: onnx.ModelProto | None = None,
                 base_dir: str = "") -> None:
    """Raise RewriteRefusedError unless ``model`` (rewritten from ``original``; its external data,
    if any, in ``base_dir``) passes the checks in the module docstring."""
    if external_data.has_external_data(model):
        _check_graph(model, original, os.path.abspath(base_dir or "."))
        return
    if external_data.byte_size(model) <= PATH_FORM_BYTES:
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


def _check_graph(model: onnx.ModelProto, original: onnx.ModelProto | None, folder: str) -> None:
    _judge(model, _strict_inference, original, model.SerializeToString(), folder)


def _check(checked: onnx.ModelProto | str, source: bytes | str,
           original: onnx.ModelProto | None) -> None:
    _judge(checked, _full_check, original, source)


def _strict_inference(model: onnx.ModelProto | str) -> None:
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)


def _full_check(model: onnx.ModelProto | str) -> None:
    onnx.checker.check_model(model, full_check=True)


def _judge(checked, check, original: onnx.ModelProto | None, source: bytes | str,
           folder: str | None = None) -> None:
    """``check`` on the output (refused only where the original passes the same check: see the
    module docstring), then ONNX Runtime's session on ``source`` (external data in ``folder``)."""
    try:
        check(checked)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        if original is None or _passes(check, original):
            raise RewriteRefusedError(f"the rewritten model fails onnx.checker: "
                                      f"{_first_line(e)}") from e
    if _library_missing():
        return
    refusal = runtime_refusal(source, folder)
    if refusal is not None:
        raise RewriteRefusedError(f"ONNX Runtime cannot load the rewritten model: {refusal}")


def _passes(check, model: onnx.ModelProto) -> bool:
    if check is _full_check and (external_data.has_external_data(model)
                                 or external_data.byte_size(model) >= 2**31 - 1):
        return False  # too large to check from memory: not judged
    try:
        check(model)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return False
    return True


def _library_missing() -> bool:
    from ort_flash._library import session_options

    try:
        session_options()
    except OSError as e:  # FileNotFoundError included: no library to load the fused op with
        _log.warning("the rewritten model was not loaded in ONNX Runtime: %s", e)
        return True
    return False
