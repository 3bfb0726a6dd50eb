#include "cpu_kv_cache.h"

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

}  // namespace ort_flash
