"""Hashes the machine code of every cubin a build ships, to show that a change to the kernel sources
or to aot/ left it alone ("SASS unchanged"): sha256 of `cuobjdump -sass` per (variant, arch).

    python tools/sass_hashes.py --build -o before.json          # runs the AOT build (cubins from its cache)
    python tools/sass_hashes.py --aot-dir BUILD/aot -o after.json # the cubins a build wrote (its manifest.json)
    python tools/sass_hashes.py --compare before.json after.json  # exit 1 unless every hash is the same

--build runs the tree's AOT build for --archs (default 80,90) into a temporary folder with the
usual cubin cache, so only what the cache lacks compiles; ORT_FLASH_GLUON_WS_ON is passed through
(unset: the shipped table). cuobjdump is the one in the Triton wheel (backends/nvidia/bin).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cuobjdump() -> str:
    try:
        import triton
        tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if tool.exists():
            return str(tool)
    except ImportError:
        pass
    found = shutil.which("cuobjdump")
    if not found:
        sys.exit("sass_hashes: no cuobjdump (install triton, whose wheel carries one)")
    return found


def sass_hash(tool: str, cubin: Path) -> str:
    out = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    if "Function :" not in out:
        raise RuntimeError(f"{cubin}: cuobjdump printed no function")
    return hashlib.sha256(out.encode()).hexdigest()


def hashes(aot_dir: Path, jobs: int) -> dict[str, dict]:
    """{variant.smARCH: {"kernel": symbol, "sass": hash}} for every kernel in aot_dir's manifest."""
    manifest = json.loads((aot_dir / "manifest.json").read_text())
    tool = cuobjdump()
    kernels = manifest["kernels"]
    names = [f"{k['variant']}.sm{k['arch']}" for k in kernels]
    with ThreadPoolExecutor(jobs) as pool:
        digests = list(pool.map(lambda n: sass_hash(tool, aot_dir / f"{n}.cubin"), names))
    return {n: {"kernel": k["kernel_name"], "sass": d} for n, k, d in sorted(zip(names, kernels, digests))}


def build(root: Path, archs: str, out: Path):
    """The tree's AOT build into `out` (the cubins from the usual cache where it has them)."""
    cmd = [sys.executable, "-m", "aot.build"] if (root / "aot" / "__init__.py").exists() else [
        sys.executable, str(root / "aot" / "build.py")]
    subprocess.run(cmd + ["--archs", archs, "--out", str(out)], cwd=root, check=True)


def compare(before: dict, after: dict) -> tuple[bool, str]:
    same = [n for n in before if n in after and before[n] == after[n]]
    changed = sorted(n for n in before if n in after and before[n] != after[n])
    gone = sorted(set(before) - set(after))
    new = sorted(set(after) - set(before))
    lines = [f"{len(before)} cubins before, {len(after)} after: {len(same)} identical, "
             f"{len(changed)} changed, {len(gone)} missing, {len(new)} new"]
    for title, names in (("changed", changed), ("missing", gone), ("new", new)):
        lines += [f"  {title}: {n}" for n in names]
    return not (changed or gone or new), "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--build", action="store_true", help="run the AOT build first (into a temporary folder)")
    src.add_argument("--aot-dir", type=Path, help="a folder the AOT build wrote (manifest.json and the cubins)")
    src.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--archs", default="80,90")
    ap.add_argument("--root", type=Path, default=ROOT, help="the tree whose AOT build --build runs")
    ap.add_argument("-o", "--output", type=Path, help="the JSON to write (default: stdout)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)

    if args.compare:
        ok, report = compare(*(json.loads(p.read_text()) for p in args.compare))
        print(report)
        return 0 if ok else 1
    with tempfile.TemporaryDirectory(prefix="sass-") as tmp:
        aot_dir = args.aot_dir
        if args.build:
            aot_dir = Path(tmp)
            build(args.root.resolve(), args.archs, aot_dir)
        result = hashes(aot_dir, args.jobs)
    text = json.dumps(result, indent=1, sort_keys=True) + "\n"
    if args.output:
        args.output.write_text(text)
        print(f"sass_hashes: {len(result)} cubins -> {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
