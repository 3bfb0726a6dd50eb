"""A/B of a candidate grid of the Gluon kernels (aot/tiles.py GLUON_WS_CANDIDATES) against the
shipped table, through ONNX Runtime (`ort-flash bench --suite op`, or `--suite gqa`: the
GroupQueryAttention drop-in beside the plain op), on the GPU machine.

ORT_FLASH_GLUON_WS_ON is read when the kernels are built, so the two sides are two builds:
each a non-editable install into a folder of its own (`--target`), from a build folder of its own,
so that neither replaces the other or the editable install. The op suite then runs ROUNDS times
per side, the sides alternating, each in a fresh process with PYTHONPATH on its folder (run from
/tmp, so the source tree's ort_flash/ does not shadow it; an editable install's import hook
would, so the script stops if a side imports ort_flash from anywhere else). It prints, per
shape, each side's median time over the rounds (through ONNX Runtime and the kernel alone) and
the ratio shipped / candidate (> 1: the candidate is faster), and writes the rows as JSON.

    python3 lab/experiments/ab_grids.py --candidate d128-causal-tile-8192 --rounds 2 --out ab.json \
        -- --head-dims 128 --seqlens 4096 8192 16384 --dtypes float16 bfloat16
    python3 lab/experiments/ab_grids.py --candidate short-two-slots --suite gqa --out ab-gqa.json \
        -- --seqlens 128 512 1024 --caches 4096 --batches 1 --peers ort_flash ort_flash_fa
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SIDES = ("shipped", "candidate")


def build(side: str, candidate: str, folder: pathlib.Path, log: pathlib.Path) -> subprocess.Popen:
    env = dict(os.environ, ORT_FLASH_GLUON_WS_ON=candidate if side == "candidate" else "")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
           "-C", f"build-dir=/tmp/ab-build-{side}", "--target", str(folder), "--upgrade", str(ROOT)]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


# Per bench suite, the rows compared: ours through ONNX Runtime, then a second view of the same
# work (the op suite's kernel alone; the gqa suite's plain FlashAttention op on the same attention).
PEERS = {"op": ("ort_flash", "ort_flash_kernel"), "gqa": ("ort_flash", "ort_flash_fa")}


def run_side(folder: pathlib.Path, out: pathlib.Path, bench_args: list[str], suite: str = "op") -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    where = subprocess.run([sys.executable, "-c", "import ort_flash; print(ort_flash.__file__)"], env=env,
                           cwd="/tmp", capture_output=True, text=True)
    if not where.stdout.strip().startswith(str(folder)):
        sys.exit(f"ab_grids: ort_flash imports from {where.stdout.strip() or where.stderr.strip()[-300:]}, "
                 f"not {folder}: `pip uninstall ort-flash` (an editable install shadows PYTHONPATH)")
    cmd = [sys.executable, "-m", "ort_flash.cli", "bench", "--device", "cuda", "--suite", suite, "--out", str(out),
           *bench_args]
    subprocess.run(cmd, env=env, cwd="/tmp", check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def _key(config: dict) -> tuple:
    return tuple(sorted(config.items()))


def compare(docs: dict[str, list[dict]], suite: str = "op") -> list[dict]:
    """Per configuration of the suite, each side's median ms over its rounds for its PEERS (op:
    ort_flash through ONNX Runtime and ort_flash_kernel, the kernel alone; gqa: the drop-in and
    the plain op), and shipped / candidate."""
    times: dict = {}
    peers = PEERS[suite]
    for side, runs in docs.items():
        for doc in runs:
            for r in doc["suites"][suite]["rows"]:
                if r["peer"] in peers and r.get("status") == "ok":
                    times.setdefault(_key(r["config"]), {}).setdefault((side, r["peer"]), []).append(r["ms"])
    rows = []
    for key, t in times.items():
        row = {"config": dict(key)}
        for peer in peers:
            ms = {side: statistics.median(t[(side, peer)]) for side in SIDES if (side, peer) in t}
            row[peer] = {**{f"{side}_ms": v for side, v in ms.items()},
                         "rounds": min(len(t.get((side, peer), [])) for side in SIDES)}
            if len(ms) == 2:
                row[peer]["shipped_over_candidate"] = ms["shipped"] / ms["candidate"]
        rows.append(row)
    return rows


def format_rows(rows: list[dict], suite: str = "op") -> str:
    second = PEERS[suite][1]
    lines = ["dtype     d    heads  B    N      causal  shipped ms  candidate ms  ratio  "
             + ("kernel ratio" if suite == "op" else "plain-op ratio")]
    for r in sorted(rows, key=lambda r: (r["config"].get("dtype", ""), -r["config"].get("d", 0),
                                         r["config"].get("causal", False), r["config"].get("seqlen", 0))):
        c, o, k = r["config"], r["ort_flash"], r.get(second, {})
        ratio = o.get("shipped_over_candidate")
        kratio = k.get("shipped_over_candidate")
        lines.append(f"{c.get('dtype', ''):<9} {c.get('d', ''):<4} {c.get('heads', c.get('hq', '')):<6} "
                     f"{c.get('batch', ''):<4} {c.get('seqlen', ''):<6} {str(c.get('causal', c.get('phase', ''))):<7} {o.get('shipped_ms', float('nan')):>10.4f}  "
                     f"{o.get('candidate_ms', float('nan')):>12.4f}  "
                     f"{'n/a' if ratio is None else f'{ratio:.3f}':>5}  {'n/a' if kratio is None else f'{kratio:.3f}':>12}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--candidate", default="d128-causal-tile-8192")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default="ab-grids.json")
    p.add_argument("--work", default="/tmp", help="where the two --target folders go")
    p.add_argument("--no-build", action="store_true", help="reuse the folders of an earlier run")
    p.add_argument("--suite", choices=sorted(PEERS), default="op",
                   help="the bench suite both sides run (gqa: the GroupQueryAttention drop-in beside the plain op)")
    p.add_argument("bench_args", nargs="*", help="after --: ort-flash bench arguments (the suite's grid)")
    a = p.parse_args(argv)
    out = pathlib.Path(a.out).resolve()
    folders = {side: pathlib.Path(a.work) / f"ab-{side}" for side in SIDES}
    if not a.no_build:
        procs = {side: build(side, a.candidate, folders[side], out.with_name(f"{out.stem}-build-{side}.log"))
                 for side in SIDES}
        failed = [side for side, proc in procs.items() if proc.wait() != 0]
        if failed:
            sys.exit(f"ab_grids: the {', '.join(failed)} build failed (logs beside {out})")
    docs: dict = {side: [] for side in SIDES}
    for r in range(a.rounds):
        for side in SIDES:
            docs[side].append(run_side(folders[side], out.with_name(f"{out.stem}-{side}-{r}.json"), a.bench_args,
                                       a.suite))
    if not a.rounds:
        print(f"built {', '.join(str(f) for f in folders.values())} (no rounds asked)")
        return 0
    rows = compare(docs, a.suite)
    out.write_text(json.dumps({"candidate": a.candidate, "suite": a.suite, "rounds": a.rounds, "bench_args": a.bench_args,
                               "environment": docs["shipped"][0].get("environment"), "rows": rows}, indent=1))
    print(f"shipped table against candidate {a.candidate}, medians of {a.rounds} rounds each (ratio > 1: "
          "the candidate is faster)")
    print(format_rows(rows, a.suite))
    return 0


if __name__ == "__main__":
    sys.exit(main())
