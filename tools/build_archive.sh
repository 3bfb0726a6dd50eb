#!/usr/bin/env bash
# Build the C/C++ deployment archive: ort_flash-VERSION-linux_x86_64.tar.gz, for programs that
# use ONNX Runtime's C/C++ API and no Python. It holds the library (taken from the built wheel,
# or a libort_flash.so given), the CMake package (cmake/deploy/: find_package(ort_flash)), the
# ONNX Runtime headers the library was built on, examples/cpp, the demo model rewritten, and a
# README (cmake/deploy/README.md).
#
#   bash tools/build_archive.sh                       # from dist/ort_flash-*.whl, into dist/
#   bash tools/build_archive.sh path/libort_flash.so OUT_DIR
#
# The rewritten model is made by the checkout's rewriter with PYTHON (default python3, which needs
# ort_flash's dependencies and onnxruntime: the test venv has them), the library given registered.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v "${PYTHON:-python3}")
SOURCE=${1:-$(ls dist/ort_flash-*.whl 2>/dev/null | head -1)}
OUT=$(mkdir -p "${2:-dist}" && realpath "${2:-dist}")
[ -f "$SOURCE" ] || { echo "no wheel or library given, and no dist/ort_flash-*.whl (bash tools/build_wheel.sh)"; exit 1; }
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
NAME=ort_flash-$VERSION
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/$NAME
mkdir -p "$STAGE/lib/cmake/ort_flash" "$STAGE/include" "$STAGE/examples" "$STAGE/share/ort_flash"

case "$SOURCE" in
  *.whl) "$PY" -c "import sys, zipfile; open(sys.argv[2], 'wb').write(zipfile.ZipFile(sys.argv[1]).read('ort_flash/libort_flash.so'))" \
           "$SOURCE" "$STAGE/lib/libort_flash.so" ;;
  *) cp "$SOURCE" "$STAGE/lib/libort_flash.so" ;;
esac
chmod 755 "$STAGE/lib/libort_flash.so"

# The headers the build used (cmake/OrtHeaders.cmake's cache, or ORT_FLASH_ORT_ROOT's).
cache=${ORT_FLASH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ort_flash}
headers=""
for d in ${ORT_FLASH_ORT_ROOT:+"$ORT_FLASH_ORT_ROOT/include" "$ORT_FLASH_ORT_ROOT/include/onnxruntime"} "$cache/onnxruntime-headers-api29"; do
  [ -f "$d/onnxruntime_cxx_api.h" ] && { headers=$d; break; }
done
[ -n "$headers" ] || { echo "ONNX Runtime headers not found (build ort_flash once: it caches them in $cache)"; exit 1; }
cp -r "$headers" "$STAGE/include/onnxruntime"

cp cmake/deploy/ort_flashConfig.cmake "$STAGE/lib/cmake/ort_flash/"
sed "s/@VERSION@/$VERSION/" cmake/deploy/ort_flashConfigVersion.cmake.in > "$STAGE/lib/cmake/ort_flash/ort_flashConfigVersion.cmake"
sed "s/@VERSION@/$VERSION/" cmake/deploy/README.md > "$STAGE/README.md"
mkdir -p "$STAGE/examples/cpp"
cp examples/cpp/CMakeLists.txt examples/cpp/run_model.cc examples/cpp/README.md "$STAGE/examples/cpp/"

ORT_FLASH_LIBRARY="$STAGE/lib/libort_flash.so" "$PY" -m ort_flash.cli rewrite ort_flash/data/gpt2_tiny.onnx \
  -o "$STAGE/share/ort_flash/gpt2_tiny.flash.onnx" --require-fusion > "$WORK/rewrite.log" \
  || { cat "$WORK/rewrite.log"; exit 1; }

tar -C "$WORK" -czf "$OUT/$NAME-linux_x86_64.tar.gz" "$NAME"
ls -l "$OUT/$NAME-linux_x86_64.tar.gz"
