# ort_flash: the ONNX Runtime custom-op library of the C/C++ deployment archive.
#
#   find_package(ort_flash 0.1 CONFIG REQUIRED)   # CMAKE_PREFIX_PATH=ARCHIVE, or ort_flash_DIR
#
# gives
#   ort_flash_LIBRARY            full path of libort_flash.so, to load:
#                                Ort::SessionOptions::RegisterCustomOpsLibrary(ort_flash_LIBRARY)
#                                (C: RegisterCustomOpsLibrary_V2), before creating the session
#   ort_flash::ort_flash         the same file as an imported shared library, to link instead
#   ort_flash_ORT_INCLUDE_DIR    the ONNX Runtime C/C++ headers it was built on (API 29)
#   ort_flash_ORT_MIN_VERSION    the oldest ONNX Runtime that registers it (1.29.0)
# It needs glibc 2.34+ on x86-64; it loads libcuda.so.1 at run time where there is a GPU and
# takes ONNX Runtime from the process that loads it (CPU and CUDA execution providers).
get_filename_component(_ort_flash_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(ort_flash_LIBRARY "${_ort_flash_prefix}/lib/libort_flash.so")
set(ort_flash_ORT_INCLUDE_DIR "${_ort_flash_prefix}/include/onnxruntime")
set(ort_flash_ORT_MIN_VERSION "1.29.0")
if(NOT EXISTS "${ort_flash_LIBRARY}")
  set(ort_flash_FOUND FALSE)
  set(ort_flash_NOT_FOUND_MESSAGE "${ort_flash_LIBRARY} is missing: unpack the whole archive")
  return()
endif()
if(NOT TARGET ort_flash::ort_flash)
  add_library(ort_flash::ort_flash SHARED IMPORTED)
  set_target_properties(ort_flash::ort_flash PROPERTIES
    IMPORTED_LOCATION "${ort_flash_LIBRARY}"
    IMPORTED_SONAME "libort_flash.so"
    INTERFACE_INCLUDE_DIRECTORIES "${ort_flash_ORT_INCLUDE_DIR}")
endif()
unset(_ort_flash_prefix)
