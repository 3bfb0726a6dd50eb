// Validation of a FlashAttention node's inputs and attributes against the op contract, and the
// shapes of its outputs. Used three times: at kernel creation (static dims, -1 where unknown), in
// shape inference, and in Compute (concrete dims). Every failure names the node, the input and
// what was expected.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "flash_params.h"
#include "status.h"

namespace ort_flash {

enum Input { kQ = 0, kK, kV, kMask, kPastKey, kPastValue, kNonpad, kNumInputs };
enum Output { kY = 0, kPresentKey, kPresentValue, kLse, kNumOutputs };

extern const char* const kInputNames[kNumInputs];
extern const char* const kOutputNames[kNumOutputs];

// Element types use ONNX's TensorProto codes (1 float, 9 bool, 10 float16, 16 bfloat16, 7 int64).
struct InputDesc {
  bool present = false;
  int elem_type = 0;              // 0 = unknown
  std::vector<int64_t> shape;     // -1 = unknown dim
  bool rank_known = true;
};

struct Attributes {
  float scale = NAN;  // NaN: 1/sqrt(D)
  int64_t is_causal = 0;
  float softcap = 0.0f;
  int64_t left_window = -1, right_window = -1;
  int64_t q_num_heads = 0, kv_num_heads = 0;  // 0: not given
  Fp32Precision fp32_precision = Fp32Precision::kIeee;
  bool fp8 = false;  // attention_precision="fp8"
};

// Dimensions after validation; -1 where unknown (only before Compute).
struct AttentionDims {
  DType dtype = DType::kFloat32;
  int rank = 4;
  int64_t batch = -1, hq = -1, hkv = -1, sq = -1, skv_new = -1, past = 0, d = -1, dv = -1;
  bool has_past = false;
  // Packed QKV: K and V omitted, Q 3-D (B, S, (Hq + 2 Hkv) * D) holding Q | K | V per token.
  bool packed = false;
  // Packed KV: V omitted, K 3-D (B, Skv, 2 Hkv * D) holding K | V per key token; Q 3-D as usual.
  bool kv_packed = false;
  MaskKind mask_kind = MaskKind::kNone;
  std::vector<int64_t> mask_shape;  // right-aligned to 4-D, broadcast dims are 1
  int64_t total() const { return (skv_new < 0 || past < 0) ? -1 : past + skv_new; }
  std::vector<int64_t> y_shape() const;
  std::vector<int64_t> present_shape(bool value) const;
  std::vector<int64_t> lse_shape() const { return {batch, hq, sq}; }
};

// `cuda`: apply the CUDA kernels' limits too (head dim <= 256).
Status validate(const std::string& node, const Attributes& attrs, const InputDesc (&in)[kNumInputs],
                bool cuda, AttentionDims* out);

int onnx_type_of(DType t);

// For messages: an ONNX element type code's name ("float16", "int32", ...), a shape with "?" for
// unknown dims.
std::string type_name(int onnx_type);
std::string shape_str(const std::vector<int64_t>& shape);

// Element strides (batch, head, sequence) of a contiguous tensor in the op's layouts:
// 4-D (B, H, S, W) or 3-D (B, S, H*W).
inline void seq_strides(int rank, int64_t heads, int64_t seq, int64_t width, int64_t out[3]) {
  if (rank == 4) {
    out[0] = heads * seq * width; out[1] = seq * width; out[2] = width;
  } else {
    out[0] = seq * heads * width; out[1] = width; out[2] = heads * width;
  }
}

// Element strides (batch, head, sequence) of Q, K and V inside a packed QKV tensor
// (B, S, (Hq + 2 Hkv) * D): one row of (Hq + 2 Hkv) * D elements a token, heads D apart.
inline void packed_strides(const AttentionDims& d, int64_t out[3]) {
  const int64_t row = (d.hq + 2 * d.hkv) * d.d;
  out[0] = d.sq * row; out[1] = d.d; out[2] = row;
}

// Element strides (batch, head, sequence) of K and V inside a packed KV tensor (B, Skv, 2 Hkv * D).
inline void kv_packed_strides(const AttentionDims& d, int64_t out[3]) {
  const int64_t row = 2 * d.hkv * d.d;
  out[0] = d.skv_new * row; out[1] = d.d; out[2] = row;
}

// Strides of a contiguous mask right-aligned to 4-D; broadcast (size-1) axes get stride 0. The
// key axis keeps stride 1 even at size 1: ONNX pads a short key axis, it never broadcasts it.
inline void mask_strides(const std::vector<int64_t>& shape4, int64_t out[4]) {
  int64_t s = 1;
  for (int a = 3; a >= 0; --a) {
    out[a] = (shape4[a] == 1 && a < 3) ? 0 : s;
    s *= shape4[a];
  }
}

}  // namespace ort_flash
