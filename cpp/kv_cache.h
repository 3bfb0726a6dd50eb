// The KV-cache append, present = past ++ new along the sequence axis: on the host for the CPU EP,
// on a CUDA stream for the CUDA EP. Both take the same layouts.
#pragma once

#include <cstdint>

#include "cuda_driver.h"

namespace ort_flash {

// `past` (B, H, P, W) contiguous or null when P == 0; `cur` addressed by element strides
// (b, h, s) with a contiguous last dim of W elements; `present` (B, H, P + S, W) contiguous.
void append_kv_cpu(const void* past, const void* cur, const int64_t cur_stride[3], void* present,
                   int64_t batch, int64_t heads, int64_t past_len, int64_t cur_len, int64_t width,
                   int elem_size);

// The same with device pointers, copied on `stream` (asynchronous).
Status append_kv_cuda(const void* past, const void* cur, const int64_t cur_stride[3], void* present,
                      int64_t batch, int64_t heads, int64_t past_len, int64_t cur_len, int64_t width,
                      int elem_size, CUstream stream);

}  // namespace ort_flash
