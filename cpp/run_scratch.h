// Device scratch for one run of an op on the CUDA EP, allocated on the run's stream through
// KernelContext_GetScratchBuffer and freed when the run's kernels are queued. Stream-aware: the
// arena hands a freed chunk to another stream only once this stream's work is done. A plain
// Alloc is not: with concurrent runs (each on its own stream) one run could be given the chunk
// while the other's kernels still read it.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_c_api.h>
#undef ORT_API_MANUAL_INIT

#include <cstddef>
#include <vector>

#include "status.h"

namespace ort_flash {

class RunScratch {
 public:
  RunScratch(const OrtApi& api, OrtKernelContext* ctx, const OrtMemoryInfo* info)
      : api_(api), ctx_(ctx), info_(info) {}
  ~RunScratch();
  RunScratch(const RunScratch&) = delete;
  RunScratch& operator=(const RunScratch&) = delete;

  // `bytes` of device memory, valid until this object is destroyed; `what` names it in errors.
  Status alloc(size_t bytes, const char* what, void** out);

 private:
  Status error(OrtStatus* st, const char* what);
  const OrtApi& api_;
  OrtKernelContext* ctx_;
  const OrtMemoryInfo* info_;
  OrtAllocator* allocator_ = nullptr;
  std::vector<void*> ptrs_;
};

}  // namespace ort_flash
