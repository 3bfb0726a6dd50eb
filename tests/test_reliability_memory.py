"""Host memory over many runs (CPU): the op keeps only bounded per-thread scratch between calls
(cpp/cpu_flash.cc, at most 16 MiB per thread), so a long-running session's resident memory
stays flat once every shape has been seen. (Device memory: tests/test_reliability_cuda.py.)"""

from __future__ import annotations

import numpy as np

from _onnx_models import flash_attention_model
from _session_runs import run_bound, session


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_no_host_memory_growth_over_many_runs():
    rng = np.random.default_rng(0)
    shapes = [(2, 4, 1, 130, 64), (1, 4, 77, 77, 64), (2, 4, 33, 150, 64), (1, 2, 100, 100, 64)]
    example = {n: np.zeros((1, 1, 1, 64), np.float32) for n in ("Q", "K", "V")}
    example["attn_mask"] = np.zeros((1, 1), np.float32)
    sess = session(flash_attention_model(example, {"Y": np.float32, "softmax_lse": np.float32},
                                         is_causal=1))
    runs = []
    for b, h, sq, skv, d in shapes:
        feeds = {"Q": rng.standard_normal((b, h, sq, d), dtype=np.float32),
                 "K": rng.standard_normal((b, h, skv, d), dtype=np.float32),
                 "V": rng.standard_normal((b, h, skv, d), dtype=np.float32),
                 "attn_mask": rng.standard_normal((sq, skv), dtype=np.float32)}
        runs.append((feeds, {"Y": ((b, h, sq, d), np.float32), "softmax_lse": ((b, h, sq), np.float32)}))

    def cycle(n):
        for i in range(n):
            feeds, specs = runs[i % len(runs)]
            run_bound(sess, feeds, specs)

    cycle(100)  # every shape seen: ORT's arena and the op's scratch at their peak
    before = _rss_bytes()
    cycle(800)
    growth = _rss_bytes() - before
    assert growth <= 8 << 20, f"resident memory grew by {growth / 2**20:.1f} MiB over 800 runs"
