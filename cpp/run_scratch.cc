#include "run_scratch.h"

#include <string>

namespace ort_flash {

RunScratch::~RunScratch() {
  for (void* p : ptrs_) allocator_->Free(allocator_, p);
  if (allocator_) api_.ReleaseAllocator(allocator_);
}

Status RunScratch::alloc(size_t bytes, const char* what, void** out) {
  *out = nullptr;
  if (!allocator_) {
    if (OrtStatus* st = api_.KernelContext_GetAllocator(ctx_, info_, &allocator_)) return error(st, what);
  }
  if (OrtStatus* st = api_.KernelContext_GetScratchBuffer(ctx_, info_, bytes, out)) return error(st, what);
  if (!*out) return Status::Error("cannot allocate " + std::to_string(bytes) + " bytes for " + what);
  ptrs_.push_back(*out);
  return Status::Ok();
}

Status RunScratch::error(OrtStatus* st, const char* what) {
  std::string msg = api_.GetErrorMessage(st);
  api_.ReleaseStatus(st);
  return Status::Error(std::string("cannot allocate device memory for ") + what + ": " + msg);
}

}  // namespace ort_flash
