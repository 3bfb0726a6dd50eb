"""The launch path on a machine with no GPU: ort_flash._C's run_cuda against a fake CUDA driver.

tests/fake_cuda/fake_libcuda.c is built here into a libcuda.so.1 and put first on the
LD_LIBRARY_PATH of a child Python, where cpp/cuda_driver.cc's dlopen finds it. The child loads
the build's cubins through it (prepare_device) and runs the calls it is given (run_cuda); the
fake logs every driver call as a JSON line, each kernel launch with the parameter buffer the GPU
would receive, laid out by the cubin's own parameter table (tests/test_launch_abi.py decodes it).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "fake_cuda" / "fake_libcuda.c"
# The environment variables the CUDA launcher reads to choose kernels (cpp/launch_switches.cc).
LAUNCH_SWITCHES = ("ORT_FLASH_GLUON", "ORT_FLASH_TMA", "ORT_FLASH_PDL", "ORT_FLASH_FUSED_COMBINE",
                   "ORT_FLASH_DECODE_SPLITS", "ORT_FLASH_KEY_BOUND", "ORT_FLASH_ROTARY_ON_LOAD",
                   "ORT_FLASH_WINDOW_SHIFT")
# The map the fake's cuTensorMapEncodeTiled writes: opaque[0] this, opaque[1] its log index.
MAP_MAGIC = 0x70616d656b6166


def compiler() -> str | None:
    return next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)


def build(out_dir: Path) -> Path:
    """Builds the fake into out_dir/libcuda.so.1; returns out_dir."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc, clang or $CC) to build the fake CUDA driver")
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([cc, "-std=c11", "-O1", "-Wall", "-shared", "-fPIC",
                    "-Wl,-soname,libcuda.so.1", "-o", str(out_dir / "libcuda.so.1"), str(SOURCE)],
                   check=True, capture_output=True, text=True)
    return out_dir


# Runs in the child: builds each call's FlashParams, asks the plan, runs it, and marks in the
# fake's log where each call starts.
_CHILD = textwrap.dedent("""
    import json, os, sys
    from ort_flash import _C

    job = json.load(sys.stdin)
    rows = job["rows"]
    log = os.environ["FAKE_CUDA_LOG"]
    out = []
    for i, call in enumerate(job["calls"]):
        p = _C.FlashParams()
        for k, v in call["params"].items():
            if k == "dtype":
                v = getattr(_C.DType, v)
            elif k == "mask_kind":
                v = getattr(_C.MaskKind, v)
            setattr(p, k, v)
        r = {"variant": None, "plan": None, "error": None}
        try:
            if call.get("plan", True) and rows is None:
                r["variant"] = _C.launch_variant(p)
                r["plan"] = list(_C.launch_plan(p))
            elif call.get("plan", True):
                kind, name, _, splits = _C.plan_with_table(p, rows)
                r["variant"], r["plan"] = name, [kind, splits]
            with open(log, "a") as f:
                f.write(json.dumps({"ev": "call", "index": i}) + "\\n")
            if rows is None:
                _C.run_cuda(p, call.get("stream", 0))
            else:
                _C.launch_with_table(p, rows, call.get("stream", 0))
        except RuntimeError as e:
            r["error"] = str(e)
        out.append(r)
    print(json.dumps(out))
""")


def child_env(driver_dir: Path, log: Path, env: dict | None = None) -> dict:
    """The environment of a child over the fake: it first on LD_LIBRARY_PATH, its log, and the
    launcher's switches from `env` only (not from the caller's shell)."""
    e = {k: v for k, v in os.environ.items() if k not in LAUNCH_SWITCHES}
    e.update({"LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(driver_dir), e.get("LD_LIBRARY_PATH")])),
              "FAKE_CUDA_LOG": str(log)})
    e.update(env or {})
    return e


def run_python(driver_dir: Path, log: Path, code: str, stdin: str = "", env: dict | None = None,
               stderr: list | None = None) -> str:
    """Runs `code` in a child Python over the fake driver; returns its stdout (and appends its
    standard error to `stderr`, where given)."""
    r = subprocess.run([sys.executable, "-c", code], input=stdin, env=child_env(driver_dir, log, env),
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"the child over the fake driver failed ({r.returncode}):\n{r.stderr[-4000:]}")
    if stderr is not None:
        stderr.append(r.stderr)
    return r.stdout


def run(driver_dir: Path, log: Path, calls: list[dict], env: dict | None = None,
        rows: list[dict] | None = None, stderr: list | None = None) -> tuple[list[dict], list[dict]]:
    """Runs `calls` (each {"params": {FlashParams field: value}, "stream": int, "plan": whether to
    ask launch_variant and launch_plan first (default true)}) in a child over the fake driver;
    with `rows`, over that table instead of the build's (_C.launch_with_table, planned by
    _C.plan_with_table: plan is then (kind, splits)). Returns (per call: variant, plan and error;
    the fake's log, one dict per driver call, with {"ev": "call", "index": i} where call i's
    launch starts). `stderr`: as run_python's."""
    log.unlink(missing_ok=True)
    out = run_python(driver_dir, log, _CHILD, json.dumps({"calls": calls, "rows": rows}), env, stderr)
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return json.loads(out.strip().splitlines()[-1]), events


def per_call(events: list[dict]) -> dict[int, list[dict]]:
    """The events after each call's marker, up to the next one."""
    out: dict[int, list[dict]] = {}
    cur = None
    for ev in events:
        if ev["ev"] == "call":
            cur = ev["index"]
            out[cur] = []
        elif cur is not None:
            out[cur].append(ev)
    return out


def param_bytes(launch: dict, function: dict) -> list[bytes]:
    """A launch's parameters, one bytes object per kernel parameter in the cubin's order."""
    buf = bytes.fromhex(launch["params"])
    return [buf[off:off + size] for off, size in function["params"]]
