#!/usr/bin/env bash
# The GPU test suite under NVIDIA compute-sanitizer, on the GPU machine: memcheck (out-of-bounds
# and misaligned device accesses, invalid frees, CUDA API errors) and racecheck (shared-memory
# data races in the kernels). Any report fails the run (--error-exitcode).
#
# Run where the GPU tests already run, e.g. as an extra command of the GPU session:
#   bash lab/gpu/gpu_session.sh "bash lab/gpu/gpu_sanitize.sh"
# or by hand after building (onnxruntime-gpu importable, ort_flash installed):
#   bash lab/gpu/gpu_sanitize.sh [pytest args ...]
# Env: COMPUTE_SANITIZER (default: found on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin),
#      OUT (logs; default /tmp/out), PYTHON (default python3),
#      TOOLS (default "memcheck racecheck"),
#      SANITIZE_KERNELS (default kns=flash_: only ort_flash's kernels, whose names all start with
#        flash_, are instrumented; ONNX Runtime's and cuBLAS's run as they are, which makes a
#        session test seconds instead of minutes. CUDA API errors are checked for every call
#        either way. Set it empty to instrument every kernel.)
#
# Left out by default: the 10 000-run device-memory test (too slow under instrumentation, and
# the sanitizer's own allocations would blur it) and the >2^31-element test (minutes of
# instrumented launches); name them explicitly to include them.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
CS=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}
for cand in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda*/bin/compute-sanitizer; do
  [ -n "$CS" ] && break
  [ -x "$cand" ] && CS=$cand
done
[ -x "$CS" ] || { echo "compute-sanitizer not found (set COMPUTE_SANITIZER)"; exit 1; }
"$CS" --version | tail -1

if [ $# -eq 0 ]; then
  set -- -m gpu tests/test_cuda_op.py tests/test_cuda_kernel.py tests/test_reliability_cuda.py \
         tests/test_reliability_numerics.py tests/test_reliability_determinism.py tests/test_bad_input.py \
         -k "not 10000_runs and not past_2_31"
fi

status=0
FILTER=${SANITIZE_KERNELS-kns=flash_}
for tool in ${TOOLS:-memcheck racecheck}; do
  echo "== compute-sanitizer --tool $tool ${FILTER:+--kernel-name $FILTER}: pytest $*"
  t0=$(date +%s)
  "$CS" --tool "$tool" ${FILTER:+--kernel-name "$FILTER"} --error-exitcode 97 --print-limit 50 --target-processes all \
        --log-file "$OUT/sanitize-$tool.%p.log" \
        "$PY" -m pytest -q -p no:cacheprovider "$@" > "$OUT/pytest-sanitize-$tool.log" 2>&1
  rc=$?
  tail -5 "$OUT/pytest-sanitize-$tool.log"
  echo "== $tool: exit $rc in $(( $(date +%s) - t0 )) s; per process (logs: $OUT/sanitize-$tool.*.log):"
  grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$OUT"/sanitize-$tool.*.log 2>/dev/null | sort | uniq -c
  grep -h "^=========" "$OUT"/sanitize-$tool.*.log 2>/dev/null \
    | grep -v "COMPUTE-SANITIZER\|SUMMARY" | head -40
  [ "$rc" -eq 0 ] || status=1
done
exit $status
