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

// What a mask row allows, found once per call before the tiles run (cpu_flash.cc), so that a
// causal / padding mask costs a tile what the positional rules cost it. The rows are the mask's
// distinct rows, mask_rows_index() below.
struct MaskRow {
  int32_t lo, hi;  // interval: exactly keys [lo, hi) pass (bool true / additive 0), all
                   // others are excluded (bool false / additive -inf, or <= -1e30 for fp32
                   // and bf16 masks: weight exactly 0 next to any passing key)
  int32_t mixed;   // 1: anything else; the tile applies this row's mask element by element
};

// Index of mask row (b, h, i) among the distinct rows: broadcast axes (stride 0) count once.
inline int64_t mask_rows_count(const FlashParams& p) {
  return (p.mask_stride[0] != 0 ? p.batch : 1) * (p.mask_stride[1] != 0 ? p.hq : 1) *
         (p.mask_stride[2] != 0 ? p.sq : 1);
}
inline int64_t mask_rows_index(const FlashParams& p, int64_t b, int64_t h, int64_t i) {
  const int64_t nh = p.mask_stride[1] != 0 ? p.hq : 1, ni = p.mask_stride[2] != 0 ? p.sq : 1;
  return ((p.mask_stride[0] != 0 ? b : 0) * nh + (p.mask_stride[1] != 0 ? h : 0)) * ni +
         (p.mask_stride[2] != 0 ? i : 0);
}

struct Kernel {
  const char* name;
  // Bytes of per-thread scratch for tiles of `tile_rows` rows (64-byte alignment included).
  size_t (*scratch_bytes)(const FlashParams& p, int64_t tile_rows);
  // Fills rows[r] for distinct mask rows r in [begin, end) (p has a mask). Throws nothing.
  void (*classify_mask_rows)(const FlashParams& p, int64_t begin, int64_t end, MaskRow* rows);
  // Runs work items [begin, end) (see cpu_flash_kernel.inc) with `scratch` of scratch_bytes();
  // `mask_rows` from classify_mask_rows when p has a mask. Throws nothing.
  void (*run)(const FlashParams& p, const MaskRow* mask_rows, int64_t tile_rows, void* scratch,
              int64_t begin, int64_t end);
  // n elements of type `t` to fp32 and back (stores round to nearest even). Throw nothing.
  void (*row_to_float)(DType t, const void* src, int64_t n, float* dst);
  void (*row_from_float)(DType t, const float* src, int64_t n, void* dst);
};

Kernel baseline_kernel();
#if defined(ORT_FLASH_CPU_X86_ISAS)
Kernel avx2_kernel();    // AVX2 + FMA + F16C
Kernel avx512_kernel();  // AVX-512 F/BW/VL/DQ
#endif

}  // namespace cpu_isa
}  // namespace ort_flash
