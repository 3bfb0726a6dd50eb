// Runs FlashParams on the GPU: picks the compiled variant (the one place where runtime flags map
// to compile-time specializations) and launches it on the caller's stream.
#pragma once

#include "cuda_driver.h"
#include "flash_params.h"
#include "kernel_table.h"

namespace ort_flash {

// The variant `p` needs, or an error naming what this build cannot run.
Status select_variant(const FlashParams& p, VariantKey* key);

// Launches the forward kernel for `p` on `stream` (asynchronous). Sq == 0 or B*Hq == 0 launch
// nothing.
Status launch_flash_cuda(const FlashParams& p, CUstream stream);

// present = past ++ new along the sequence axis, on `stream`. `past` is (B, H, P, D) contiguous;
// `cur` is addressed by element strides (b, h, s) with a contiguous last dim of D elements;
// `present` is (B, H, P + S, D) contiguous.
Status append_kv_cuda(const void* past, const void* cur, const int64_t cur_stride[3], void* present,
                      int64_t batch, int64_t heads, int64_t past_len, int64_t cur_len, int64_t d,
                      int elem_size, CUstream stream);

}  // namespace ort_flash
