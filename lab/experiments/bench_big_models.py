"""Wall time and peak RSS of ``ort-flash rewrite`` and ``verify`` on models of 0.5 to 6+ GB.

    python lab/experiments/bench_big_models.py --sizes 0.5 2 --dtypes float16 float32 --json big.json

Each model is lab/models/big_model.py's decoder (hidden 2048, 16 heads, FFN 5632; the layer count
sets the size), written as model.onnx + model.onnx.data in --folder, rewritten and verified by
the ``ort-flash`` of the Python running this script (``--python`` for another install, e.g. one
built from another checkout), each command in a child that reports its own peak RSS. Files are deleted after
each model. Prints a table and writes JSON; the goal column is 1 GB + 1.2 x the weights.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab.models import big_model  # noqa: E402

CHILD = """
import json, resource, sys
from ort_flash.cli import main
try:
    rc = main(sys.argv[1:])
except BaseException as e:  # an old CLI's traceback: record it as a failure
    rc = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
print(json.dumps({"rc": rc, "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def run(python: str, *argv: str) -> dict:
    start = time.perf_counter()
    done = subprocess.run([python, "-c", CHILD, *argv], capture_output=True, text=True)
    wall = time.perf_counter() - start
    try:
        last = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        last = {"rc": f"crashed ({done.returncode})", "peak_bytes": None}
    err = done.stderr.strip().splitlines()
    return {**last, "wall_s": round(wall, 1), "stderr_last": err[-1] if err else ""}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=float, nargs="+", default=[0.5, 2.0])
    p.add_argument("--dtypes", nargs="+", default=["float16", "float32"], choices=["float16", "float32"])
    p.add_argument("--folder", default="/tmp/ort_flash_big_bench")
    p.add_argument("--python", default=sys.executable, help="the Python whose ort_flash runs")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rows = []
    for gb in args.sizes:
        for dtype in args.dtypes:
            folder = Path(args.folder) / f"{gb}gb_{dtype}"
            shutil.rmtree(folder, ignore_errors=True)
            itemsize = 2 if dtype == "float16" else 4
            layers = big_model.layers_for(gb, itemsize=itemsize)
            start = time.perf_counter()
            source = big_model.build(str(folder / "in"), layers, float16=dtype == "float16")
            built = time.perf_counter() - start
            weights = os.path.getsize(folder / "in" / "model.onnx.data")
            out = folder / "out" / "model.flash.onnx"
            out.parent.mkdir(parents=True)
            rw = run(args.python, "rewrite", source, "-o", str(out))
            vf = (run(args.python, "verify", source, str(out), "--seed", "0", "--seq-len", "16")
                  if out.exists() else {"rc": "no output", "peak_bytes": None, "wall_s": None})
            rows.append({"dtype": dtype, "layers": layers, "weights_bytes": weights,
                         "build_s": round(built, 1), "rewrite": rw, "verify": vf,
                         "goal_bytes": int((1 << 30) + 1.2 * weights)})
            print(json.dumps(rows[-1]), file=sys.stderr)
            shutil.rmtree(folder, ignore_errors=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": f"{platform.node()} {os.cpu_count()} cores",
                                               "rows": rows}, indent=2) + "\n")
    return 0


def table(rows: list[dict]) -> str:
    def gb(n):
        return "-" if n is None else f"{n / 1e9:.2f}"

    header = ("weights GB", "dtype", "layers", "rewrite s", "rewrite peak GB", "rc",
              "verify s", "verify peak GB", "rc", "goal GB")
    lines = [" | ".join(header), " | ".join("---" for _ in header)]
    for r in rows:
        lines.append(" | ".join(str(c) for c in (
            gb(r["weights_bytes"]), r["dtype"], r["layers"], r["rewrite"]["wall_s"],
            gb(r["rewrite"]["peak_bytes"]), r["rewrite"]["rc"], r["verify"]["wall_s"],
            gb(r["verify"]["peak_bytes"]), r["verify"]["rc"], gb(r["goal_bytes"]))))
    return "\n".join(f"| {line} |" for line in lines)


if __name__ == "__main__":
    raise SystemExit(main())
