#!/usr/bin/env bash
# One GPU-machine session: lab/gpu/gpu_env.sh (the Python's onnxruntime-gpu, or one carried beside
# the tree), build ort_flash for sm_90 (ORT_FLASH_CUDA_ARCHS) with the machine's Python, run the
# GPU test suite, `ort-flash demo` and the given extra commands.
# Logs land in $OUT. Run from the repository root on the device machine:
#   bash lab/gpu/gpu_session.sh [extra command ...]
# Used where present (git-ignored; lab/gpu/README.md, "A machine without network"): .ortgpu0-4
# (the onnxruntime-gpu wheel in parts), .orth (ORT headers, needed),
# optionally .gpucache and .gpumodels (lab/gpu/stage_gpu_cache.sh: compiled cubins, model exports).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $*" | tee -a "$OUT/session.log"; }

. lab/gpu/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
log "build"
t0=$(date +%s)
build_ort_flash || exit 1
log "built in $(( $(date +%s) - t0 )) s"
python3 -m ort_flash.cli info 2>&1 | tee -a "$OUT/session.log"
log "GPU tests"
# PYTEST_WORKERS > 1: pytest-xdist workers (tests spread over them; the model exports are
# written atomically, so workers may share the cache); the device-memory growth test,
# which reads the GPU's memory in use, runs alone afterwards.
if [ "${PYTEST_WORKERS:-1}" -gt 1 ]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=${GPU_TEST_TIMEOUT:-120} tests \
    -n "$PYTEST_WORKERS" --dist load -k "not 10000_runs" 2>&1 | tee "$OUT/pytest-gpu.log" | grep -v "^\." | tail -40
  python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=${GPU_TEST_TIMEOUT:-120} \
    tests/test_reliability_cuda.py -k 10000_runs 2>&1 | tee -a "$OUT/pytest-gpu.log" | tail -3
else
  python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=${GPU_TEST_TIMEOUT:-120} tests 2>&1 \
    | tee "$OUT/pytest-gpu.log" | grep -v "^\." | tail -40
fi
log "demo"
python3 -m ort_flash.cli demo --provider cuda 2>&1 | grep -v Memcpy | tee "$OUT/demo.log"
for cmd in "$@"; do
  log "$cmd"
  bash -c "$cmd" 2>&1 | tee -a "$OUT/extra.log"
done
