"""What one attention call must do: the floating-point operations and the fewest bytes moved.

These are the numerators of every rate the benchmark reports (TFLOP/s, TB/s); the counts follow
the convention of FlashAttention's papers so numbers compare with published ones.
"""
from __future__ import annotations

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def attention_flops(batch: int, heads: int, sq: int, skv: int, d: int, causal: bool = False,
                    dv: int | None = None) -> float:
    """4·B·H·Sq·Skv·D (two matmuls of 2·M·N·K each, D = Dv), half of it when causal.

    The causal half is the convention for square attention (Sq = Skv); it is applied as is for
    any shape, so causal rates compare across peers, not with the dense ones.
    """
    dv = d if dv is None else dv
    flops = 2.0 * batch * heads * sq * skv * (d + dv)
    return flops / 2 if causal else flops


def kv_read_bytes(batch: int, kv_heads: int, skv: int, d: int, dtype: str, dv: int | None = None) -> float:
    """Bytes of K and V one decode step must read: B·Hkv·Skv·(D + Dv)·sizeof(dtype)."""
    dv = d if dv is None else dv
    return float(batch * kv_heads * skv * (d + dv) * DTYPE_BYTES[dtype])


def io_bytes(batch: int, hq: int, hkv: int, sq: int, skv: int, d: int, dtype: str) -> float:
    """Fewest bytes of a call: Q, K, V read once and Y written once."""
    return float(batch * (2 * hq * sq + 2 * hkv * skv) * d * DTYPE_BYTES[dtype])


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def tbps(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e12


def floor_ms(flops: float, nbytes: float, ceilings: dict) -> float:
    """The larger of flops / matmul rate and bytes / copy bandwidth (METHOD.md's floor)."""
    t_math = flops / (ceilings["matmul_tflops"] * 1e12)
    t_mem = nbytes / (ceilings["copy_tbps"] * 1e12)
    return max(t_math, t_mem) * 1e3
