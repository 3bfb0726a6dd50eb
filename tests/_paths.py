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
