// Runs FlashParams on the GPU: plans the call (launch_plan.h), then packs the kernels' arguments
// and launches them on the caller's stream.
#pragma once

#include <functional>

#include "cuda_driver.h"
#include "flash_params.h"
#include "kernel_registry.h"

namespace ort_flash {

// Device memory for the split-KV partials: returns `bytes` on the stream's device, owned by the
// caller and valid until the work queued on the stream has run (stream-ordered reuse is fine).
using WorkspaceFn = std::function<Status(size_t bytes, void** ptr)>;

// Launches the kernels for `p` on `stream` (asynchronous), with those loaded in the stream's
// context. An empty call (is_empty_call) launches nothing; a call no kernel can take fails before
// the kernels load. Without `workspace` the decode path runs unsplit.
Status launch_flash_cuda(const FlashParams& p, CUstream stream, const WorkspaceFn& workspace = nullptr);

// The same with the kernels of `dk`. ort_flash._C's launch_with_table passes a table of its own
// (tests).
Status launch_flash_cuda_with(const FlashParams& p, const DeviceKernels& dk, CUstream stream,
                              const WorkspaceFn& workspace = nullptr);

}  // namespace ort_flash
