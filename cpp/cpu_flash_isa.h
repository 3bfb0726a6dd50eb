// Internal interface between the CPU kernel's dispatcher (cpu_flash.cc) and its per-ISA builds.
//
// cpu_flash_kernel.inc holds the one source of the tiled algorithm; cpu_flash_baseline.cc,
// cpu_flash_avx2.cc and cpu_flash_avx512.cc include it, each compiled with its own -m flags
// (CMakeLists.txt), and each exports only its `<isa>_kernel()` entry. Everything else in those
// objects has internal linkage and uses no out-of-line library template, so no code compiled
// for a wider ISA can be picked by the linker for a call from a narrower one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flash_params.h"

namespace ort_flash {
namespace cpu_isa {

struct Kernel {
  const char* name;
  // Bytes of per-thread scratch for tiles of `tile_rows` rows (64-byte alignment included).
  size_t (*scratch_bytes)(const FlashParams& p, int64_t tile_rows);
  // Runs work items [begin, end) (see cpu_flash_kernel.inc) with `scratch` of scratch_bytes().
  // Throws nothing.
  void (*run)(const FlashParams& p, int64_t tile_rows, void* scratch, int64_t begin, int64_t end);
};

Kernel baseline_kernel();
#if defined(ORT_FLASH_CPU_X86_ISAS)
Kernel avx2_kernel();    // AVX2 + FMA (+ F16C)
Kernel avx512_kernel();  // AVX-512 F/BW/VL/DQ
#endif

}  // namespace cpu_isa
}  // namespace ort_flash
