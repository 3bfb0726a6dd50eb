"""Which kernel ONNX Runtime's CUDA GroupQueryAttention runs on each gqa configuration.

With ``ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO=1`` ONNX Runtime's CUDA attention ops print a line
to the process's stdout on every call (``Operator=GroupQueryAttention ... SdpaKernel=FLASH_ATTENTION``).
The variable is read once per CUDA execution provider and a print per call would be timed, so a
child process (``python -m ort_flash.bench.gqa_probe JOB``) runs each configuration once with it
set, file descriptor 1 redirected to a file around the run, and answers one JSON line:
{config index: kernel name, or why there is none}.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

from ort_flash.bench import results

ENV = "ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO"
TIMEOUT_S = 600


def probe(configs: list[dict], seed: int = 0) -> dict:
    """{config_key: kernel name or reason} from one child process."""
    env = dict(os.environ, **{ENV: "1"})
    job = json.dumps({"configs": configs, "seed": seed})
    try:
        proc = subprocess.run([sys.executable, "-m", "ort_flash.bench.gqa_probe", job], env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
            raise RuntimeError(tail[0][:200])
        found = json.loads(lines[-1])
    except Exception as e:  # noqa: BLE001 - a missing kernel name must not stop the suite
        return {results.config_key(c): f"unknown (probe failed: {type(e).__name__}: {e})" for c in configs}
    return {results.config_key(c): found.get(str(i), "unknown") for i, c in enumerate(configs)}


def _kernel(text: str) -> str:
    names = re.findall(r"SdpaKernel=([A-Z_]+)", text)
    if names:
        return names[-1]
    return "not printed" + (f" ({text.strip()[:120]})" if text.strip() else "")


def main(job: dict) -> dict:
    from ort_flash.bench import gqa_peers, suites
    from ort_flash.bench.measure import Context, release

    suites.setup_device("cuda")
    ctx = Context.create("cuda", job.get("seed", 0))
    found, stdout = {}, os.dup(1)
    for i, cfg in enumerate(job["configs"]):
        run = sets = None
        try:
            ctx.require(gqa_peers.set_bytes(cfg), "the input set")
            sets, shared = gqa_peers.make_sets(ctx.tensors, cfg, 1)
            run = gqa_peers.session(ctx, cfg, sets, shared, "com.microsoft", n=1)
            with tempfile.TemporaryFile() as f:
                sys.stdout.flush()
                os.dup2(f.fileno(), 1)
                try:
                    run.run(0)
                    ctx.synchronize()
                finally:
                    sys.stdout.flush()
                    os.dup2(stdout, 1)
                f.seek(0)
                found[str(i)] = _kernel(f.read().decode(errors="replace"))
        except Exception as e:  # noqa: BLE001 - one configuration's failure is its answer
            found[str(i)] = f"not run ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})"
        finally:
            run = sets = None
            release(ctx)
    return found


if __name__ == "__main__":
    os.environ.setdefault(ENV, "1")
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
