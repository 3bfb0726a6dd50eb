// Validation of an ort_flash::GroupQueryAttention node: the interface of ONNX Runtime's
// com.microsoft.GroupQueryAttention (inputs, outputs, attributes, the shared KV buffer), so that a
// model built by ONNX Runtime GenAI runs with each GQA node swapped for this op. Features of
// ONNX Runtime's op that this one does not compute (a quantized cache, a bias, the QK output) are
// refused with the node, the input or attribute and the reason; the rewriter declines such nodes
// before they reach here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention_shapes.h"

namespace ort_flash {

enum GqaInput {
  kGqaQuery = 0, kGqaKey, kGqaValue, kGqaPastKey, kGqaPastValue, kGqaSeqlensK, kGqaTotalSeqLen,
  kGqaCos, kGqaSin, kGqaPositionIds, kGqaAttnBias, kGqaHeadSink, kGqaKScale, kGqaVScale,
  kGqaQNorm, kGqaKNorm, kGqaNumInputs
};
enum GqaOutput { kGqaOutput = 0, kGqaPresentKey, kGqaPresentValue, kGqaOutputQk, kGqaNumOutputs };

extern const char* const kGqaInputNames[kGqaNumInputs];
extern const char* const kGqaOutputNames[kGqaNumOutputs];

struct GqaAttributes {
  int64_t num_heads = 0, kv_num_heads = 0;
  float scale = 0.0f;  // 0: 1/sqrt(head size)
  float softcap = 0.0f;
  int64_t local_window_size = -1;  // > 0: a query sees itself and the local_window_size keys before it
  int64_t do_rotary = 0, rotary_interleaved = 0;
  int64_t causal = 1;
  // smooth_softmax=1: a sink of 0 per head (head_sink, when given, wins); qk_output: refused when set.
  int64_t smooth_softmax = -1, qk_output = 0;
  // 1: past/present hold the most recent positions only, C = past's length >= local_window_size
  // (ONNX Runtime's sliding_window_cache: after a call, rows [0, L) hold positions total - L ..
  // total - 1, L(T) = T for T <= C, else T - G ceil((T - C) / G), G = C - W + 1).
  int64_t sliding_window_cache = 0;
  std::string k_quant_type = "NONE", v_quant_type = "NONE";
  // The per-head RMS norm of Q and the new K (q_norm_weight / k_norm_weight) before the rotary.
  float qk_norm_epsilon = 1e-6f;
  bool fp8 = false;  // attention_precision="fp8" (cpp/fp8_launch.h: a first prompt on sm_90)
};

// Dimensions after validation; -1 where unknown (at kernel creation).
struct GqaDims {
  DType dtype = DType::kFloat32;
  int64_t batch = -1, sq = -1, hq = -1, hkv = -1, d = -1;
  bool packed = false;       // K and V omitted: query is (B, S, (Hq + 2 Hkv) * D)
  bool has_past = false;
  int64_t past_len = 0;      // the past buffer's sequence length (the max length when shared)
  int64_t rotary_dim = 0;    // 2 x cos_cache's second dim; 0 without rotary
  int64_t max_position = 0;  // rows of cos_cache
  bool has_position_ids = false;
  bool qk_norm = false;      // q_norm_weight and k_norm_weight given (D,)
  std::vector<int64_t> output_shape() const { return {batch, sq, hq < 0 || d < 0 ? -1 : hq * d}; }
  // (B, Hkv, max(total_sequence_length, past length), D), as ONNX Runtime's op.
  bool windowed = false;     // sliding_window_cache: present is past's length
  std::vector<int64_t> present_shape(int64_t total) const {
    if (windowed) return {batch, hkv, past_len, d};
    return {batch, hkv, total < 0 ? -1 : (total > past_len ? total : past_len), d};
  }
};

// `cuda`: the CUDA kernels' limits too (head size <= 256).
Status validate_gqa(const std::string& node, const GqaAttributes& attrs, const InputDesc (&in)[kGqaNumInputs],
                    const bool (&has_output)[kGqaNumOutputs], bool cuda, GqaDims* out);

}  // namespace ort_flash
