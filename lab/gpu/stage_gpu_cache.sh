#!/usr/bin/env bash
# Packs, into git-ignored folders (the Optimum fp16 exports too: .gpuoptimum/optimum-fp16.tgz) to carry in `run` calls (64 MiB a call, the tree included):
# - .gpucache/aot90.tgz (~40 MB; a call of its own with .orth): this machine's compiled sm_90
#   cubins for the current kernel sources (from the AOT cache, filled by a local
#   `ORT_FLASH_CUDA_ARCHS=90` build), so the GPU machine's build
#   (lab/gpu/gpu_session.sh, lab/gpu/bench_gpu.sh) skips the Triton compile;
# - .gpumodels/models-fp16.tgz (~18 MB; fits beside the last, smallest onnxruntime-gpu part,
#   .ortgpu4): the fp16 model-family exports of the model cache (python lab/models/coverage.py
#   or the CPU tests fill it), so the CUDA family tests verify exactly the files CI exported
#   (ORT_FLASH_MODEL_PREBUILT) instead of re-exporting with the GPU machine's torch.
set -euo pipefail
cd "$(dirname "$0")/../.."
cache=${ORT_FLASH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ort_flash}/aot
sm90_keys() {  # the sm_90 cache keys of the table that ORT_FLASH_GLUON_WS_ON=$1 builds
  ORT_FLASH_GLUON_WS_ON=$1 python3 - <<'PY'
from aot import build, variants
import os
grids = build.candidate_grids(os.environ.get("ORT_FLASH_GLUON_WS_ON", ""))
for v in variants.all_variants(grids):
    print(build.cache_key(v, 90, variants.get_fwd_config(90, v, grids)))
PY
}
keys=$(sm90_keys "")
missing=0
for k in $keys; do [ -f "$cache/$k/kernel.cubin" ] || missing=$((missing + 1)); done
[ "$missing" -eq 0 ] || { echo "$missing sm_90 kernels are not in $cache: build with ORT_FLASH_CUDA_ARCHS=90 first"; exit 1; }
# The candidate grids' own cubins (aot/tiles.py GLUON_WS_CANDIDATES), where a local build with
# ORT_FLASH_GLUON_WS_ON=<name> ORT_FLASH_CUDA_ARCHS=90 compiled them, so that the GPU machine's
# candidate builds (lab/gpu/gpu_release.sh try, ab) skip the compile too.
for name in $(python3 -c "from aot import variants; print(' '.join(variants.GLUON_WS_CANDIDATES))"); do
  extra=0 absent=0
  for k in $(sm90_keys "$name"); do
    case " $keys " in *" $k "*) continue ;; esac
    if [ -f "$cache/$k/kernel.cubin" ]; then keys="$keys $k"; extra=$((extra + 1)); else absent=$((absent + 1)); fi
  done
  echo "candidate $name: $extra cubins of its own packed, $absent not built here"
done
exclude=$(git rev-parse --git-path info/exclude)
for d in /.gpucache/ /.gpumodels/; do grep -qx "$d" "$exclude" 2>/dev/null || echo "$d" >>"$exclude"; done
mkdir -p .gpucache .gpumodels
(cd "$cache" && tar czf - $keys) > .gpucache/aot90.tgz
echo "packed $(echo $keys | wc -w) sm_90 kernels: .gpucache/aot90.tgz ($(du -h .gpucache/aot90.tgz | cut -f1))"
models=${ORT_FLASH_MODEL_CACHE:-$HOME/.cache/ort_flash/models}
if ls "$models"/*-fp16-*.* >/dev/null 2>&1; then
  (cd "$models" && tar czf - *-fp16-*.onnx *-fp16-*.failed 2>/dev/null) > .gpumodels/models-fp16.tgz
  echo "packed $(cd "$models" && ls *-fp16-* | wc -l) fp16 model exports: .gpumodels/models-fp16.tgz ($(du -h .gpumodels/models-fp16.tgz | cut -f1))"
fi
# The Optimum family's fp16 exports (folders), in a folder of their own: carried in a call of its own
# (they do not fit beside .ortgpu4), else their GPU tests skip (the GPU machine cannot export).
if ls -d "$models"/optimum-*-fp16-* >/dev/null 2>&1; then
  grep -qx "/.gpuoptimum/" "$exclude" 2>/dev/null || echo "/.gpuoptimum/" >>"$exclude"
  mkdir -p .gpuoptimum
  (cd "$models" && tar czf - optimum-*-fp16-*) > .gpuoptimum/optimum-fp16.tgz
  echo "packed the Optimum fp16 exports: .gpuoptimum/optimum-fp16.tgz ($(du -h .gpuoptimum/optimum-fp16.tgz | cut -f1))"
fi
