"""An ONNX Runtime session over a small model, bound by pointer to benchmark tensors.

One session, one IOBinding per rotating input set. On CUDA the session runs on the timer's
stream (``user_compute_stream``), does not synchronize after each run
(``disable_synchronize_execution_providers``), must place every node on the CUDA EP
(``session.disable_cpu_ep_fallback``: a peer without a CUDA kernel is reported as unsupported
instead of silently timed on the CPU) and, with ``cuda_graph``, captures one CUDA graph per
input set (``enable_cuda_graph`` and the ``gpu_graph_id`` run option) so the replays carry no
launch overhead.
"""
from __future__ import annotations

from typing import Sequence

from ort_flash.bench.tensors import Buffer


class Unsupported(Exception):
    """A peer cannot run this configuration; the message says why (it goes into the results)."""


def make_session(model: bytes, device: str, *, custom_ops: bool = False, optimize: bool = True,
                 stream=None, cuda_graph: bool = False, strict_placement: bool = True,
                 threads: int = 0):
    import onnxruntime as ort

    import ort_flash

    so = ort_flash.session_options() if custom_ops else ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads:
        so.intra_op_num_threads = threads
    if device == "cuda":
        if strict_placement:
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        opts = {"device_id": "0", "arena_extend_strategy": "kSameAsRequested"}
        if stream is not None:
            opts["user_compute_stream"] = str(stream_handle(stream))
        if cuda_graph:
            opts["enable_cuda_graph"] = "1"
        providers = [("CUDAExecutionProvider", opts)]  # no CPU EP: fallback is disabled above
    else:
        providers = ["CPUExecutionProvider"]
    try:
        sess = ort.InferenceSession(model, so, providers=providers)
    except Exception as e:  # noqa: BLE001 - ORT raises several types; all mean "cannot run this"
        raise Unsupported(_first_line(e)) from None
    if device == "cuda" and sess.get_providers()[0] != "CUDAExecutionProvider":
        raise Unsupported(f"CUDA EP not available to ONNX Runtime (providers {sess.get_providers()})")
    return sess


def stream_handle(stream) -> int:
    """A CUstream as int from a torch stream (or an int already)."""
    return int(getattr(stream, "cuda_stream", stream) or 0)


class BoundSession:
    """``calls`` runs the session on input set i; ``outputs[i]`` are set i's output buffers."""

    graphable = False  # never inside a torch CUDA graph: ORT captures its own (cuda_graph=True)

    def __init__(self, model: bytes, device: str, inputs: Sequence[dict[str, Buffer]],
                 outputs: Sequence[dict[str, Buffer]], *, stream=None, cuda_graph: bool = False,
                 **session_kwargs):
        import onnxruntime as ort

        self.device = device
        self.cuda_graph = cuda_graph
        self.session = make_session(model, device, stream=stream, cuda_graph=cuda_graph, **session_kwargs)
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.bindings, self.run_options = [], []
        for i, (ins, outs) in enumerate(zip(self.inputs, self.outputs)):
            io = self.session.io_binding()
            for name, buf in ins.items():
                io.bind_input(name, buf.device, 0, buf.onnx_type, list(buf.shape), buf.ptr)
            for name, buf in outs.items():
                io.bind_output(name, buf.device, 0, buf.onnx_type, list(buf.shape), buf.ptr)
            ro = ort.RunOptions()
            if device == "cuda":
                ro.add_run_config_entry("disable_synchronize_execution_providers", "1")
                if cuda_graph:
                    ro.add_run_config_entry("gpu_graph_id", str(i))
            self.bindings.append(io)
            self.run_options.append(ro)

    def run(self, i: int) -> None:
        self.session.run_with_iobinding(self.bindings[i], self.run_options[i])

    @property
    def calls(self) -> list:
        return [lambda i=i: self.run(i) for i in range(len(self.bindings))]

    def check_runs(self, synchronize) -> None:
        """One run per set (capturing graphs where asked), raising Unsupported on failure."""
        try:
            for i in range(len(self.bindings)):
                self.run(i)
                if self.cuda_graph:  # ORT captures on a later run than the first
                    self.run(i)
                    self.run(i)
            synchronize()
        except Exception as e:  # noqa: BLE001
            raise Unsupported(_first_line(e)) from None


def _first_line(e: Exception) -> str:
    text = str(e).strip() or type(e).__name__
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return (lines[0] if lines else text)[:400]
