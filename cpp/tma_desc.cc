#include "tma_desc.h"

namespace ort_flash {
namespace {

constexpr int64_t kTmaElem = 2;  // fp16 / bf16

bool tma_view_ok(const void* base, int64_t b, int64_t h, int64_t s, int64_t d, const int64_t stride[3]) {
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return false;
  for (int64_t x : {b, h, s, d}) {
    if (x <= 0 || x > INT32_MAX) return false;
  }
  for (int i = 0; i < 3; ++i) {
    if (stride[i] <= 0 || (stride[i] * kTmaElem) % 16 != 0 || stride[i] * kTmaElem >= (int64_t{1} << 40)) return false;
  }
  return true;
}

bool encode_tma(const CudaDriver& drv, const TmaBox& box, DType dtype, const void* base,
                int64_t b, int64_t h, int64_t s, int64_t d, const int64_t stride[3], TmaArg* out) {
  const int64_t dims[4] = {b, h, s, d};
  // The driver's order is innermost first: (D, S, H, B), byte strides of S, H, B.
  const uint64_t gdims[4] = {static_cast<uint64_t>(d), static_cast<uint64_t>(s), static_cast<uint64_t>(h),
                             static_cast<uint64_t>(b)};
  const uint64_t gstrides[3] = {static_cast<uint64_t>(stride[2] * kTmaElem), static_cast<uint64_t>(stride[1] * kTmaElem),
                                static_cast<uint64_t>(stride[0] * kTmaElem)};
  const uint32_t boxdims[4] = {static_cast<uint32_t>(box.cols), static_cast<uint32_t>(box.rows), 1, 1};
  const uint32_t elem_strides[4] = {1, 1, 1, 1};
  const int type = dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  if (drv.cuTensorMapEncodeTiled(&out->map, type, 4, const_cast<void*>(base), gdims, gstrides, boxdims,
                                 elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, box.swizzle,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    return false;
  }
  for (int i = 0; i < 4; ++i) out->dims[i] = static_cast<int32_t>(dims[i]);
  out->strides[0] = stride[0];
  out->strides[1] = stride[1];
  out->strides[2] = stride[2];
  out->strides[3] = 1;
  return true;
}

}  // namespace

bool tma_views_ok(const FlashParams& p) {
  return tma_view_ok(p.q, p.batch, p.hq, p.sq, p.d, p.q_stride) &&
         tma_view_ok(p.k, p.batch, p.hkv, p.skv, p.d, p.k_stride) &&
         tma_view_ok(p.v, p.batch, p.hkv, p.skv, p.dv, p.v_stride) &&
         tma_view_ok(p.y, p.batch, p.hq, p.sq, p.dv, p.y_stride);
}

bool encode_tma_args(const CudaDriver& drv, const FlashParams& p, const KernelEntry& e, TmaArg out[kTmaDescriptors]) {
  return encode_tma(drv, e.tma[0], p.dtype, p.q, p.batch, p.hq, p.sq, p.d, p.q_stride, &out[0]) &&
         encode_tma(drv, e.tma[1], p.dtype, p.k, p.batch, p.hkv, p.skv, p.d, p.k_stride, &out[1]) &&
         encode_tma(drv, e.tma[2], p.dtype, p.v, p.batch, p.hkv, p.skv, p.dv, p.v_stride, &out[2]) &&
         encode_tma(drv, e.tma[3], p.dtype, p.y, p.batch, p.hq, p.sq, p.dv, p.y_stride, &out[3]);
}

}  // namespace ort_flash
