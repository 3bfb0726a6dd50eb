// The CPU kernel for AVX2 + FMA + F16C: compiled with -mavx2 -mfma -mf16c (CMakeLists.txt),
// called only where the dispatcher in cpu_flash.cc found those features.
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__) || defined(__AVX512F__)
#error "cpu_flash_avx2.cc must be compiled with -mavx2 -mfma -mf16c (and without -mavx512f)"
#endif
#define ORT_FLASH_ISA avx2
#include "cpu_flash_kernel.inc"
