#!/usr/bin/env bash
# The release check on the GPU machine, in steps that each fit one 10-minute `run` call
# (the machine stays warm between back-to-back calls, so the build of step 1 is reused):
#
#   bash lab/gpu/gpu_release.sh kernels # build, the direct-kernel tests (no onnxruntime-gpu needed:
#                                     # the first call, carrying .gpucache and .orth, while the
#                                     # five onnxruntime-gpu parts follow in the next calls)
#   bash lab/gpu/gpu_release.sh tests   # build, `pytest -m gpu` (8 workers; the memory-growth test
#                                     # alone after), demo, decode benchmark (quick)
#   bash lab/gpu/gpu_release.sh op      # the op benchmark's whole grid (N 512 ... 16k, fp16 + bf16)
#   bash lab/gpu/gpu_release.sh bench   # end to end and the LLaMA-style decode step end to end
#                                     # (4 layers)
#   bash lab/gpu/gpu_release.sh extra   # compute-sanitizer side by side (lab/gpu/gpu_sanitize.sh,
#                                     # 7 pytest workers each): memcheck on the GPU suite,
#                                     # racecheck on the direct-kernel tests
#   bash lab/gpu/gpu_release.sh gqa     # GroupQueryAttention on CUDA: its GPU tests, then
#                                     # `bench --suite gqa` and `--suite genai` (carry .gpugenai;
#                                     # ORT_FLASH_GQA_CUDA=1 so that GENAI_MODEL's heads of any size
#                                     # are mapped), then lab/experiments/gqa_profile.py
#   bash lab/gpu/gpu_release.sh tune    # the tile sweeps: lab/experiments/tune.py --tma, lab/experiments/tune_decode.py
#   bash lab/gpu/gpu_release.sh gqa-bf16 # `bench --suite gqa --dtypes bfloat16` (after `gqa`: its build)
#   bash lab/gpu/gpu_release.sh new     # what no GPU has run yet: the FP8 GPU tests alone (under
#                                     # FP8_TEST_S), then tests/test_gqa_cuda.py, test_cuda_kernel.py
#                                     # and test_cuda_op.py (12 workers, under NEW_TEST_S)
#   bash lab/gpu/gpu_release.sh bounded # the key bound of batched first prompts (the Gluon kernels'
#                                     # has_seqlens): the Gluon direct-kernel cases (both switches,
#                                     # BOUNDED_TEST_S), the FP8 GPU tests, tests/test_gqa_cuda.py,
#                                     # its prompts again with the key mask (ORT_FLASH_KEY_BOUND=0)
#   bash lab/gpu/gpu_release.sh append  # the first prompt's K/V append inside the one-partition Gluon
#                                     # kernel, JIT (lab/experiments/gqa_append.py): checked against
#                                     # float32 and the prepare path, then timed (no build, no ORT needed)
#   bash lab/gpu/gpu_release.sh short   # the one-partition Gluon kernel's two-slot tiles at N 128-1024,
#                                     # JIT beside cuDNN (lab/experiments/gluon_attn.py --configs)
#   bash lab/gpu/gpu_release.sh gqa-prefill # `bench --suite gqa` fp16 (every prefill length, fewer
#                                     # decode shapes: GQA_CACHES, GQA_BATCHES; GQA_S) with
#                                     # the key bound, then the drop-in with the key mask (=0)
#   bash lab/gpu/gpu_release.sh gqa-variants # `bench --suite gqa --sinks` and `--window 4096` against
#                                     # ONNX Runtime's op (VARIANT_S each)
#   bash lab/gpu/gpu_release.sh families # every GenAI builder family built for CUDA, rewritten and
#                                     # checked teacher-forced (tests/test_genai_families_cuda.py,
#                                     # after a `part` carrying .gpugenai; under FAMILIES_S)
#   bash lab/gpu/gpu_release.sh fp8     # the FP8 prefill path: its GPU tests (alone first, under a
#                                     # timeout of their own), the kernels against cuDNN
#                                     # (lab/experiments/fp8_kernel_bench.py), then the op suite's FP8
#                                     # column beside ort_flash, ORT MultiHeadAttention and cuDNN
#                                     # (N 2k-16k, fp16; FP8_OP_S)
#   bash lab/gpu/gpu_release.sh ab      # a candidate grid against the shipped table through ONNX
#                                     # Runtime: lab/experiments/ab_grids.py (two non-editable builds, the op
#                                     # suite's AB_ARGS rows ROUNDS times each, alternating; the
#                                     # editable install is removed first and rebuilt after)
#   bash lab/gpu/gpu_release.sh try     # candidate kernel grids: the sm_90 build with
#                                     # ORT_FLASH_GLUON_WS_ON (e.g. d128-persistent) in the
#                                     # background while lab/experiments/gluon_attn.py checks and times
#                                     # the JIT specs in WS_SPECS (JIT_ARGS: more of its flags), then
#                                     # the launch-argument and direct-kernel tests on that build
#                                     # (carrying .orth)
#
# Carried (git-ignored): .ortgpu0-4, .orth, optionally .gpucache and .gpumodels (with .ortgpu4).
# Everything lands in $OUT: logs, bench-{decode,op-full,e2e,decode_e2e}.json, tune-tma.json,
# tune-decode.json.
# Set ORT_FLASH_BENCH_COMMIT to the commit under test (the copy on the machine has no history).
# Budgets (seconds) per part: DECODE_S, OP_S, E2E_S, DECODE_E2E_S, MEMCHECK_S, RACECHECK_S, TUNE_S,
# JIT_S (try: the JIT checks and timings, cut there should a kernel hang).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/ortsite${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/genaisite ] && export PYTHONPATH=$PYTHONPATH:/tmp/genaisite
wait_build() {  # the background build of `start`, at most BUILD_WAIT_S (default 300) seconds
  [ -f /tmp/bg/build.out ] || { echo "no build started on this machine: run \`start\` first"; return 1; }
  local t=0
  while [ ! -f /tmp/bg/build.rc ]; do
    sleep 2; t=$((t + 2))
    [ "$t" -lt "${BUILD_WAIT_S:-300}" ] || { echo "the build is still running after $t s"; return 1; }
  done
}
built() {  # the background build of `start` waited for and, where it failed, run again here (a call
  # that re-copies the tree while it compiles can remove a file under it); needs gpu_env.sh
  wait_build || return 1
  if [ "$(cat /tmp/bg/build.rc)" != 0 ]; then
    echo "the background build failed: building again"
    OUT=/tmp/bg build_ort_flash && echo 0 > /tmp/bg/build.rc
  fi
}
bench() {  # ort-flash bench with its progress bars left out of the log
  python3 -m ort_flash.cli bench --device cuda --cache-dir /tmp/ort_flash_bench "$@" 2>&1 | grep -v $'\r'
}
case "${1:-}" in
  kernels)
    . lab/gpu/gpu_env.sh
    build_ort_flash || exit 1
    python3 -m ort_flash.cli info 2>&1 | tail -4
    python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=300 tests/test_cuda_kernel.py 2>&1 \
      | tee "$OUT/pytest-kernels.log" | grep -v "^\." | tail -15
    ;;
  tests)
    PYTEST_WORKERS=${PYTEST_WORKERS:-8} GPU_TEST_TIMEOUT=300 bash lab/gpu/gpu_session.sh \
      "python3 -m ort_flash.cli bench --device cuda --cache-dir /tmp/ort_flash_bench --suite decode --quick --budget-s ${DECODE_S:-70} --out $OUT/bench-decode.json 2>&1 | grep -v \$'\\r' | tail -25"
    ;;
  bench)
    # e2e: 163 s for three variants in the last run; ort_flash_opt adds one more ORT optimizer run
    # and rewrite per model (12 + 3 s, 15 + 3 s and 66 + 8 s then for bert, gpt2 and llama) and its timings;
    # 280 + 170 s (+ 45 s grace each) keeps this step inside one 10-minute call
    bench --suite e2e --quick --e2e-layers 4 --budget-s "${E2E_S:-280}" --out "$OUT/bench-e2e.json" | tail -30
    bench --suite decode_e2e --quick --e2e-layers 4 --budget-s "${DECODE_E2E_S:-170}" \
      --out "$OUT/bench-decode_e2e.json" | tail -16
    ;;
  op)
    bench --suite op --dtypes float16 bfloat16 --budget-s "${OP_S:-530}" --out "$OUT/bench-op-full.json" | tail -60
    ;;
  extra)
    # The build from `tests` is reused (the machine stayed warm); memcheck over the GPU suite but
    # the 10 000-run and >2^31-element tests, and at the same time racecheck over the
    # direct-kernel tests (the sanitizers are mostly host-bound: together they fit one call).
    . lab/gpu/gpu_env.sh
    TOOLS=memcheck timeout "${MEMCHECK_S:-540}" bash lab/gpu/gpu_sanitize.sh -m gpu tests \
      -k "not 10000_runs and not past_2_31" -n "${SANITIZE_WORKERS:-7}" --dist load > "$OUT/memcheck.txt" 2>&1 &
    TOOLS=racecheck timeout "${RACECHECK_S:-540}" bash lab/gpu/gpu_sanitize.sh -m gpu \
      tests/test_cuda_kernel.py -k "not past_2_31" -n "${SANITIZE_WORKERS:-7}" --dist load > "$OUT/racecheck.txt" 2>&1 &
    wait
    tail -12 "$OUT/memcheck.txt"; tail -8 "$OUT/racecheck.txt"
    ;;
  tune)
    timeout "${TUNE_S:-400}" python3 lab/experiments/tune.py --tma --dtypes fp16 --out "$OUT/tune-tma.json" 2>&1 \
      | grep -v "^  skip" | tail -10
    timeout "${TUNE_S:-100}" python3 lab/experiments/tune_decode.py --out "$OUT/tune-decode.json" 2>&1 | grep -v "^  skip" | tail -6
    ;;
  try)
    . lab/gpu/gpu_env.sh
    echo "== ORT_FLASH_GLUON_WS_ON=${ORT_FLASH_GLUON_WS_ON:-}"
    build_ort_flash & build=$!
    if [ -n "${WS_SPECS:-}" ]; then
      # Checks first (odd shapes, NaN-poisoned outputs, the dynamic counter back at zero), then the grid.
      timeout "${JIT_S:-330}" python3 lab/experiments/gluon_attn.py --runtime-ints --no-triton --ws "$WS_SPECS" \
        ${JIT_ARGS:-} --out "$OUT/try-jit.json" 2>&1 | tee "$OUT/try-jit.log" | grep -E "FAIL|checks:|gluon/best" | tail -60
      echo "== JIT exit ${PIPESTATUS[0]} (124: cut at JIT_S)"
    fi
    wait "$build" || exit 1
    python3 -m ort_flash.cli info 2>&1 | tail -4
    # The launch arguments of that build's kernels (dynamic tile counters included) over the fake
    # driver first: a second, no GPU time.
    python3 -m pytest -q -p no:cacheprovider tests/test_launch_abi.py 2>&1 | tail -3
    python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=120 tests/test_cuda_kernel.py -n 8 2>&1 \
      | tee "$OUT/pytest-kernels.log" | grep -v "^\." | tail -15
    ;;
  gqa)
    . lab/gpu/gpu_env.sh
    timeout "${GQA_TEST_S:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=120 -n 8 \
      tests/test_gqa_cuda.py 2>&1 | tee "$OUT/pytest-gqa.log" | grep -v "^\." | tail -25
    bench --suite gqa --budget-s "${GQA_S:-200}" --out "$OUT/bench-gqa.json" | tail -40
    ORT_FLASH_GQA_CUDA=1 bench --suite genai --budget-s "${GENAI_S:-150}" ${GENAI_MODEL:+--genai-model $GENAI_MODEL} \
      --out "$OUT/bench-genai.json" | tail -25
    timeout "${PROFILE_S:-90}" python3 lab/experiments/gqa_profile.py --runs 10 --out "$OUT/gqa-profile.json" 2>&1 \
      | grep -E "^d|gqa_|flash|UnpackRoPE|cudnn" | cut -c1-100
    ;;
  ab)
    . lab/gpu/gpu_env.sh
    python3 -m pip uninstall -q -y ort-flash 2>/dev/null
    # shellcheck disable=SC2086 # AB_ARGS is a list of bench arguments
    timeout "${AB_S:-540}" python3 lab/experiments/ab_grids.py --candidate "${AB_CANDIDATE:-d128-causal-tile-8192}" \
      --suite "${AB_SUITE:-op}" --rounds "${ROUNDS:-2}" --out "$OUT/ab-grids.json" -- \
      ${AB_ARGS:---head-dims 128 --seqlens 2048 4096 8192 16384 --dtypes float16 bfloat16} 2>&1 | tail -40
    build_ort_flash  # the editable install back, for the steps after (op, gqa, ... run from the tree)
    ;;
  fp8)
    . lab/gpu/gpu_env.sh
    timeout "${FP8_TEST_S:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=120 -n 4 \
      tests/test_cuda_op.py -k fp8 2>&1 | tee "$OUT/pytest-fp8.log" | grep -v "^\." | tail -15
    timeout "${FP8_BENCH_S:-300}" python3 lab/experiments/fp8_kernel_bench.py --json "$OUT/fp8-kernel.json" 2>&1 | tail -30
    bench --suite op --dtypes float16 --seqlens 2048 4096 8192 16384 \
      --peers ort_flash ort_flash_fp8 ort_mha sdpa_cudnn --budget-s "${FP8_OP_S:-200}" --out "$OUT/bench-op-fp8.json" | tail -24
    ;;
  new)
    # What no GPU has run yet, first and under timeouts of its own: the FP8 path's GPU tests alone,
    # then GroupQueryAttention on CUDA (attention sinks, the one-row first prompt, the windowed
    # cache) with the direct-kernel and op files beside it.
    . lab/gpu/gpu_env.sh
    built || exit 1
    timeout "${FP8_TEST_S:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=120 -n 4 \
      tests/test_cuda_op.py -k fp8 2>&1 | tee "$OUT/pytest-fp8.log" | grep -v "^\." | tail -12
    timeout "${NEW_TEST_S:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=120 -n 12 \
      tests/test_gqa_cuda.py tests/test_cuda_kernel.py tests/test_cuda_op.py -k "not fp8" 2>&1 \
      | tee "$OUT/pytest-new.log" | grep -v "^\." | tail -25
    ;;
  bounded)
    . lab/gpu/gpu_env.sh
    built || exit 1
    timeout "${BOUNDED_TEST_S:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=230 -n 3 \
      tests/test_cuda_kernel.py -k "gluon or key_bound" 2>&1 | tee "$OUT/pytest-bounded.log" | grep -v "^\." | tail -12
    timeout "${FP8_TEST_S:-100}" python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=90 -n 4 \
      tests/test_cuda_op.py -k fp8 2>&1 | tee "$OUT/pytest-fp8.log" | grep -v "^\." | tail -6
    timeout "${GQA_TEST_S:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=120 -n 12 \
      tests/test_gqa_cuda.py 2>&1 | tee "$OUT/pytest-gqa.log" | grep -v "^\." | tail -15
    ORT_FLASH_KEY_BOUND=0 timeout "${GQA_TEST_S:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=120 \
      -n 12 tests/test_gqa_cuda.py -k "prompt or sink" 2>&1 | tee "$OUT/pytest-gqa-mask.log" | grep -v "^\." | tail -15
    ;;
  rotary)
    # Q's rotary applied by the Gluon kernels as they load Q (the default): the direct-kernel cases
    # (ROTARY_CASES and the Gluon cases), then the GroupQueryAttention GPU tests with it and, for the
    # prompts, without it (ORT_FLASH_ROTARY_ON_LOAD=0: the rotated copy of Q).
    . lab/gpu/gpu_env.sh
    built || exit 1
    timeout "${ROTARY_TEST_S:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=230 -n 3 \
      tests/test_cuda_kernel.py -k "rotary or gluon_kernel_matches" 2>&1 | tee "$OUT/pytest-rotary.log" \
      | grep -v "^\." | tail -12
    ORT_FLASH_ROTARY_ON_LOAD=1 timeout "${GQA_TEST_S:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider \
      --timeout=120 -n 12 tests/test_gqa_cuda.py 2>&1 | tee "$OUT/pytest-gqa.log" | grep -v "^\." | tail -15
    ORT_FLASH_ROTARY_ON_LOAD=0 timeout "${GQA_TEST_S:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider \
      --timeout=120 -n 12 tests/test_gqa_cuda.py -k "prompt" 2>&1 | tee "$OUT/pytest-gqa-copy.log" | grep -v "^\." | tail -8
    ;;
  gqa-rotary)
    # Every prefill length with Q's rotary on load (the default), then the drop-in again with the
    # rotated copy (ORT_FLASH_ROTARY_ON_LOAD=0).
    ORT_FLASH_ROTARY_ON_LOAD=1 bench --suite gqa --caches 4096 --batches 1 --budget-s "${GQA_S:-200}" \
      --out "$OUT/bench-gqa-rotary.json" | tail -30
    ORT_FLASH_ROTARY_ON_LOAD=0 bench --suite gqa --caches 4096 --batches 1 --peers ort_flash --budget-s "${GQA_COPY_S:-100}" \
      --out "$OUT/bench-gqa-copy.json" | tail -20
    ;;
  rotary-quick)
    # The short form of `rotary` and `gqa-rotary` for a machine lent for minutes: ROTARY_CASES, the
    # GQA prompts with Q's rotary on load, the gqa suite's prefill lengths both ways.
    . lab/gpu/gpu_env.sh
    built || exit 1
    timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=140 tests/test_cuda_kernel.py \
      -k rotary_matches 2>&1 | tee "$OUT/pytest-rotary.log" | grep -v "^\." | tail -4
    ORT_FLASH_ROTARY_ON_LOAD=1 timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=100 -n 12 \
      tests/test_gqa_cuda.py -k prompt 2>&1 | tee "$OUT/pytest-gqa.log" | grep -v "^\." | tail -4
    ORT_FLASH_ROTARY_ON_LOAD=1 bench --suite gqa --caches 4096 --batches 1 --peers ort_flash ort_gqa ort_flash_fa \
      --budget-s 60 --out "$OUT/bench-gqa-rotary.json" | tail -16
    ORT_FLASH_ROTARY_ON_LOAD=0 bench --suite gqa --caches 4096 --batches 1 --peers ort_flash --budget-s 40 \
      --out "$OUT/bench-gqa-copy.json" \
      | tail -14
    ;;
  window-shift)
    # A decode step past a window-sized cache's capacity over present (the default) and over a stage
    # (ORT_FLASH_WINDOW_SHIFT=0): the windowed GQA GPU tests both ways, then the window's decode both
    # ways, fp16 and bf16 (SHIFT_S, STAGED_S).
    . lab/gpu/gpu_env.sh
    built || exit 1
    for shift in 1 0; do
      ORT_FLASH_WINDOW_SHIFT=$shift timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=140 -n 12 \
        tests/test_gqa_cuda.py -k windowed 2>&1 | tee "$OUT/pytest-window-shift$shift.log" | grep -v "^\." | tail -4
    done
    for dt in float16 bfloat16; do
      ORT_FLASH_WINDOW_SHIFT=1 bench --suite gqa --window 4096 --seqlens 512 --caches 32768 --batches 1 8 \
        --dtypes $dt --budget-s "${SHIFT_S:-60}" --out "$OUT/bench-gqa-window-shift-$dt.json" | tail -14
      ORT_FLASH_WINDOW_SHIFT=0 bench --suite gqa --window 4096 --seqlens 512 --caches 32768 --batches 1 8 \
        --peers ort_flash --dtypes $dt --budget-s "${STAGED_S:-40}" --out "$OUT/bench-gqa-window-staged-$dt.json" | tail -10
    done
    ;;
  append)
    # The first prompt's K/V append inside the one-partition Gluon kernel (lab/experiments/gqa_append.py,
    # JIT: needs neither the build nor onnxruntime-gpu), at the shipped tiles and at two-slot tiles of
    # more CTAs an SM (APPEND_TILES): its checks alone first (fp16 and bf16), under a timeout of their
    # own (APPEND_CHECK_S), then the fp16 timings against the op's prepare-then-attention path (APPEND_S).
    # shellcheck disable=SC2086 # APPEND_TILES: a list
    timeout "${APPEND_CHECK_S:-180}" python3 lab/experiments/gqa_append.py --check-only \
      --tiles ${APPEND_TILES:-128:64,32,2,4 64:64,64,2,4} --out "$OUT/gqa-append-check.json" 2>&1 | tail -8 || exit 1
    # shellcheck disable=SC2086
    timeout "${APPEND_S:-260}" python3 lab/experiments/gqa_append.py --no-check --d 64 128 --seqlens 128 512 1024 2048 \
      --dtypes fp16 --tiles ${APPEND_TILES:-128:64,32,2,4 64:64,64,2,4} --out "$OUT/gqa-append.json" 2>&1 | tail -34
    # Batch 1 (a first prompt's time to first token), CUDA graph replays.
    # shellcheck disable=SC2086
    timeout "${APPEND_B1_S:-120}" python3 lab/experiments/gqa_append.py --no-check --d 64 128 --seqlens 128 512 --batch 1 \
      --graph \
      --dtypes fp16 --tiles ${APPEND_TILES:-128:64,32,2,4 64:64,64,2,4} --out "$OUT/gqa-append-b1.json" 2>&1 | tail -12
    ;;
  short)
    # The one-partition Gluon kernel at short lengths with two-slot rings (more CTAs an SM), JIT beside
    # cuDNN (lab/experiments/gluon_attn.py --configs: checked against fp32 first, NaN-poisoned), N 128-1024,
    # causal and not, fp16 (SHORT_CONFIGS, SHORT_S); with the warp-specialized tile d128 non-causal
    # ships at these lengths (two query tiles a CTA), its peer there.
    timeout "${SHORT_S:-360}" python3 lab/experiments/gluon_attn.py --runtime-ints --no-triton --dtypes fp16 \
      --head-dims 64,128 --seqs 128,256,512,1024 \
      --configs "${SHORT_CONFIGS:-128:64,32,2,4;128:64,64,2,4;64:64,64,2,4;64:64,32,2,4}" \
      --ws "128:128,128,2,1,168,2,240,2" --out "$OUT/gluon-short.json" 2>&1 | grep -v "^check" | tail -20
    ;;
  gqa-prefill)
    # Every prefill length with the key bound (the default; decode shapes GQA_CACHES x GQA_BATCHES),
    # then the drop-in and the plain op again with the key mask (ORT_FLASH_KEY_BOUND=0).
    # shellcheck disable=SC2086 # GQA_CACHES, GQA_BATCHES: lists
    bench --suite gqa --caches ${GQA_CACHES:-4096 32768} --batches ${GQA_BATCHES:-1 8} \
      --budget-s "${GQA_S:-200}" --out "$OUT/bench-gqa-bound.json" | tail -45
    ORT_FLASH_KEY_BOUND=0 bench --suite gqa --caches 4096 --batches 1 --peers ort_flash ort_flash_fa \
      --budget-s "${GQA_MASK_S:-100}" --out "$OUT/bench-gqa-mask.json" | tail -20
    ;;
  gqa-variants)
    bench --suite gqa --sinks --seqlens 512 2048 16384 --caches 4096 32768 --batches 1 8 \
      --budget-s "${VARIANT_S:-120}" --out "$OUT/bench-gqa-sinks.json" | tail -22
    bench --suite gqa --window 4096 --seqlens 512 4096 16384 --caches 4096 32768 --batches 1 8 \
      --budget-s "${VARIANT_S:-120}" --out "$OUT/bench-gqa-window.json" | tail -22
    ;;
  gqa-bf16)
    # bfloat16 GroupQueryAttention against ONNX Runtime's (the rewriter maps bfloat16 nodes only
    # with ORT_FLASH_GQA_CUDA=1 until this is measured ahead).
    bench --suite gqa --dtypes bfloat16 --budget-s "${GQA_S:-200}" --out "$OUT/bench-gqa-bf16.json" | tail -40
    ;;
  start)
    # The first call of a session (carrying .orth and .gpucache): the sm_90 build in the background,
    # started with setsid so that it outlives this call while the next calls carry the
    # onnxruntime-gpu parts and the GenAI wheel (`part`). Log and exit status in /tmp/bg/.
    mkdir -p /tmp/bg
    setsid bash -c '. lab/gpu/gpu_env.sh; OUT=/tmp/bg build_ort_flash; echo $? > /tmp/bg/build.rc' \
      > /tmp/bg/build.out 2>&1 < /dev/null &
    echo "build started in the background (/tmp/bg)"
    ;;
  part)
    # One carried part (an .ortgpux part or .gpugenai): gpu_env.sh keeps it and unpacks a full set.
    . lab/gpu/gpu_env.sh
    ls /tmp/ortgpux 2>/dev/null | tr '\n' ' '; [ -d /tmp/genaisite ] && echo "genai installed"
    if [ -f /tmp/bg/build.rc ]; then echo "build exit $(cat /tmp/bg/build.rc)"
    elif [ -f /tmp/bg/build.out ]; then echo "build running"
    else echo "no build started on this machine (a fresh one? run \`start\` with .orth first)"; fi
    ;;
  genai-models)
    # After the last part: the background build of `start` checked (a call that re-copies the tree
    # while it compiles can remove a file under it; then it is built again here), and GenAI's
    # builder for the fidelity grid's models (genai_fidelity.grid) started, one background process
    # per model (fp16 then bf16), while the next call runs tests. Logs in /tmp/bg/.
    . lab/gpu/gpu_env.sh
    built || exit 1
    for i in 0 1; do
      setsid python3 -c "import pathlib, sys; from ort_flash.bench import genai_fidelity as f
g = f.grid('cuda', False)
f.prepare(g, 'cuda', pathlib.Path('/tmp/ort_flash_bench/genai'), [g['models'][$i]])" \
        > /tmp/bg/models$i.out 2>&1 < /dev/null &
    done
    echo "GenAI builder started for the fidelity models"
    ;;
  families)
    # Every GenAI builder family built for CUDA (fp16), rewritten with every node mapped and
    # checked teacher-forced against the original (tests/test_genai_families_cuda.py; carry
    # .gpugenai first), and the GPU tests of test_genai_fidelity.py.
    . lab/gpu/gpu_env.sh
    built || exit 1
    timeout "${FAMILIES_S:-540}" python3 -m pytest -m gpu -q -p no:cacheprovider --timeout=300 -n 8 \
      tests/test_genai_families_cuda.py tests/test_genai_fidelity.py 2>&1 | tee "$OUT/pytest-families.log" \
      | grep -v "^\." | tail -30
    ;;
  fidelity)
    # Teacher-forced logits of the original and the rewritten GenAI folders, step by step
    # (bench --suite genai_fidelity: both head sizes, fp16 and bf16, batch 1 and 2; models from
    # genai-models, waited for here).
    . lab/gpu/gpu_env.sh
    for i in 0 1; do
      while pgrep -f "f.prepare" > /dev/null; do sleep 2; done
      tail -2 /tmp/bg/models$i.out 2>/dev/null
    done
    bench --suite genai_fidelity --budget-s "${FIDELITY_S:-500}" ${FIDELITY_ARGS:-} \
      --out "$OUT/bench-genai-fidelity.json" | tail -50
    ;;
  *) echo "usage: $0 kernels|tests|bench|op|extra|tune|try|gqa|gqa-bf16|new|bounded|rotary|rotary-quick|window-shift|gqa-rotary|gqa-prefill|gqa-variants|fp8|ab|start|part|genai-models|families|fidelity"; exit 2 ;;
esac
