# ORT_FLASH_CACHE_DIR: where downloads (ORT headers) and compiled kernels are cached, outside
# the build folder and across builds. Default ~/.cache/ort_flash (or $XDG_CACHE_HOME/ort_flash).
if(NOT ORT_FLASH_CACHE_DIR)
  if(DEFINED ENV{ORT_FLASH_CACHE_DIR})
    set(ORT_FLASH_CACHE_DIR "$ENV{ORT_FLASH_CACHE_DIR}")
  elseif(DEFINED ENV{XDG_CACHE_HOME})
    set(ORT_FLASH_CACHE_DIR "$ENV{XDG_CACHE_HOME}/ort_flash")
  else()
    set(ORT_FLASH_CACHE_DIR "$ENV{HOME}/.cache/ort_flash")
  endif()
endif()

