# Runs aot/build.py (Triton, no GPU needed) to compile the FlashAttention cubins for
# ORT_FLASH_CUDA_ARCHS and generate the kernel table. Compiled kernels are cached by
# (kernel source, Triton version, variant, tile, arch) in ORT_FLASH_CACHE_DIR/aot.

set(ORT_FLASH_AOT_DIR "${CMAKE_BINARY_DIR}/aot")
string(REPLACE ";" "," _archs "${ORT_FLASH_CUDA_ARCHS}")
if(_archs STREQUAL "")
  message(WARNING "ort_flash: ORT_FLASH_CUDA_ARCHS is empty: a CPU-only build, no CUDA kernels are compiled (the op runs on ONNX Runtime's CPU EP only; the CUDA EP reports that no kernels were compiled)")
endif()
set(_aot_sources
  "${PROJECT_SOURCE_DIR}/aot/build.py"
  "${PROJECT_SOURCE_DIR}/aot/compile_pool.py"
  "${PROJECT_SOURCE_DIR}/aot/flash_decode.py"
  "${PROJECT_SOURCE_DIR}/aot/flash_fwd.py"
  "${PROJECT_SOURCE_DIR}/aot/flash_fwd_gluon.py"
  "${PROJECT_SOURCE_DIR}/aot/variants.py")
add_custom_command(
  OUTPUT "${ORT_FLASH_AOT_DIR}/kernels.gen.S" "${ORT_FLASH_AOT_DIR}/kernel_table.gen.cc"
         "${ORT_FLASH_AOT_DIR}/manifest.json"
  COMMAND "${Python_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/aot/build.py" --archs "${_archs}"
          --out "${ORT_FLASH_AOT_DIR}" --cache "${ORT_FLASH_CACHE_DIR}/aot"
  DEPENDS ${_aot_sources}
  COMMENT "AOT-compiling FlashAttention kernels with Triton for sm ${ORT_FLASH_CUDA_ARCHS}"
  # Ninja's console pool: the per-kernel progress lines reach the log as they are printed, not
  # all at once when the minutes-long step ends.
  USES_TERMINAL
  VERBATIM)
add_custom_target(ort_flash_aot DEPENDS "${ORT_FLASH_AOT_DIR}/kernels.gen.S"
                                        "${ORT_FLASH_AOT_DIR}/kernel_table.gen.cc")
