"""A runner of one-node GroupQueryAttention models (``ort_flash.bench.gqa_graphs.gqa_model``, ONNX
Runtime's op or ort_flash's) over ONNX Runtime's CPU execution provider (graph optimizations off).

``shared=True`` runs the node the way ONNX Runtime GenAI does: past_key/present_key (and the
values) bound through IOBinding to one OrtValue, so the op sees one buffer; the runner returns
that buffer's content after the run. Otherwise the presents are fresh outputs.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from _onnx_models import _ort_value
from ort_flash.bench.gqa_graphs import OUTPUT_NAMES, gqa_model

__all__ = ["gqa_model", "output_shapes", "run_gqa"]


def output_shapes(feeds: Mapping[str, np.ndarray], attrs: Mapping) -> tuple[tuple, tuple]:
    """The shapes of output (B, S, Hq*D) and of a present of its own (B, Hkv, max(total, past), D)
    for a call's feeds; with a windowed cache (sliding_window_cache=1) present is the past's shape."""
    b, s, hidden = feeds["query"].shape
    hq, hkv = attrs["num_heads"], attrs["kv_num_heads"]
    d = hidden // hq if "key" in feeds else hidden // (hq + 2 * hkv)
    past = feeds["past_key"].shape[2] if "past_key" in feeds else 0
    total = int(np.asarray(feeds["total_sequence_length"]).reshape(-1)[0])
    return (b, s, hq * d), (b, hkv, past if attrs.get("sliding_window_cache") else max(total, past), d)


def run_gqa(inputs: Mapping[str, np.ndarray], *, shared: bool = False, library: str | None = None,
            threads: int = 1, **attrs):
    """(output, present_key, present_value) of ONNX Runtime's CPU GroupQueryAttention, or with
    ``library`` (libort_flash.so) of ort_flash's, in the same one-node model. Every output is
    bound to a NaN-filled buffer (a separate present too), so that an element the op leaves
    unwritten shows; with ``shared`` the presents are the past buffers themselves."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = threads
    domain = "com.microsoft"
    if library is not None:
        opts.register_custom_ops_library(library)
        domain = "ort_flash"
    sess = ort.InferenceSession(gqa_model(inputs, domain, **attrs), opts, providers=["CPUExecutionProvider"])
    # Buffers of our own, kept alive here: an OrtValue over a numpy array does not keep it.
    feeds = {n: np.ascontiguousarray(a).copy() for n, a in inputs.items()}
    out_shape, present_shape = output_shapes(feeds, attrs)
    dtype = feeds["query"].dtype
    outputs = {"output": np.full(out_shape, np.nan, dtype)}
    if shared:
        outputs.update(present_key=feeds["past_key"], present_value=feeds["past_value"])
    elif library is not None:
        # (ONNX Runtime's op infers a separate present as long as the past and refuses a bound
        # one of the length it then writes, so its presents are allocated by the run.)
        for name in ("present_key", "present_value"):
            outputs[name] = np.full(present_shape, np.nan, dtype)
    binding = sess.io_binding()
    for name, array in feeds.items():
        binding.bind_ortvalue_input(name, _ort_value(array))
    for name in OUTPUT_NAMES:
        if name in outputs:
            binding.bind_ortvalue_output(name, _ort_value(outputs[name]))
        else:
            binding.bind_output(name)
    sess.run_with_iobinding(binding)
    results = dict(zip(OUTPUT_NAMES, binding.get_outputs()))
    return tuple(outputs[n].copy() if n in outputs else results[n].numpy() for n in OUTPUT_NAMES)
