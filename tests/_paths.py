"""The environment of a child Python that imports the build-time package `aot` (a script run by
path starts its sys.path with its own folder, not the repository root)."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict:
    """os.environ with the repository root first on PYTHONPATH, and `extra` set."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def run_interpreted(script: str, case: dict) -> None:
    """Runs `script` (a test file whose __main__ checks one case given as JSON) on `case` in a child
    Python under Triton's interpreter (on torch CPU tensors); fails with the child's output."""
    import json
    import subprocess
    import sys

    import pytest

    pytest.importorskip("torch", reason="the Triton interpreter runs on torch CPU tensors")
    pytest.importorskip("triton", reason="the kernel source needs Triton")
    r = subprocess.run([sys.executable, script, json.dumps(case)], env=child_env(TRITON_INTERPRET="1"),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
