"""Library lifetime: the custom-op library registered in many sessions, released, registered
again; two copies of it loaded at once; sessions alive (and running) at interpreter exit.

ONNX Runtime loads the library for each SessionOptions that registers it and unloads it when
the last session and options holding it are gone. Once a thread has run the op, glibc keeps
the library mapped until that thread exits (the op's thread-local scratch has a destructor),
so only a library that has not run yet is really unloaded and loaded again ("unload_and_reload");
the other scenarios release and re-register a library that stays mapped. Each scenario runs in
a child process: a crash at unload or at exit only shows in the exit code.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent)

PRELUDE = f"""
import gc, os, shutil, sys, tempfile, threading
sys.path.insert(0, {TESTS!r})
import numpy as np
import onnxruntime as ort
import ort_flash
from _onnx_models import flash_attention_model
from _session_runs import run_bound

rng = np.random.default_rng(0)
FEEDS = {{n: rng.standard_normal((2, 4, 37, 16), dtype=np.float32) for n in ("Q", "K", "V")}}
MODEL = flash_attention_model(FEEDS, {{"Y": np.float32}}, is_causal=1)
SPECS = {{"Y": ((2, 4, 37, 16), np.float32)}}

def new_session(library=None, threads=None):
    so = ort.SessionOptions()
    so.register_custom_ops_library(library or ort_flash.library_path())
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(MODEL, so, providers=["CPUExecutionProvider"])

def run(sess):
    return run_bound(sess, FEEDS, SPECS)["Y"]

def loaded_copies(path):
    return sum(path in line for line in open("/proc/self/maps"))

WANT = run(new_session())
gc.collect()
"""

SCENARIOS = {
    "register_release_cycles": """
        lib = ort_flash.library_path()
        for cycle in range(5):
            sessions = [new_session(threads=1 + i % 3) for i in range(12)]
            for s in sessions:
                assert np.array_equal(run(s), WANT)
            del sessions, s
            gc.collect()
        print("maps after release:", loaded_copies(lib))
        assert np.array_equal(run(new_session()), WANT)
    """,
    "unload_and_reload": """
        # A library no thread has run yet is really unloaded when its last session goes, and
        # loaded again (a fresh RegisterCustomOps) by the next. A private copy, so that no
        # earlier run pins it.
        tmp = tempfile.mkdtemp()
        copy = os.path.join(tmp, "libort_flash_copy.so")
        shutil.copy(ort_flash.library_path(), copy)
        for cycle in range(5):
            sessions = [new_session(copy) for _ in range(4)]  # created, not run
            assert loaded_copies(copy) > 0
            del sessions
            gc.collect()
            assert loaded_copies(copy) == 0, f"cycle {cycle}: the library is still mapped"
        assert np.array_equal(run(new_session(copy)), WANT)
        shutil.rmtree(tmp)
    """,
    "interleaved_register_release": """
        # Sessions outlive their options and each other in a shuffled order.
        alive = []
        for i in range(40):
            alive.append(new_session())
            if i % 3 == 2:
                victim = alive.pop(int(rng.integers(len(alive))))
                assert np.array_equal(run(victim), WANT)
                del victim
                gc.collect()
        for s in alive:
            assert np.array_equal(run(s), WANT)
    """,
    "two_copies_of_the_library": """
        # A second file with the same code is a second library in the process (own statics,
        # own op registry); sessions of both run side by side.
        tmp = tempfile.mkdtemp()
        copy = os.path.join(tmp, "libort_flash_copy.so")
        shutil.copy(ort_flash.library_path(), copy)
        a, b = new_session(), new_session(copy)
        assert loaded_copies(copy) > 0
        for _ in range(3):
            assert np.array_equal(run(a), WANT) and np.array_equal(run(b), WANT)
        del b
        gc.collect()
        assert np.array_equal(run(a), WANT)
        shutil.rmtree(tmp)
    """,
    "sessions_alive_at_exit": """
        # Module-level sessions are released during interpreter shutdown, in no fixed order.
        KEEP = [new_session(threads=t) for t in (1, 2, 4)]
        for s in KEEP:
            assert np.array_equal(run(s), WANT)
    """,
    "parked_daemon_thread_holding_sessions_at_exit": """
        # A daemon thread ran sessions (its thread-local scratch holds buffers) and is parked,
        # still holding them, when the main thread exits. (A thread still inside Run at exit is
        # not covered: ONNX Runtime itself aborts then, with standard ops alone.)
        ready, park = threading.Event(), threading.Event()
        def worker():
            mine = [new_session(threads=t) for t in (1, 2)]
            for s in mine:
                assert np.array_equal(run(s), WANT)
            ready.set()
            park.wait()
        threading.Thread(target=worker, daemon=True).start()
        assert ready.wait(60)
    """,
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_library_lifetime(name):
    code = PRELUDE + textwrap.dedent(SCENARIOS[name]) + "\nprint('done')\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, (
        f"{name}: exit code {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    assert "done" in proc.stdout
