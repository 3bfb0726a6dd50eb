// GroupQueryAttention on the GPU: the prepare kernels (aot/gqa_prepare.py: rotary, the new K/V
// rows, the lengths, a separate present's past) launched here, then the attention through
// cpp/cuda_launch.h's launch_flash_cuda over the FlashParams that gqa_flash_params (shared with
// the CPU op) fills with the device lengths and key mask the prepare kernel wrote. With attention
// sinks the attention also stores its log-sum-exp, from which aot/sink_rescale.py then scales each
// output row in place; no attention kernel knows of sinks.
#pragma once

#include <string>

#include "cuda_launch.h"
#include "gqa_call.h"
#include "kernel_registry.h"

namespace ort_flash {

// Kernel creation on the CUDA EP: loads the kernels into the device's context and checks that
// this build has the prepare kernels for `dtype`, with `sinks` (the node has head_sink or
// smooth_softmax=1) the sink rescale kernel, and with `windowed` (sliding_window_cache=1) the
// compaction and shift kernels (an error naming what is missing otherwise).
Status gqa_cuda_ready(int device, DType dtype, bool sinks = false, bool windowed = false);

// The kernel of `kind` (kGqaPrepare, kGqaPast, kGqaCompact, kGqaShift, kSinkRescale) for `dtype` with the smallest BLOCK_D
// that holds head size `d`, or null.
const LoadedKernel* gqa_kernel(const DeviceKernels& dk, KernelKind kind, DType dtype, int64_t d);

// Runs the call on `stream` (asynchronous): `c` holds device pointers (seqlens_k and position_ids
// included); total_sequence_length is the host value. `scratch` gives stream-ordered device
// memory: one block for the rotated Q, the int64 lengths, a first prompt's key mask, with sinks
// the attention's log-sum-exp and with a windowed cache that rows may pass (total_sequence_length
// > C) by more than one new token its stage (2 x B x Hkv x (C + S) x D elements), then the
// attention's split-KV partials.
// seqlens_k is never read on the host: a row whose value is impossible gets output 0 and leaves
// the cache alone (aot/gqa_prepare.py).
Status run_gqa_cuda(const std::string& node, const GqaCall& c, CUstream stream, const WorkspaceFn& scratch);

}  // namespace ort_flash
