// Runs FlashParams on the GPU: plans the call (launch_plan.h), then packs the kernels' arguments
// and launches them on the caller's stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "cuda_driver.h"
#include "flash_params.h"
#include "kernel_registry.h"

namespace ort_flash {

// Device memory for the split-KV partials: returns `bytes` on the stream's device, owned by the
// caller and valid until the work queued on the stream has run (stream-ordered reuse is fine).
using WorkspaceFn = std::function<Status(size_t bytes, void** ptr)>;

// A device pointer as a kernel argument (contract.gen.h's pointer fields); 0 for null.
inline uint64_t dev(const void* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); }

// `bytes` rounded up to 256: where the next part of one scratch block starts.
inline size_t aligned(size_t bytes) { return (bytes + 255) & ~static_cast<size_t>(255); }

// Launches `k` over grid (gx, gy, gz) with its warps and shared memory on `stream`, `args` its
// launch's argument array (an Args struct's pointers()): nothing for an empty grid, an error
// naming the kernel for a grid past the GPU's limits (x < 2^31, y and z <= 65535).
Status launch_grid(const CudaDriver& drv, const LoadedKernel& k, int64_t gx, int64_t gy, int64_t gz, void** args,
                   CUstream stream);

// Launches the kernels for `p` on `stream` (asynchronous), with those loaded in the stream's
// context. An empty call (is_empty_call) launches nothing; a call no kernel can take fails before
// the kernels load. Without `workspace` the decode path runs unsplit.
Status launch_flash_cuda(const FlashParams& p, CUstream stream, const WorkspaceFn& workspace = nullptr);

// Whether `p` (FlashParams::rotary_half set) would run on a Gluon kernel, the one kind that applies
// Q's rotary as it loads Q: planned as launch_flash_cuda plans it (the key bound's twin included)
// with the kernels of the stream's context, and the kernel's tensor maps encodable. Where not, the
// caller rotates Q itself and launches without the rotary.
Status gluon_takes_rotary(const FlashParams& p, CUstream stream, bool can_split, bool* takes);

// The same with the kernels of `dk`. ort_flash._C's launch_with_table passes a table of its own
// (tests).
Status launch_flash_cuda_with(const FlashParams& p, const DeviceKernels& dk, CUstream stream,
                              const WorkspaceFn& workspace = nullptr);

}  // namespace ort_flash
