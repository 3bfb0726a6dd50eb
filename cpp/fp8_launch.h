// The opt-in FP8 (e4m3) prefill path on sm_90 (a node's attention_precision="fp8"): the two
// prepare kernels of aot/fp8_prepare.py (K's column sums and V's column maxima per key head, then
// the rotated, block-scaled e4m3 Q and K, V transposed with per-channel scales) into scratch, then
// aot/flash_fwd_fp8.py's attention, whose Q·Kᵀ and P·V run on e4m3 tensor cores with fp32
// accumulation and which writes the output in the call's dtype.
#pragma once

#include <string>

#include "cuda_launch.h"

namespace ort_flash {

// Why the FP8 path does not take `p` on `dk`, in words that complete "attention runs in <dtype>
// here, not FP8: ..." (one reason per class of call, the same text for every call of it); empty
// where it takes it. It takes fp16/bf16 prefill without a KV cache (Sq == Skv, no past), head dim
// 64 or 128 (D == Dv), no mask, key lengths, window or softcap, causal or not, any GQA group, on
// an sm_90 device whose table has the FP8 kernels, with 16-element-aligned strides.
std::string fp8_declines(const FlashParams& p, const DeviceKernels& dk);

// The FP8 path for `p` (fp8_declines(p, dk) empty): the three launches on `stream`, their
// buffers from `workspace` (required).
Status launch_fp8(const FlashParams& p, const DeviceKernels& dk, CUstream stream, const WorkspaceFn& workspace);

// The notice (cpp/notice.h, once) of a node with attention_precision="fp8" on the CPU execution
// provider, whose attention runs in `dtype`.
void notice_fp8_on_cpu(DType dtype);

}  // namespace ort_flash
