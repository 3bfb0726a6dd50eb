// FlashAttention-2 style forward pass on the CPU (see cpu_flash.h): validation, tiling, the
// thread-pool driver and the run-time ISA dispatch. The tile algorithm itself is
// cpu_flash_kernel.inc, built once per ISA (cpu_flash_{baseline,avx2,avx512}.cc, each with its
// own -m flags); the first call picks the widest build this CPU runs (__builtin_cpu_supports),
// or the one the environment variable ORT_FLASH_CPU_ISA names (baseline | avx2 | avx512; empty
// or "auto" = the widest).
//
// Never build with -ffast-math / -ffinite-math-only: the masking relies on IEEE -inf arithmetic.
#include "cpu_flash.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_flash_isa.h"

namespace ort_flash {
namespace {

constexpr int64_t kMaxRows = 64;   // query rows per tile, at most
constexpr int64_t kMinRows = 16;   // tiles shrink down to this to give the pool enough tasks
constexpr int64_t kMinTasks = 16;
constexpr int64_t kMaskRowsPerTask = 64;  // mask rows classified per task

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Per-thread scratch, reused across tasks and calls: ONNX Runtime's ParallelFor runs one item
// per task, so buffers allocated per task would be allocated per tile. Kept under kKeepBytes.
constexpr size_t kKeepBytes = size_t(16) << 20;

std::vector<unsigned char>& thread_arena() {
  thread_local std::vector<unsigned char> arena;
  return arena;
}

// ---- ISA dispatch --------------------------------------------------------------------------

struct Features {
  bool avx2 = false, avx512 = false;
};

Features cpu_features() {
  Features f;
#if defined(ORT_FLASH_CPU_X86_ISAS)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
  return f;
}

cpu_isa::Kernel choose_kernel() {
  const Features f = cpu_features();
  const char* env = std::getenv("ORT_FLASH_CPU_ISA");
  const std::string want = env != nullptr ? env : "";
  auto unsupported = [&](const char* what) {
    return std::runtime_error("ORT_FLASH_CPU_ISA=" + want + ": this " +
                              std::string(what) + " (supported here: baseline" +
                              (f.avx2 ? ", avx2" : "") + (f.avx512 ? ", avx512" : "") + ")");
  };
  if (want == "baseline") return cpu_isa::baseline_kernel();
#if defined(ORT_FLASH_CPU_X86_ISAS)
  if (want == "avx2") {
    if (!f.avx2) throw unsupported("CPU lacks AVX2 / FMA / F16C");
    return cpu_isa::avx2_kernel();
  }
  if (want == "avx512") {
    if (!f.avx512) throw unsupported("CPU lacks AVX-512 F/BW/VL/DQ");
    return cpu_isa::avx512_kernel();
  }
#else
  if (want == "avx2" || want == "avx512") throw unsupported("build has no x86 ISA variants");
#endif
  if (!want.empty() && want != "auto")
    throw std::invalid_argument("ORT_FLASH_CPU_ISA=" + want +
                                ": expected baseline, avx2, avx512 or auto");
#if defined(ORT_FLASH_CPU_X86_ISAS)
  if (f.avx512) return cpu_isa::avx512_kernel();
  if (f.avx2) return cpu_isa::avx2_kernel();
#endif
  return cpu_isa::baseline_kernel();
}

// Chosen at first use; a choice that throws (a bad ORT_FLASH_CPU_ISA) is retried next call.
const cpu_isa::Kernel& kernel() {
  static const cpu_isa::Kernel k = choose_kernel();
  return k;
}

void validate(const FlashParams& p) {
  auto fail = [](const std::string& what) {
    throw std::invalid_argument("ort_flash CPU FlashAttention: " + what);
  };
  if (p.dtype != DType::kFloat32 && p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16)
    fail("unknown dtype");
  if (p.mask_kind != MaskKind::kNone && p.mask_kind != MaskKind::kBool &&
      p.mask_kind != MaskKind::kAdditive)
    fail("unknown mask kind");
  if (p.batch < 0 || p.hq < 0 || p.hkv < 0 || p.sq < 0 || p.skv < 0 || p.d < 0 || p.dv < 0)
    fail("negative size");
  if (p.hq > 0 && (p.hkv <= 0 || p.hq % p.hkv != 0))
    fail("q heads (" + std::to_string(p.hq) + ") must be a multiple of kv heads (" +
         std::to_string(p.hkv) + ")");
  if (p.window_left < -1 || p.window_right < -1) fail("window sizes must be -1 or >= 0");
  if (p.mask_kind != MaskKind::kNone && p.mask_len < 0) fail("negative mask_len");
  if (is_empty_call(p)) return;  // nothing is read or written
  if (p.y == nullptr && p.dv > 0) fail("null Y");
  if (p.q == nullptr && p.d > 0) fail("null Q");
  if (p.skv > 0 && ((p.k == nullptr && p.d > 0) || (p.v == nullptr && p.dv > 0)))
    fail("null K or V");
  if (p.mask_kind != MaskKind::kNone && p.mask == nullptr && p.skv > 0 && p.mask_len > 0)
    fail("null mask");
}

// Tile height: kMaxRows, halved (down to kMinRows) while there are too few tasks.
int64_t pick_tile_rows(const FlashParams& p) {
  const int64_t rows = p.hq / p.hkv * p.sq;
  int64_t tile = kMaxRows;
  while (tile > kMinRows && p.batch * p.hkv * ceil_div(rows, tile) < kMinTasks) tile /= 2;
  return std::min(tile, rows);
}

void for_each(const ParallelFor& parallel_for, int64_t items,
              const std::function<void(size_t, size_t)>& task) {
  if (parallel_for) {
    parallel_for(size_t(items), task);
  } else {
    task(0, size_t(items));
  }
}

void run(const FlashParams& p, const ParallelFor& parallel_for) {
  const cpu_isa::Kernel& k = kernel();
  const int64_t tile_rows = pick_tile_rows(p);
  const int64_t items = p.batch * p.hkv * ceil_div(p.hq / p.hkv * p.sq, tile_rows);
  const size_t bytes = k.scratch_bytes(p, tile_rows);
  // The mask's distinct rows, classified once (O(rows) memory), not once per head and tile.
  std::vector<cpu_isa::MaskRow> mask_rows;
  if (p.mask_kind != MaskKind::kNone) {
    const int64_t n = cpu_isa::mask_rows_count(p);
    mask_rows.resize(size_t(n));
    const int64_t chunks = ceil_div(n, kMaskRowsPerTask);
    for_each(parallel_for, chunks, [&](size_t begin, size_t end) {
      k.classify_mask_rows(p, int64_t(begin) * kMaskRowsPerTask,
                           std::min(n, int64_t(end) * kMaskRowsPerTask), mask_rows.data());
    });
  }
  std::exception_ptr error;
  std::mutex error_mutex;
  for_each(parallel_for, items, [&](size_t begin, size_t end) {
    try {
      std::vector<unsigned char>& arena = thread_arena();
      if (arena.size() < bytes) arena.resize(bytes);
      k.run(p, mask_rows.data(), tile_rows, arena.data(), int64_t(begin), int64_t(end));
      if (arena.size() > kKeepBytes) std::vector<unsigned char>().swap(arena);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
}

}  // namespace

void run_flash_cpu(const FlashParams& p, const ParallelFor& parallel_for) {
  validate(p);
  if (is_empty_call(p)) return;
  run(p, parallel_for);
}

const char* cpu_flash_isa() { return kernel().name; }

void cpu_row_to_float(DType t, const void* src, int64_t n, float* dst) { kernel().row_to_float(t, src, n, dst); }

void cpu_row_from_float(DType t, const float* src, int64_t n, void* dst) { kernel().row_from_float(t, src, n, dst); }

}  // namespace ort_flash
