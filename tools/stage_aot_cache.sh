#!/usr/bin/env bash
# Packs this machine's compiled sm_90 cubins for the current kernel sources (from the AOT cache,
# ~/.cache/ort_flash/aot, filled by a local `ORT_FLASH_CUDA_ARCHS=90` build) into the git-ignored
# .aotcache/aot90.tgz, so the GPU machine's build (tools/gpu_session.sh, tools/bench_gpu.sh)
# skips the Triton compile. Carry .aotcache in a `run` call of its own (~37 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${ORT_FLASH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ort_flash}/aot
keys=$(python3 - <<'PY'
import os, sys
sys.path.insert(0, "aot")
import build, variants
cache = os.environ.get("CACHE")
for v in variants.all_variants():
    print(build.cache_key(v, 90, variants.get_fwd_config(90, v)))
PY
)
missing=0
for k in $keys; do [ -f "$cache/$k/kernel.cubin" ] || missing=$((missing + 1)); done
[ "$missing" -eq 0 ] || { echo "$missing sm_90 kernels are not in $cache: build with ORT_FLASH_CUDA_ARCHS=90 first"; exit 1; }
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.aotcache/' "$exclude" 2>/dev/null || echo '/.aotcache/' >>"$exclude"
mkdir -p .aotcache
(cd "$cache" && tar czf - $keys) > .aotcache/aot90.tgz
echo "packed $(echo $keys | wc -w) sm_90 kernels: .aotcache/aot90.tgz ($(du -h .aotcache/aot90.tgz | cut -f1))"
