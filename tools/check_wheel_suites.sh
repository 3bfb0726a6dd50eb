#!/usr/bin/env bash
# CI: every benchmark suite `ort-flash bench` lists, run from the installed wheel on the CPU. A
# fresh venv gets the wheel with [cpu] plus what the suites import (torch, transformers and
# onnxruntime-genai, the CPU package of the [test] extra's GenAI; versions from the wheel's metadata,
# torch pinned by .ci/constraints.txt); then, from a folder outside the checkout, each suite of
# the CLI's --suite choices runs with --device cpu --quick and the smallest grid its flags give.
# A suite fails the check when its command exits non-zero, when its JSON says "failed", when it
# measured nothing, or when a row is an error (an export or a rewrite that broke: the suites
# record those as rows and go on). A suite the CLI lists that this script has no grid for fails
# too, so a new suite gets one here.
#
#   bash tools/check_wheel_suites.sh dist/ort_flash-*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
WHEEL=$(realpath "${1:?usage: tools/check_wheel_suites.sh WHEEL}")
PY=$(command -v "${PYTHON:-python3}")
REPO=$PWD
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
V=$WORK/venv
start=$SECONDS

# The smallest grid of each suite on the CPU: one length, one batch, a 1-layer model.
declare -A GRID=(
  [op]="--seqlens 128 --dtypes float32 --head-dims 64"
  [decode]="--batches 1 --caches 256 --dtypes float32"
  [cpu]="--seqlens 128 --head-dims 64"
  [gqa]="--seqlens 128 --caches 256 --batches 1 --head-dims 64"
  [e2e]="--models bert-base --seqlens 32 --e2e-layers 1"
  [decode_e2e]="--batches 1 --caches 32 --e2e-layers 1"
  [genai]="--genai-model 1 64 2 1 --seqlens 16 --caches 64"
  [genai_fidelity]="--genai-model 1 64 2 1 --seqlens 16 --batches 1 --steps 2"
)

# torch, transformers and onnxruntime-genai as the wheel's [test] extra names them (its CUDA
# GenAI package requires onnxruntime-gpu; the CPU one requires the onnxruntime that [cpu] brings).
# Read from the wheel's own METADATA, so any Python 3 runs this.
extra=$("$PY" - "$WHEEL" <<'EOF'
import re, sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
reqs = [line.split(":", 1)[1].strip() for line in wheel.read(meta).decode().splitlines()
        if line.startswith("Requires-Dist:")]
test = [r.split(";")[0].strip() for r in reqs if re.search(r"extra\s*==\s*['\"]test['\"]", r)]
names = {"torch", "transformers", "onnxruntime-genai-cuda"}
print(*[r.replace("onnxruntime-genai-cuda", "onnxruntime-genai").replace(" ", "") for r in test
        if re.match(r"[A-Za-z0-9_.-]+", r).group(0) in names])
EOF
)
read -r -a EXTRA <<< "$extra"
[ "${#EXTRA[@]}" = 3 ] || { echo "== the wheel's [test] extra: wanted torch, transformers and GenAI, got: $extra"; exit 1; }
"$PY" -m venv "$V"
pip_log=$WORK/pip.log
env -u PYTHONPATH "$V/bin/pip" install -q "$WHEEL[cpu]" "${EXTRA[@]}" -c "$REPO/.ci/constraints.txt" > "$pip_log" 2>&1 \
  || { cat "$pip_log"; echo "== pip install WHEEL[cpu] ${EXTRA[*]} failed"; exit 1; }
install_s=$((SECONDS - start))

RUN=$WORK/run
mkdir -p "$RUN"
cd "$RUN"
clean=(env -u PYTHONPATH PATH="$V/bin:$PATH")
where=$("${clean[@]}" python -c "import ort_flash, onnxruntime, torch; print(ort_flash.__file__, onnxruntime.__version__, torch.__version__)")
case "$where" in "$V"/*) ;; *) echo "== ort_flash is not the installed wheel: $where"; exit 1 ;; esac
echo "== installed in $install_s s: ${EXTRA[*]}; ort_flash, onnxruntime, torch: $where"

# The suites as the CLI offers them: the choices of `ort-flash bench --suite`, less "all".
listed=$("${clean[@]}" python - <<'EOF'
import argparse
from ort_flash.cli import build_parser
sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
suite = next(a for a in sub.choices["bench"]._actions if "--suite" in a.option_strings)
print(*[c for c in suite.choices if c != "all"])
EOF
)
read -r -a SUITES <<< "$listed"
[ "${#SUITES[@]}" -gt 0 ] || { echo "== the CLI lists no suites"; exit 1; }
echo "== suites: ${SUITES[*]}"

failed=()
for s in "${SUITES[@]}"; do
  if [ -z "${GRID[$s]+set}" ]; then
    echo "== $s: no grid for it in tools/check_wheel_suites.sh"; failed+=("$s"); continue
  fi
  t=$SECONDS rc=0 vrc=0
  read -r -a flags <<< "${GRID[$s]}"
  "${clean[@]}" ort-flash bench --suite "$s" --device cpu --quick --budget-s 120 --out "$RUN/$s.json" \
    --cache-dir "$RUN/cache" "${flags[@]}" > "$RUN/$s.log" 2>&1 || rc=$?
  verdict=$("${clean[@]}" python - "$RUN/$s.json" "$s" <<'EOF' 2>&1
import collections, json, sys
try:
    suite = json.load(open(sys.argv[1]))["suites"][sys.argv[2]]
except (OSError, KeyError, ValueError) as e:
    sys.exit(f"no result: {type(e).__name__}: {e}")
rows = collections.Counter(r["status"] for r in suite["rows"])
text = f"{suite['status']}, rows {dict(rows)}"
errors = [r.get("reason", "") for r in suite["rows"] if r["status"] == "error"]
if suite["status"] == "failed" or not rows["ok"] or errors:
    sys.exit(f"{text}; {'; '.join(suite['notes'] + errors[:2])[:400]}")
print(text)
EOF
) || vrc=$?
  if [ "$rc" = 0 ] && [ "$vrc" = 0 ]; then
    echo "== $s: passed in $((SECONDS - t)) s ($verdict)"
  else
    tail -n 30 "$RUN/$s.log"; echo "== $s: FAILED in $((SECONDS - t)) s (exit $rc; $verdict)"; failed+=("$s")
  fi
done
echo "== ${#SUITES[@]} suites from the installed wheel in $((SECONDS - start)) s (install $install_s s)"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "== failed: ${failed[*]}"; exit 1
fi
