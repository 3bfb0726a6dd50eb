#!/usr/bin/env bash
# One GPU-machine call for `ort-flash bench`: lab/gpu/gpu_env.sh (the Python's onnxruntime-gpu, or one
# carried beside the tree), build ort_flash for sm_90 (ORT_FLASH_CUDA_ARCHS; the same first steps
# as lab/gpu/gpu_session.sh, without its tests and demo), run the benchmark inside what is left of
# a deadline, and render the report. Everything lands in $OUT:
#   bench-gpu.json (+ bench-gpu.<suite>.json per suite, written as they go), bench.log, build.log,
#   docs/PERFORMANCE.md, docs/performance/*.png and docs/performance/bench-gpu.json (copy docs/
#   back into the repository; `python -m ort_flash.bench.report` rebuilds the page from the JSON).
# Run from the repository root on the device machine:
#   bash lab/gpu/bench_gpu.sh                          # --suite all --quick
#   bash lab/gpu/bench_gpu.sh --suite op               # the full op grid (~5 min)
#   bash lab/gpu/bench_gpu.sh --suite decode_e2e       # the 16-layer LLaMA-style decode step, past 1k-32k
#   BENCH_DEADLINE_S=560 bash lab/gpu/bench_gpu.sh --suite all --e2e-layers 4
# BENCH_DEADLINE_S (default 540) is counted from the start of this script, build included.
# Used where present (git-ignored; lab/gpu/README.md, "A machine without network"): .ortgpu0-4
# (the onnxruntime-gpu wheel in parts), .orth (ORT headers, needed),
# optionally .gpucache (lab/gpu/stage_gpu_cache.sh: compiled cubins and model exports).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
start=$(date +%s)
. lab/gpu/gpu_env.sh
export ORT_FLASH_BENCH_COMMIT=${ORT_FLASH_BENCH_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
build_ort_flash || exit 1
echo "== ready in $(( $(date +%s) - start )) s"
left=$(( ${BENCH_DEADLINE_S:-540} - ($(date +%s) - start) - 20 ))  # 20 s for the report
[ $# -eq 0 ] && set -- --suite all --quick
python3 -m ort_flash.cli bench --device cuda --out "$OUT/bench-gpu.json" --budget-s "$left" \
  --cache-dir /tmp/ort_flash_bench "$@" 2>&1 | tee "$OUT/bench.log" | grep -v $'\r'
mkdir -p "$OUT/docs/performance" && cp "$OUT/bench-gpu.json" "$OUT/docs/performance/bench-gpu.json"
cpu_json=docs/performance/bench-cpu.json
python3 -m ort_flash.bench.report $( [ -f $cpu_json ] && echo $cpu_json ) "$OUT/bench-gpu.json" \
  -o "$OUT/docs/PERFORMANCE.md"
echo "== done in $(( $(date +%s) - start )) s"
