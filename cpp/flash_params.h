// Plain-data description of one FlashAttention call, filled by the op after validation and
// consumed by the CPU kernel and the CUDA launcher alike (compare flash-attention's Flash_fwd_params).
//
// Every tensor is addressed through element strides; the last dimension of Q, K, V, Y is
// contiguous. K and V here are the tensors attention reads: with a past cache they are the
// present tensors (past ++ new), so `skv` is the total key length and `offset` the past length.
#pragma once

#include <cstdint>

// DType, MaskKind, Fp32Precision: the codes the kernels' variant table uses too (generated from
// aot/contract.py into the build folder).
#include "contract.gen.h"

namespace ort_flash {

inline int dtype_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }
inline const char* dtype_name(DType t) {
  return t == DType::kFloat32 ? "float32" : (t == DType::kFloat16 ? "float16" : "bfloat16");
}

struct FlashParams {
  DType dtype = DType::kFloat16;

  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* y = nullptr;
  float* lse = nullptr;              // (B, Hq, Sq) contiguous, natural log; nullable
  const void* mask = nullptr;        // bool (1 byte) or dtype; nullable
  const int64_t* seqlens_k = nullptr;  // nonpad_kv_seqlen (B,); nullable
  // Keys per batch row (B,) with positions kept (offset as given, not per row), always beside a
  // key-vector mask that hides the same keys (j >= key_bound[b]): a GroupQueryAttention first
  // prompt, whose shorter rows keep their queries' positions. The CUDA launcher runs the unmasked
  // Gluon kernel with this bound where the build has one for the call (unless
  // ORT_FLASH_KEY_BOUND=0), else the mask; the CPU kernel reads the mask. Nullable.
  const int64_t* key_bound = nullptr;
  // Q's rotary, applied by the attention kernel as it loads Q (a GroupQueryAttention first prompt
  // whose Q it reads straight from the op's input): query row i's halves (x[c], x[c + rotary_half])
  // turned by row i of rotary_cos / rotary_sin (max_position rows of rotary_half values, in the
  // call's dtype; a row from max_position on stays as it is), rotary_half = d / 2. Only the Gluon
  // kernels take it (cuda_launch.h gluon_takes_rotary); rotary_half 0: Q as it is.
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  int64_t rotary_half = 0;
  int64_t max_position = 0;
  // Attention sinks (Hq,), natural log: each row of head h adds exp(sink[h]) to its softmax
  // denominator (a key of score sink[h] and value 0); nullable. CPU kernel only.
  const float* sink = nullptr;

  int64_t batch = 0, hq = 0, hkv = 0;
  int64_t sq = 0, skv = 0;           // skv: keys attention sees (past + new)
  int64_t d = 0, dv = 0;

  // Element strides over (batch, head, sequence); the head-dim stride is 1.
  int64_t q_stride[3] = {0, 0, 0};
  int64_t k_stride[3] = {0, 0, 0};
  int64_t v_stride[3] = {0, 0, 0};
  int64_t y_stride[3] = {0, 0, 0};

  MaskKind mask_kind = MaskKind::kNone;
  int64_t mask_stride[4] = {0, 0, 0, 1};  // (batch, head, query, key); 0 where broadcast.
                                          // The key stride is always 1 (a contiguous row).
  int64_t mask_len = 0;                   // mask's key extent; keys at or past it are masked

  float scale = 1.0f;
  float softcap = 0.0f;                   // 0 = off
  bool causal = false;
  int64_t window_left = -1, window_right = -1;  // -1 = unbounded
  int64_t offset = 0;  // position of query 0 among the keys (past length); see seqlens_k

  Fp32Precision fp32_precision = Fp32Precision::kIeee;
  // attention_precision="fp8": on CUDA the FP8 prefill path (cpp/fp8_launch.h) where it takes the
  // call, else the call's dtype and a notice once (cpp/notice.h). The CPU kernel ignores it.
  bool fp8 = false;
};

// A call with nothing to compute (no query rows, batches or query heads): nothing is read or
// written, no kernel runs.
inline bool is_empty_call(const FlashParams& p) { return p.sq == 0 || p.batch == 0 || p.hq == 0; }

// Query row i of batch b attends key j iff all hold (pos = i + offset_b):
//   j < skv, and j < seqlens_k[b] when given (then offset_b = seqlens_k[b] - sq, else offset)
//   causal: j <= pos;  window: pos - window_left <= j (left >= 0), j <= pos + window_right (right >= 0)
//   j < mask_len when a mask is given; bool mask true at (b, h, i, j)
//   j < key_bound[b] when given (the mask given with it says the same)
// Scores s = scale * q.k (q turned by its rotary first where rotary_half > 0); softcap c > 0: s = c * tanh(s / c); additive mask added after.
// A row with no attended key gives y = 0 and lse = -inf.

}  // namespace ort_flash
