// The CPU kernel for AVX-512 F/BW/VL/DQ: compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512dq (CMakeLists.txt), called only where the dispatcher in cpu_flash.cc found them.
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || \
    !defined(__AVX512DQ__) || !defined(__FMA__)
#error "cpu_flash_avx512.cc must be compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma"
#endif
#define ORT_FLASH_ISA avx512
#include "cpu_flash_kernel.inc"
