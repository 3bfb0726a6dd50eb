"""The two ceilings every rate is compared with, measured in the same run (METHOD.md):
the matrix-product rate (a large matmul through torch) and the memory bandwidth (a large
device-to-device copy, counting bytes read plus bytes written).

CUDA: bf16 and fp16 8192³ matmuls, a 2 GiB copy. CPU: fp32 2048³ matmul, a 256 MiB copy.
Without torch on CUDA the datasheet-like constants below stand in, and the result says so.
"""
from __future__ import annotations

from ort_flash.bench.timers import time_calls

H200_FALLBACK = {"matmul_tflops": 790.0, "copy_tbps": 4.3}


def measure(device: str, quick: bool = False) -> dict:
    try:
        import torch
    except ImportError:
        torch = None
    if device == "cuda":
        if torch is None or not torch.cuda.is_available():
            return {**H200_FALLBACK, "source": "constants (torch with CUDA not available; "
                    "H200 bf16 matmul and copy bandwidth measured on 2026-11-29)"}
        return _cuda(torch, quick)
    return _cpu(torch, quick)


def _cuda(torch, quick: bool) -> dict:
    n = 8192
    out = {"source": "measured", "matmul_shape": [n, n, n]}
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for dtype in ("bfloat16", "float16"):
            a, b, c = (torch.randn(n, n, device="cuda", dtype=getattr(torch, dtype)) for _ in range(3))
            t = time_calls([lambda a=a, b=b, c=c: torch.matmul(a, b, out=c)], "cuda", stream=stream,
                           target_s=0.1 if quick else 0.3, warmup=5)
            out[f"matmul_{dtype}_tflops"] = 2 * n**3 / (t.ms * 1e-3) / 1e12
        nbytes = 2 * 2**30
        src = torch.empty(nbytes // 2, device="cuda", dtype=torch.float16).normal_()
        dst = torch.empty_like(src)
        t = time_calls([lambda dst=dst, src=src: dst.copy_(src)], "cuda", stream=stream,
                       target_s=0.1 if quick else 0.3)
        out["copy_bytes"] = nbytes
        out["copy_tbps"] = 2 * nbytes / (t.ms * 1e-3) / 1e12
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    out["matmul_tflops"] = out["matmul_bfloat16_tflops"]
    return out


def _cpu(torch, quick: bool) -> dict:
    import numpy as np

    n = 1024 if quick else 2048
    out = {"source": "measured", "matmul_shape": [n, n, n]}
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        t = time_calls([lambda: torch.matmul(ta, tb)], "cpu", target_s=0.5, min_samples=3)
        out["matmul_via"] = f"torch ({torch.get_num_threads()} threads)"
    else:
        t = time_calls([lambda: a @ b], "cpu", target_s=0.5, min_samples=3)
        out["matmul_via"] = "numpy"
    out["matmul_float32_tflops"] = out["matmul_tflops"] = 2 * n**3 / (t.ms * 1e-3) / 1e12
    nbytes = 256 * 2**20
    src = rng.standard_normal(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    t = time_calls([lambda: np.copyto(dst, src)], "cpu", target_s=0.3, min_samples=3)
    out["copy_bytes"] = nbytes
    out["copy_tbps"] = 2 * nbytes / (t.ms * 1e-3) / 1e12
    return out
