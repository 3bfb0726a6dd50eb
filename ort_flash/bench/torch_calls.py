"""Peers driven from Python without an ONNX Runtime session: torch SDPA on a chosen backend, and
the fused kernel alone through ``ort_flash._C`` (``run_cuda`` on the timer's stream, ``run_cpu``).

Every builder returns one callable per input set and keeps set 0's output for the agreement
check; a configuration a peer cannot run raises ``Unsupported`` with torch's or the op's reason.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Sequence

from ort_flash.bench.ort_session import Unsupported, stream_handle

if TYPE_CHECKING:
    from ort_flash.bench.tensors import Buffer

SDPA_BACKENDS = {"default": None, "cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}


class SdpaCalls:
    """torch.nn.functional.scaled_dot_product_attention on (B, H, S, D) tensors."""

    def __init__(self, qs: Sequence[Buffer], ks: Sequence[Buffer], vs: Sequence[Buffer], *,
                 backend: str = "default", causal: bool = False, lower_right: bool = False,
                 scale: float | None = None):
        import torch
        from torch.nn.attention import SDPBackend

        self.torch = torch
        self.backend = None if SDPA_BACKENDS[backend] is None else getattr(SDPBackend, SDPA_BACKENDS[backend])
        self.args = [(q.data, k.data, v.data) for q, k, v in zip(qs, ks, vs)]
        hq, hkv = qs[0].shape[1], ks[0].shape[1]
        self.kwargs = {"scale": scale, "enable_gqa": hq != hkv}
        sq, skv = qs[0].shape[2], ks[0].shape[2]
        if causal and (lower_right or sq != skv) and sq > 1:
            from torch.nn.attention.bias import causal_lower_right
            self.kwargs["attn_mask"] = causal_lower_right(sq, skv)
        elif causal and sq > 1:
            self.kwargs["is_causal"] = True
        self.result = None

    def _run(self, i: int):
        q, k, v = self.args[i]
        out = self.torch.nn.functional.scaled_dot_product_attention(q, k, v, **self.kwargs)
        if i == 0:
            self.result = out
        return out

    def run(self, i: int):
        if self.backend is None:
            return self._run(i)
        from torch.nn.attention import sdpa_kernel
        with sdpa_kernel(self.backend):
            return self._run(i)

    @property
    def calls(self) -> list:
        return [lambda i=i: self.run(i) for i in range(len(self.args))]

    def check_runs(self, synchronize) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch warns, then raises, when a backend refuses
                for i in range(len(self.args)):
                    self.run(i)
                synchronize()
        except (RuntimeError, TypeError, ValueError) as e:
            raise Unsupported(" ".join(str(e).split())[:300]) from None

    def output(self):
        return self.result


class KernelCalls:
    """The fused kernel alone: FlashParams over (B, H, S, D) buffers, launched through _C."""

    def __init__(self, qs, ks, vs, ys, *, device: str, causal: bool = False, scale: float | None = None,
                 seqlens: Sequence[Buffer] | None = None, stream=None):
        from ort_flash import _C

        self._C = _C
        self.device = device
        self.stream = stream_handle(stream) if stream is not None else 0
        self.ys = list(ys)
        self.params = []
        for i, (q, k, v, y) in enumerate(zip(qs, ks, vs, ys)):
            p = _C.FlashParams()
            p.dtype = getattr(_C.DType, q.dtype)
            p.q, p.k, p.v, p.y = q.ptr, k.ptr, v.ptr, y.ptr
            b, hq, sq, d = q.shape
            _, hkv, skv, dv = v.shape
            p.batch, p.hq, p.hkv, p.sq, p.skv, p.d, p.dv = b, hq, hkv, sq, skv, d, dv
            p.q_stride, p.y_stride = [hq * sq * d, sq * d, d], [hq * sq * dv, sq * dv, dv]
            p.k_stride, p.v_stride = [hkv * skv * d, skv * d, d], [hkv * skv * dv, skv * dv, dv]
            p.scale = float(scale if scale is not None else d ** -0.5)
            p.causal = bool(causal)
            if seqlens is not None:
                p.seqlens_k = seqlens[i].ptr
            else:
                p.offset = skv - sq if causal else 0  # bottom-right, as the op with a past
            self.params.append(p)
        if device == "cuda":
            try:
                self.device_info = tuple(_C.prepare_device(0))
            except RuntimeError as e:
                raise Unsupported(f"kernels do not load on this GPU: {e}") from None
        try:
            self.variant = list(_C.variant_for(self.params[0]))
        except RuntimeError as e:
            raise Unsupported(str(e)) from None

    def run(self, i: int) -> None:
        if self.device == "cuda":
            self._C.run_cuda(self.params[i], self.stream)
        else:
            self._C.run_cpu(self.params[i])

    @property
    def calls(self) -> list:
        return [lambda i=i: self.run(i) for i in range(len(self.params))]

    def check_runs(self, synchronize) -> None:
        try:
            for i in range(len(self.params)):
                self.run(i)
            synchronize()
        except RuntimeError as e:
            raise Unsupported(str(e)[:300]) from None

    def output(self):
        return self.ys[0].data

    def tile_config(self) -> dict | None:
        """The compiled kernel's tile (block_m, block_n, warps, shared) for the variant used."""
        if self.device != "cuda":
            return None
        name = self._C.launch_variant(self.params[0])
        arch = self.device_info[1]
        for k in self._C.kernels():
            if (k["variant"], k["arch"]) == (name, arch):
                return {key: k[key] for key in ("variant", "arch", "block_m", "block_n", "num_warps", "shared")}
        return None
