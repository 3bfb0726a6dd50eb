#!/usr/bin/env bash
# The release check on the GPU machine, in three steps that each fit one 10-minute `run` call
# (the machine stays warm between back-to-back calls, so the build of step 1 is reused):
#
#   bash tools/gpu_release.sh tests   # build, `pytest -m gpu`, demo, decode benchmark (quick)
#   bash tools/gpu_release.sh bench   # op benchmark (fp16 + bf16, quick), end to end and the
#                                     # LLaMA-style decode step end to end (4 layers)
#   bash tools/gpu_release.sh extra   # compute-sanitizer memcheck on the direct-kernel tests,
#                                     # the Hopper levers (aot/levers.py), the decode tile sweep
#
# Carried (git-ignored): .ortgpu0-4, .orth, optionally .gpucache (see tools/gpu_session.sh).
# Everything lands in $OUT: logs, bench-{decode,op,e2e,decode_e2e}.json, levers.json, tune-decode.json.
# Set ORT_FLASH_BENCH_COMMIT to the commit under test (the copy on the machine has no history).
# Budgets (seconds) per part: DECODE_S, OP_S, E2E_S, DECODE_E2E_S, MEMCHECK_S, LEVERS_S, TUNE_S.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/ortsite
bench() {  # ort-flash bench with its progress bars left out of the log
  python3 -m ort_flash.cli bench --device cuda --cache-dir /tmp/ort_flash_bench "$@" 2>&1 | grep -v $'\r'
}
case "${1:-}" in
  tests)
    GPU_TEST_TIMEOUT=300 bash tools/gpu_session.sh \
      "python3 -m ort_flash.cli bench --device cuda --cache-dir /tmp/ort_flash_bench --suite decode --quick --budget-s ${DECODE_S:-70} --out $OUT/bench-decode.json 2>&1 | grep -v \$'\\r' | tail -25"
    ;;
  bench)
    bench --suite op --quick --dtypes float16 bfloat16 --budget-s "${OP_S:-150}" --out "$OUT/bench-op.json" | tail -45
    bench --suite e2e --quick --e2e-layers 4 --budget-s "${E2E_S:-160}" --out "$OUT/bench-e2e.json" | tail -30
    bench --suite decode_e2e --quick --e2e-layers 4 --budget-s "${DECODE_E2E_S:-170}" \
      --out "$OUT/bench-decode_e2e.json" | tail -16
    ;;
  extra)
    CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    if [ -n "$CS" ]; then
      timeout "${MEMCHECK_S:-150}" "$CS" --tool memcheck --error-exitcode 97 --print-limit 50 \
        --target-processes all --log-file "$OUT/memcheck.%p.log" \
        python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_kernel.py -k "not past_2_31" \
        > "$OUT/pytest-memcheck.log" 2>&1
      echo "== memcheck exit $?"; tail -3 "$OUT/pytest-memcheck.log"
      grep -h "ERROR SUMMARY" "$OUT"/memcheck.*.log | sort | uniq -c
    fi
    timeout "${LEVERS_S:-100}" python3 aot/levers.py --out "$OUT/levers.json" 2>&1 | grep -v "^  skip" | tail -8
    timeout "${TUNE_S:-60}" python3 aot/tune_decode.py --out "$OUT/tune-decode.json" 2>&1 | grep -v "^  skip" | tail -6
    ;;
  *) echo "usage: $0 tests|bench|extra"; exit 2 ;;
esac
