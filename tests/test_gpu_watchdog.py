"""The GPU tests' hang guard (conftest._gpu_watchdog): a gpu-marked test that runs past
ORT_FLASH_GPU_TEST_TIMEOUT ends its process with every thread's stack, instead of hanging."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_a_hanging_gpu_test_ends_the_process(tmp_path):
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text().replace(
        'item.add_marker(pytest.mark.skip(reason=f"GPU test: {reason}"))', "pass"))
    (tmp_path / "test_hang.py").write_text(textwrap.dedent("""
        import time
        import pytest

        @pytest.mark.gpu
        def test_hangs():
            time.sleep(60)
    """))
    env = dict(os.environ, ORT_FLASH_GPU_TEST_TIMEOUT="2")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-o", "markers=gpu: x", str(tmp_path / "test_hang.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=50)
    assert run.returncode != 0
    assert "test_hangs must finish within 2 s" in run.stderr, run.stderr
    assert "Timeout (0:00:02)!" in run.stderr and "test_hangs" in run.stderr, run.stderr
