// The CPU kernel for the baseline ISA of the target (x86-64: SSE2), the fallback of the
// dispatcher in cpu_flash.cc. Compiled with the project's flags only.
#define ORT_FLASH_ISA baseline
#include "cpu_flash_kernel.inc"
