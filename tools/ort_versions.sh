#!/usr/bin/env bash
# CI: the built wheel under every supported ONNX Runtime. For the oldest supported release
# (ORT_FLASH_ORT_OLDEST, pyproject.toml's floor) and the newest the package index offers, each in
# its own fresh venv: the wheel, that `onnxruntime` (the CPU package) and pytest, then the CPU op
# suite (ORT_FLASH_ORT_TESTS) run against the installed wheel, from outside the checkout. Then the
# release before the floor (ORT_FLASH_ORT_TOO_OLD) replaces it in the oldest venv and must be
# refused at registration with the message that names the version needed.
#
#   bash tools/ort_versions.sh dist/ort_flash-*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
WHEEL=$(realpath "${1:?usage: tools/ort_versions.sh WHEEL}")
PY=$(command -v "${PYTHON:-python3}")
OLDEST=${ORT_FLASH_ORT_OLDEST:-1.29.0}
TOO_OLD=${ORT_FLASH_ORT_TOO_OLD:-1.28.0}
read -r -a TESTS <<< "${ORT_FLASH_ORT_TESTS:-tests/test_cpu_op.py tests/test_gqa_op.py tests/test_op_contract.py}"
REPO=$PWD
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

suite() {  # $1: a name for the venv, $2: the onnxruntime requirement
  local v="$WORK/$1" t=$SECONDS
  "$PY" -m venv "$v"
  "$v/bin/pip" install -q "$WHEEL" "$2" pytest
  local where
  where=$(cd "$WORK" && "$v/bin/python" -c "import onnxruntime, ort_flash; print(onnxruntime.__version__, ort_flash.__file__)")
  case "$where" in "$v"/*|*" $v/"*) ;; *) echo "ort_flash is not the installed wheel: $where"; exit 1 ;; esac
  echo "== onnxruntime ${where%% *} ($2): ${TESTS[*]}"
  (cd "$WORK" && "$v/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$REPO" "${TESTS[@]/#/$REPO/}")
  echo "== onnxruntime ${where%% *}: passed in $((SECONDS - t)) s (venv, install and tests)"
}

suite oldest "onnxruntime==$OLDEST"
suite newest "onnxruntime"

v=$WORK/oldest
"$v/bin/pip" install -q "onnxruntime==$TOO_OLD"
if out=$(cd "$WORK" && "$v/bin/python" -c "import ort_flash; ort_flash.session_options()" 2>&1); then
  echo "== onnxruntime $TOO_OLD: the library registered; it must be refused"; exit 1
fi
echo "$out" | tail -1
if ! grep -q "ort_flash needs ONNX Runtime API version .* this runtime is $TOO_OLD: upgrade it" <<< "$out"; then
  echo "== onnxruntime $TOO_OLD: refused, but not with ort_flash's message"; exit 1
fi
echo "== onnxruntime $TOO_OLD: refused at registration, with the version needed"
