"""Benchmark tensors on one device, addressed by pointer so every peer reads the same bytes.

torch allocates when it is importable (CPU or CUDA: the GPU machine has it, and device-side
random fills are fast even for a 17 GB KV cache); without torch, numpy on the CPU and
numpy-then-copy OrtValues on CUDA. Every tensor is filled with fresh N(0, 1) values, never zeros
(METHOD.md: zeros hide unwritten outputs and run faster than real data).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from onnx import TensorProto

ONNX_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
              "bfloat16": TensorProto.BFLOAT16, "int32": TensorProto.INT32,
              "int64": TensorProto.INT64, "bool": TensorProto.BOOL}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "bool": 1}
ROTATION_BYTES = 256 * 2**20  # rotate sets until this much is touched: several times any L2


def torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch


def rotation_sets(bytes_per_set: float, limit: int = 8) -> int:
    """How many input sets to rotate: enough to touch ROTATION_BYTES (at most ``limit``), at
    least 2 unless one set alone passes 1 GiB (a 17 GB KV cache needs no company)."""
    least = 1 if bytes_per_set >= 2**30 else 2
    return int(min(limit, max(least, math.ceil(ROTATION_BYTES / max(bytes_per_set, 1.0)))))


@dataclasses.dataclass
class Buffer:
    """A tensor and what ONNX Runtime's IOBinding needs to bind it by pointer."""
    data: Any  # torch.Tensor, numpy.ndarray or OrtValue: keeps the memory alive
    shape: tuple
    dtype: str
    device: str  # "cpu" | "cuda"

    @property
    def ptr(self) -> int:
        d = self.data
        if hasattr(d, "data_ptr"):
            return int(d.data_ptr())
        return int(d.ctypes.data)

    @property
    def onnx_type(self) -> int:
        return ONNX_TYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _ITEMSIZE[self.dtype]

    @property
    def is_torch(self) -> bool:
        return type(self.data).__module__.startswith("torch")


class Tensors:
    """Allocates Buffers on ``device`` ("cpu" or "cuda")."""

    def __init__(self, device: str, seed: int = 0, use_torch: bool = True):
        self.device = device
        self.torch = torch_or_none() if use_torch else None
        if device == "cuda" and self.torch is not None and not self.torch.cuda.is_available():
            self.torch = None
        self.rng = np.random.default_rng(seed)
        if self.torch is not None:
            self.gen = self.torch.Generator(device=device)
            self.gen.manual_seed(seed)

    # -- allocation -------------------------------------------------------------------------
    def randn(self, shape, dtype: str) -> Buffer:
        shape = tuple(int(s) for s in shape)
        if self.torch is not None:
            t = self.torch.empty(shape, dtype=getattr(self.torch, dtype), device=self.device)
            t.normal_(generator=self.gen)
            return Buffer(t, shape, dtype, self.device)
        return self._from_numpy(self.rng.standard_normal(shape, dtype=np.float32), dtype)

    def empty(self, shape, dtype: str) -> Buffer:
        """An output buffer, poisoned with NaN for float types (an unwritten element shows)."""
        shape = tuple(int(s) for s in shape)
        if self.torch is not None:
            t = self.torch.empty(shape, dtype=getattr(self.torch, dtype), device=self.device)
            if dtype in ("float32", "float16", "bfloat16"):
                t.fill_(float("nan"))
            return Buffer(t, shape, dtype, self.device)
        fill = np.nan if dtype in ("float32", "float16", "bfloat16") else 0
        return self._from_numpy(np.full(shape, fill, dtype=np.float32), dtype)

    def values(self, array, dtype: str, device: str | None = None) -> Buffer:
        """A tensor holding given values (lengths, masks) on ``device`` (default: this one)."""
        device = device or self.device
        array = np.ascontiguousarray(np.asarray(array))
        if device == "cpu":
            return Buffer(array.astype(_numpy_dtype(dtype)), array.shape, dtype, "cpu")
        if self.torch is not None:
            t = self.torch.from_numpy(array.astype(np.float32 if dtype == "bfloat16" else dtype))
            t = t.to(device=device, dtype=getattr(self.torch, dtype))
            return Buffer(t, tuple(array.shape), dtype, device)
        return self._from_numpy(array, dtype)

    def like(self, buf: Buffer, layout_fn) -> Buffer:
        """A contiguous tensor made from ``buf`` by ``layout_fn`` (a torch/numpy view function)."""
        if self.device == "cuda" and not buf.is_torch:
            raise NotImplementedError("re-laying out CUDA tensors needs torch")
        out = layout_fn(buf.data)
        out = out.contiguous() if hasattr(out, "contiguous") else np.ascontiguousarray(out)
        return Buffer(out, tuple(out.shape), buf.dtype, buf.device)

    def _from_numpy(self, array: np.ndarray, dtype: str) -> Buffer:
        host = np.ascontiguousarray(array.astype(_numpy_dtype(dtype)))
        if self.device == "cpu":
            return Buffer(host, host.shape, dtype, "cpu")
        import onnxruntime as ort

        if dtype == "bfloat16":
            raise NotImplementedError("bfloat16 tensors on CUDA need torch (numpy has no bfloat16 "
                                      "bridge into ONNX Runtime's CUDA memory)")
        return Buffer(ort.OrtValue.ortvalue_from_numpy(host, "cuda", 0), host.shape, dtype, "cuda")

    # -- device ----------------------------------------------------------------------------
    def synchronize(self) -> None:
        if self.device == "cuda" and self.torch is not None:
            self.torch.cuda.synchronize()

    def free_bytes(self) -> float | None:
        """Free device memory, or None where unknown."""
        if self.device == "cuda" and self.torch is not None:
            return float(self.torch.cuda.mem_get_info()[0])
        return None

    def release_cache(self) -> None:
        """Hands torch's cached blocks back so ONNX Runtime's arena can grow into them."""
        if self.device == "cuda" and self.torch is not None:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()


def _numpy_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def to_numpy(buf: Buffer) -> np.ndarray:
    """A float64 host copy (for comparing peers' outputs)."""
    d = buf.data
    if buf.is_torch:
        return d.detach().float().cpu().numpy().astype(np.float64)
    if hasattr(d, "numpy"):  # OrtValue
        return np.asarray(d.numpy()).astype(np.float64)
    return np.asarray(d, dtype=np.float64)
