"""Where a benchmark ran: machine, GPU and driver, library versions, date, git commit."""
from __future__ import annotations

import datetime
import importlib.metadata
import os
import pathlib
import platform
import subprocess


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(cmd: list[str], cwd=None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> dict:
    """The commit of the ort_flash checkout (``ORT_FLASH_BENCH_COMMIT`` overrides), and whether
    the tree had local changes."""
    if os.environ.get("ORT_FLASH_BENCH_COMMIT"):
        return {"commit": os.environ["ORT_FLASH_BENCH_COMMIT"], "dirty": None}
    for root in (pathlib.Path.cwd(), pathlib.Path(__file__).resolve().parents[2]):
        commit = _run(["git", "rev-parse", "HEAD"], cwd=root)
        if commit:
            status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
            return {"commit": commit, "dirty": bool(status)}
    return {"commit": None, "dirty": None}


def cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_info() -> dict | None:
    """GPU name, driver, memory and clocks from nvidia-smi (torch's view as a fallback)."""
    fields = "name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit,compute_cap"
    out = _run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"])
    if out:
        values = [v.strip() for v in out.splitlines()[0].split(",")]
        info = dict(zip(fields.split(","), values))
        info["count"] = len(out.splitlines())
        return info
    try:
        import torch
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            return {"name": p.name, "memory.total": f"{p.total_memory / 2**20:.0f} MiB",
                    "compute_cap": f"{p.major}.{p.minor}", "driver_version": None}
    except ImportError:
        pass
    return None


def library_fingerprint() -> dict | None:
    """Which build of libort_flash.so ran: a hash and the file's time (a rebuild mid-run shows)."""
    import hashlib

    try:
        import ort_flash
        path = pathlib.Path(ort_flash.library_path())
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except Exception:  # noqa: BLE001
        return None
    mtime = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc)
    return {"path": str(path), "sha256": digest, "built": mtime.isoformat(timespec="seconds")}


def versions() -> dict:
    out = {name: _version(dist) for name, dist in (
        ("ort_flash", "ort-flash"), ("onnxruntime", "onnxruntime-gpu"), ("onnx", "onnx"),
        ("torch", "torch"), ("triton", "triton"), ("transformers", "transformers"),
        ("numpy", "numpy"), ("onnxscript", "onnxscript"))}
    try:
        import onnxruntime
        out["onnxruntime"] = onnxruntime.__version__  # the one imported (PYTHONPATH may differ)
        out["onnxruntime_path"] = str(pathlib.Path(onnxruntime.__file__).parent)
    except ImportError:
        pass
    try:
        import torch
        out["torch_cuda"] = torch.version.cuda
    except ImportError:
        pass
    try:
        from ort_flash import _C
        kernels = _C.kernels()
        out["aot_triton"] = _C.triton_version()
        out["aot_kernels"] = len(kernels)
        out["aot_archs"] = sorted({k["arch"] for k in kernels})
    except Exception:  # noqa: BLE001 - a broken build still gets a report
        pass
    out["library"] = library_fingerprint()
    return out


def loadavg() -> list[float] | None:
    """Other work on the machine makes timings noisy; the load average says how much there was."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def describe(device: str) -> dict:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "host": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                 "platform": platform.platform(), "loadavg_at_start": loadavg(),
                 "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")},
        "gpu": gpu_info() if device == "cuda" else None,
        "versions": versions(),
        "git": git_commit(),
    }
