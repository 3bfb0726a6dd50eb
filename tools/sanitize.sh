#!/usr/bin/env bash
# CI job: the C++ custom-op library under AddressSanitizer + UndefinedBehaviorSanitizer.
#
# Builds libort_flash.so with -fsanitize=address,undefined in its own CMake build folder (the
# ONNX Runtime headers and the AOT kernel cache are found exactly as in the normal build, see
# cmake/OrtHeaders.cmake and cmake/AotKernels.cmake), then runs CPU op tests against it. The
# CPU tests need no cubins, so by default the kernel table is CPU-only (ORT_FLASH_CUDA_ARCHS
# empty: no Triton compile, the build takes about a minute); set ORT_FLASH_SANITIZE_ARCHS="80;90"
# to embed the cubins too (taken from the AOT cache when the kernel source is unchanged).
#   ORT_FLASH_LIBRARY  points ort_flash (ort_flash/_library.py) at the sanitized library;
#   LD_PRELOAD         loads libasan first (Python itself is not instrumented, and ASan must
#                      come before every other library of the process), then libstdc++: the
#                      python binary does not link it, and ASan's __cxa_throw interceptor
#                      finds the real one only if it is loaded when ASan starts (else ASan
#                      aborts with CHECK failed "real___cxa_throw" at the first C++ throw,
#                      which ONNX Runtime does internally);
#   ASAN_OPTIONS       detect_leaks=0: LeakSanitizer would report CPython's and ONNX Runtime's
#                      own process-lifetime allocations, none of them ours; every other ASan
#                      check (heap/stack/global overflow, use after free, double free) is on;
#   UBSAN_OPTIONS      halt_on_error=1: any undefined behaviour aborts the test process.
# A finding aborts the Python process: pytest then fails (crash = non-zero exit code).
#
#   bash tools/sanitize.sh                      # build + the default test set
#   bash tools/sanitize.sh tests/test_cpu_op.py # build + the tests named
# Env: PYTHON (default python3), ORT_FLASH_SANITIZE_BUILD (default build/sanitize), CXX,
#      ORT_FLASH_SANITIZE_ARCHS (default empty: CPU-only kernel table).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v "${PYTHON:-python3}")
"$PY" -c "import ml_dtypes, numpy, onnx, onnxruntime, pytest" 2>/dev/null || {
  echo "$PY cannot import what the tests need (ml_dtypes, numpy, onnx, onnxruntime, pytest):"
  echo "run this from the venv the README's test command sets up, or set PYTHON"; exit 1; }
BUILD=${ORT_FLASH_SANITIZE_BUILD:-build/sanitize}
SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -g"

echo "== configure $BUILD (ASan + UBSan)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DORT_FLASH_PYTHON_MODULE=OFF -DPython_EXECUTABLE="$PY" -DORT_FLASH_CUDA_ARCHS="${ORT_FLASH_SANITIZE_ARCHS:-}" \
  -DCMAKE_CXX_FLAGS="$SAN" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" > "$BUILD.configure.log" 2>&1 \
  || { tail -40 "$BUILD.configure.log"; exit 1; }
echo "== build"
cmake --build "$BUILD" --target ort_flash
LIB=$(realpath "$BUILD/cpp/libort_flash.so")
ASAN_LIB=$("${CXX:-g++}" -print-file-name=libasan.so)
STDCXX_LIB=$("${CXX:-g++}" -print-file-name=libstdc++.so.6)
[ -f "$ASAN_LIB" ] || { echo "libasan.so not found (install the compiler's ASan runtime)"; exit 1; }
n=$(nm -D --undefined-only "$LIB" | grep -c -E '__asan_report|__ubsan_handle' || true)
echo "== $LIB: $n ASan/UBSan entry points referenced"
[ "$n" -gt 0 ] || { echo "the library is not instrumented"; exit 1; }

export ORT_FLASH_LIBRARY="$LIB" LD_PRELOAD="$ASAN_LIB $STDCXX_LIB"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

echo "== the sanitized library is the one ONNX Runtime loads"
"$PY" - <<'EOF'
import os, sys
sys.path.insert(0, "tests")
import numpy as np
import ort_flash
from _onnx_models import flash_attention_model, run_model
feeds = {n: np.ones((1, 2, 3, 8), np.float32) for n in ("Q", "K", "V")}
run_model(flash_attention_model(feeds, {"Y": np.float32}), feeds, {"Y": ((1, 2, 3, 8), np.float32)},
          ["CPUExecutionProvider"])
maps = open("/proc/self/maps").read()
lib = os.environ["ORT_FLASH_LIBRARY"]
assert ort_flash.library_path() == lib and lib in maps, "ORT did not load the sanitized library"
assert "libasan" in maps, "libasan is not loaded"
print("ok:", lib)
EOF

echo "== tests"
if [ $# -eq 0 ]; then
  set -- tests/test_cpu_op.py tests/test_bad_input.py tests/test_reliability_numerics.py \
         tests/test_reliability_concurrency.py tests/test_reliability_properties.py \
         tests/test_reliability_determinism.py tests/test_gqa_op.py
fi
"$PY" -m pytest -q -p no:cacheprovider "$@"
