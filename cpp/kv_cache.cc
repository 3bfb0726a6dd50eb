#include "kv_cache.h"

#include <cstring>

namespace ort_flash {

void append_kv_cpu(const void* past, const void* cur, const int64_t cur_stride[3], void* present,
                   int64_t batch, int64_t heads, int64_t past_len, int64_t cur_len, int64_t width,
                   int elem_size) {
  const size_t row = static_cast<size_t>(width) * elem_size;
  const int64_t total = past_len + cur_len;
  char* dst = static_cast<char*>(present);
  const char* p = static_cast<const char*>(past);
  const char* c = static_cast<const char*>(cur);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      char* block = dst + static_cast<size_t>((b * heads + h) * total) * row;
      if (past_len > 0) {
        std::memcpy(block, p + static_cast<size_t>((b * heads + h) * past_len) * row,
                    static_cast<size_t>(past_len) * row);
      }
      for (int64_t s = 0; s < cur_len; ++s) {
        std::memcpy(block + static_cast<size_t>(past_len + s) * row,
                    c + static_cast<size_t>(b * cur_stride[0] + h * cur_stride[1] + s * cur_stride[2]) * elem_size,
                    row);
      }
    }
  }
}

Status append_kv_cuda(const void* past, const void* cur, const int64_t cur_stride[3], void* present,
                      int64_t batch, int64_t heads, int64_t past_len, int64_t cur_len, int64_t d,
                      int elem_size, CUstream stream) {
  const CudaDriver* drv = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(cuda_driver(&drv));
  const size_t row = static_cast<size_t>(d) * elem_size;
  const size_t total = static_cast<size_t>(past_len + cur_len);
  auto copy = [&](CUdeviceptr src, size_t src_pitch, CUdeviceptr dst, size_t width, size_t height) {
    CUDA_MEMCPY2D c{};
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = src;
    c.srcPitch = src_pitch;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = dst;
    c.dstPitch = total * row;
    c.WidthInBytes = width;
    c.Height = height;
    return cuda_check(drv->cuMemcpy2DAsync(&c, stream), "cuMemcpy2DAsync (KV cache append)");
  };
  const CUdeviceptr dst = reinterpret_cast<CUdeviceptr>(present);
  if (past_len > 0) {
    // Every (b, h) block of the past is one row of a 2-D copy.
    ORT_FLASH_RETURN_IF_ERROR(copy(reinterpret_cast<CUdeviceptr>(past), past_len * row, dst,
                                   past_len * row, static_cast<size_t>(batch * heads)));
  }
  if (cur_len == 0) return Status::Ok();
  const CUdeviceptr src = reinterpret_cast<CUdeviceptr>(cur);
  const int64_t es = elem_size;
  if (cur_stride[2] == d && cur_stride[1] == cur_len * d && cur_stride[0] == heads * cur_len * d) {
    // 4-D contiguous: the (b, h) blocks are rows again.
    return copy(src, cur_len * row, dst + past_len * row, cur_len * row, static_cast<size_t>(batch * heads));
  }
  // Strided (3-D input): one 2-D copy of cur_len rows per (b, h).
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      CUDA_MEMCPY2D c{};
      c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
      c.srcDevice = src + static_cast<CUdeviceptr>((b * cur_stride[0] + h * cur_stride[1]) * es);
      c.srcPitch = static_cast<size_t>(cur_stride[2] * es);
      c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
      c.dstDevice = dst + static_cast<CUdeviceptr>(((b * heads + h) * static_cast<int64_t>(total) + past_len) * d * es);
      c.dstPitch = row;
      c.WidthInBytes = row;
      c.Height = static_cast<size_t>(cur_len);
      ORT_FLASH_RETURN_IF_ERROR(cuda_check(drv->cuMemcpy2DAsync(&c, stream), "cuMemcpy2DAsync (KV cache append)"));
    }
  }
  return Status::Ok();
}

}  // namespace ort_flash
