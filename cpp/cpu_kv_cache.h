// present = past ++ new along the sequence axis, on the host (the CPU EP's KV-cache append).
#pragma once

#include <cstdint>

namespace ort_flash {

// `past` (B, H, P, W) contiguous or null when P == 0; `cur` addressed by element strides
// (b, h, s) with a contiguous last dim of W elements; `present` (B, H, P + S, W) contiguous.
void append_kv_cpu(const void* past, const void* cur, const int64_t cur_stride[3], void* present,
                   int64_t batch, int64_t heads, int64_t past_len, int64_t cur_len, int64_t width,
                   int elem_size);

}  // namespace ort_flash
