// FlashAttention on the CPU: tiled online softmax over FlashParams (see flash_params.h for the
// exact semantics). fp32 compute for fp32/fp16/bf16 inputs; memory O(tile), never Sq x Skv.
// Built for several x86 ISAs and dispatched at run time (cpu_flash.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "flash_params.h"

namespace ort_flash {

// Runs fn over [0, n) split into chunks [begin, end), possibly concurrently; returns when all
// chunks are done. An empty ParallelFor runs everything on the calling thread.
using ParallelFor =
    std::function<void(size_t n, const std::function<void(size_t begin, size_t end)>& fn)>;

// Computes Y (and softmax_lse when p.lse is set). Throws std::invalid_argument for impossible
// params; anything thrown inside a task (only std::bad_alloc of a tile buffer can be) is
// rethrown on the calling thread after all tasks have finished.
void run_flash_cpu(const FlashParams& p, const ParallelFor& parallel_for);

// The kernel build run_flash_cpu uses: "baseline", "avx2" or "avx512" (x86-64), chosen at first
// use from the CPU's features, or forced by ORT_FLASH_CPU_ISA=baseline|avx2|avx512 (throws
// std::runtime_error if this CPU lacks it, std::invalid_argument for another value).
const char* cpu_flash_isa();

// n elements of `t` to fp32, and fp32 back to `t` (round to nearest even), with the kernel's
// conversions (the GroupQueryAttention op's rotary embedding computes in fp32).
void cpu_row_to_float(DType t, const void* src, int64_t n, float* dst);
void cpu_row_from_float(DType t, const float* src, int64_t n, void* dst);

}  // namespace ort_flash
