# Runs the aot package's build (`python -m aot.build`: Triton, no GPU needed) to compile the FlashAttention cubins for
# ORT_FLASH_CUDA_ARCHS and generate the kernel table. Compiled kernels are cached by
# (kernel source, Triton version, variant, tile, arch) in ORT_FLASH_CACHE_DIR/aot.

set(ORT_FLASH_AOT_DIR "${CMAKE_BINARY_DIR}/aot")
# The kernels' contract with the launcher (aot/contract.py: codes, argument layouts, constants)
# as C++, for every build (a CPU-only one too): cpp/ includes it, so it is generated first. Plain
# Python, no Triton and no kernel compile.
add_custom_command(
  OUTPUT "${ORT_FLASH_AOT_DIR}/contract.gen.h"
  COMMAND "${Python_EXECUTABLE}" -m aot.contract_header --out "${ORT_FLASH_AOT_DIR}"
  WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
  DEPENDS "${PROJECT_SOURCE_DIR}/aot/contract.py" "${PROJECT_SOURCE_DIR}/aot/contract_header.py"
  COMMENT "Generating the kernels' contract header from aot/contract.py"
  VERBATIM)
add_custom_target(ort_flash_contract DEPENDS "${ORT_FLASH_AOT_DIR}/contract.gen.h")
string(REPLACE ";" "," _archs "${ORT_FLASH_CUDA_ARCHS}")
if(_archs STREQUAL "")
  message(WARNING "ort_flash: ORT_FLASH_CUDA_ARCHS is empty: a CPU-only build, no CUDA kernels are compiled (the op runs on ONNX Runtime's CPU EP only; the CUDA EP reports that no kernels were compiled)")
endif()
# Every kernel source and build script: a change to any reruns the step (the cache keeps the
# kernels that did not change).
file(GLOB_RECURSE _aot_sources CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/aot/*.py")
# aot/build.py reads ORT_FLASH_GLUON_WS_ON (candidate grids of a development build): another value
# makes another table, so the value is a dependency too (file(CONFIGURE) rewrites it only when
# it changes).
file(CONFIGURE OUTPUT "${ORT_FLASH_AOT_DIR}/gluon_ws_on.txt" CONTENT "$ENV{ORT_FLASH_GLUON_WS_ON}\n")
list(APPEND _aot_sources "${ORT_FLASH_AOT_DIR}/gluon_ws_on.txt")
add_custom_command(
  OUTPUT "${ORT_FLASH_AOT_DIR}/kernels.gen.S" "${ORT_FLASH_AOT_DIR}/kernel_table.gen.cc"
         "${ORT_FLASH_AOT_DIR}/manifest.json"
  COMMAND "${Python_EXECUTABLE}" -m aot.build --archs "${_archs}"
          --out "${ORT_FLASH_AOT_DIR}" --cache "${ORT_FLASH_CACHE_DIR}/aot"
  WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
  DEPENDS ${_aot_sources}
  COMMENT "AOT-compiling FlashAttention kernels with Triton for sm ${ORT_FLASH_CUDA_ARCHS}"
  # Ninja's console pool: the per-kernel progress lines reach the log as they are printed, not
  # all at once when the minutes-long step ends.
  USES_TERMINAL
  VERBATIM)
add_custom_target(ort_flash_aot DEPENDS "${ORT_FLASH_AOT_DIR}/kernels.gen.S"
                                        "${ORT_FLASH_AOT_DIR}/kernel_table.gen.cc")
