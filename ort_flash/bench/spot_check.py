"""Every timed peer's output is checked against ``ort_flash.reference`` (float64) on a sample:
a few (batch, head) pairs and query rows at both ends of the sequence (where causal masking
differs most). Cheap enough to run on every configuration; a peer that is fast but wrong is
reported as a mismatch, ours included.
"""
from __future__ import annotations

import numpy as np

from ort_flash.reference import attention_reference

LIMITS = {"float32": 2e-3, "float16": 1e-2, "bfloat16": 3e-2}  # relative L2 error on the sample
ROWS_EACH_END = 16


def _host(x) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().float().cpu().numpy().astype(np.float64)
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):  # OrtValue
        return np.asarray(x.numpy(), dtype=np.float64)
    return np.asarray(x, dtype=np.float64)


class SpotCheck:
    """Reference rows for (B, Hq, Sq, D) Q against (B, Hkv, Skv, D) K/V; query i sits at key
    position ``offset + i`` (offset = Skv - Sq: bottom-right, as the op with a cache). ``sinks``
    (Hq,): attention sinks, a key of that score and value 0 in each head's rows. ``window`` W
    (causal only): a query sees its own key and the W - 1 before it."""

    def __init__(self, q, k, v, *, causal: bool, scale: float | None = None, dtype: str = "float16",
                 sinks=None, window: int | None = None):
        b, hq, sq, d = q.shape
        hkv = k.shape[1]
        self.limit = LIMITS.get(dtype, 3e-2)
        if sq <= 2 * ROWS_EACH_END:
            self.rows = np.arange(sq)
        else:
            self.rows = np.concatenate([np.arange(ROWS_EACH_END), np.arange(sq - ROWS_EACH_END, sq)])
        self.pairs = sorted({(0, 0), (b - 1, hq - 1)})
        offset = k.shape[2] - sq
        if sinks is not None:
            sinks = _host(getattr(sinks, "data", sinks))
        self.refs = []
        for bi, h in self.pairs:
            kh = h // (hq // hkv)
            qs = _host(q.data[bi, h])[self.rows][None, None]
            ks = _host(k.data[bi, kh])[None, None]
            vs = _host(v.data[bi, kh])[None, None]
            mask = None
            if causal:
                pos = (offset + self.rows)[:, None]
                mask = (np.arange(k.shape[2])[None, :] <= pos)
                if window is not None:
                    mask &= np.arange(k.shape[2])[None, :] > pos - window
            y, _, _, lse = attention_reference(qs, ks, vs, attn_mask=mask, scale=scale)
            y = y[0, 0]
            if sinks is not None:  # the sink's exp joins the denominator exp(lse)
                y = y / (1.0 + np.exp(float(sinks[h]) - lse[0, 0]))[:, None]
            self.refs.append(y)

    def error(self, out) -> float:
        """Relative L2 error of ``out`` (a (B, Hq, Sq, D) view) on the sampled rows."""
        num = den = 0.0
        for (bi, h), ref in zip(self.pairs, self.refs):
            got = _host(out[bi, h])[self.rows]
            num += float(np.sum((got - ref) ** 2))
            den += float(np.sum(ref ** 2))
        return float(np.sqrt(num / den)) if den else float(np.sqrt(num))
