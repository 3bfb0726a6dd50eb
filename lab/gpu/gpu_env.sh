# Sourced by lab/gpu/gpu_session.sh, lab/gpu/gpu_release.sh and lab/gpu/bench_gpu.sh on the GPU machine,
# from the repository root: installs the carried onnxruntime-gpu (.ortgpu0-4, or the xz parts
# .ortgpux0-3 of lab/gpu/stage_ort_xz.sh) into /tmp/ortsite once (all parts must have arrived;
# before they have, only the direct-kernel tests can run),
# points the build at the carried ORT headers (.orth) and sm_90, and unpacks the optional
# .gpucache and .gpumodels, installs the optional .gpugenai wheel (lab/gpu/stage_gpu_cache.sh): compiled cubins, the model exports CI made.
if ! python3 -c "import sys; sys.path.insert(0, '/tmp/ortsite'); import onnxruntime as o; assert 'CUDAExecutionProvider' in o.get_available_providers()" 2>/dev/null; then
  # lab/gpu/stage_ort_xz.sh's four parts, carried in one call each: every call that sources this
  # file keeps its part in /tmp/ortgpux, and the call that completes the set unpacks them.
  for i in 0 1 2 3; do
    [ -f .ortgpux$i/part ] && mkdir -p /tmp/ortgpux && cp .ortgpux$i/part /tmp/ortgpux/part$i
  done
  if [ "$(ls /tmp/ortgpux/part? 2>/dev/null | wc -l)" -eq 4 ]; then
    mkdir -p /tmp/ortsite && cat /tmp/ortgpux/part0 /tmp/ortgpux/part1 /tmp/ortgpux/part2 /tmp/ortgpux/part3 \
      | xz -dc -T0 | tar xf - -C /tmp/ortsite || exit 1
  elif [ "$(ls .ortgpu?/part 2>/dev/null | wc -l)" -eq 5 ]; then
    w=/tmp/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl; cat .ortgpu?/part > $w && python3 -m pip install -q --no-index --no-deps --target /tmp/ortsite $w || exit 1
  else
    echo "gpu_env.sh: onnxruntime-gpu not staged (.ortgpu0-4 or .ortgpux0-3): ONNX Runtime CUDA tests will skip"
  fi
fi
# onnxruntime-genai-cuda (for the gqa/genai steps), carried as a wheel in .gpugenai/ when the
# machine lacks it (pip download --no-deps --python-version 3.12 onnxruntime-genai-cuda==0.18.0).
if ls .gpugenai/*.whl >/dev/null 2>&1 && [ ! -d /tmp/genaisite/onnxruntime_genai ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/genaisite .gpugenai/*.whl || exit 1
fi
export PYTHONPATH=/tmp/ortsite${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/genaisite ] && export PYTHONPATH=$PYTHONPATH:/tmp/genaisite
export ORT_FLASH_ORT_ROOT=$PWD/.orth ORT_FLASH_CUDA_ARCHS=${ORT_FLASH_CUDA_ARCHS:-90}
if [ -f .gpucache/aot90.tgz ]; then
  mkdir -p /tmp/ort_flash_cache/aot && tar xzf .gpucache/aot90.tgz -C /tmp/ort_flash_cache/aot
fi
[ -d /tmp/ort_flash_cache/aot ] && export ORT_FLASH_CACHE_DIR=/tmp/ort_flash_cache
for t in .gpumodels/models-fp16.tgz .gpuoptimum/optimum-fp16.tgz; do
  [ -f $t ] && mkdir -p /tmp/ort_flash_prebuilt && tar xzf $t -C /tmp/ort_flash_prebuilt
done
[ -d /tmp/ort_flash_prebuilt ] && export ORT_FLASH_MODEL_PREBUILT=/tmp/ort_flash_prebuilt
# The editable install of ort_flash with this machine's Python (the AOT build; log in $OUT/build.log).
build_ort_flash() {
  python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; return 1; }
}
