#include "gqa_shapes.h"

namespace ort_flash {

const char* const kGqaInputNames[kGqaNumInputs] = {
    "query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
    "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale",
    "q_norm_weight", "k_norm_weight"};
const char* const kGqaOutputNames[kGqaNumOutputs] = {"output", "present_key", "present_value", "output_qk"};

namespace {

constexpr int kFloat = 1, kFloat16 = 10, kBFloat16 = 16, kInt32 = 6, kInt64 = 7;

class GqaChecker {
 public:
  GqaChecker(const std::string& node, const InputDesc (&in)[kGqaNumInputs]) : node_(node), in_(in) {}
  Status fail(int input, const std::string& what) const {
    return Status::Error("GroupQueryAttention node '" + node_ + "': input '" + kGqaInputNames[input] + "' " + what);
  }
  Status fail_node(const std::string& what) const {
    return Status::Error("GroupQueryAttention node '" + node_ + "': " + what);
  }
  Status rank(int input, size_t want, const char* layout) const {
    const InputDesc& d = in_[input];
    if (!d.rank_known || d.shape.size() == want) return Status::Ok();
    return fail(input, "has shape " + shape_str(d.shape) + "; expected " + layout);
  }
  // Dim `axis` of `input` is `want` (unless either is unknown).
  Status dim(int input, int axis, int64_t want, const char* meaning) const {
    const InputDesc& d = in_[input];
    if (!d.rank_known || axis >= static_cast<int>(d.shape.size())) return Status::Ok();
    const int64_t got = d.shape[axis];
    if (got < 0 || want < 0 || got == want) return Status::Ok();
    return fail(input, "has shape " + shape_str(d.shape) + ": dim " + std::to_string(axis) + " (" + meaning +
                           ") is " + std::to_string(got) + ", expected " + std::to_string(want));
  }
  Status type(int input, int want) const {
    const int got = in_[input].elem_type;
    if (got == 0 || got == want) return Status::Ok();
    return fail(input, "is " + type_name(got) + "; expected " + type_name(want));
  }
  int64_t at(int input, int axis) const {
    const InputDesc& d = in_[input];
    return (d.rank_known && axis < static_cast<int>(d.shape.size())) ? d.shape[axis] : -1;
  }

 private:
  const std::string& node_;
  const InputDesc (&in_)[kGqaNumInputs];
};

// The features of ONNX Runtime's op this one does not compute.
Status refuse_unsupported(const GqaChecker& c, const GqaAttributes& a, const InputDesc (&in)[kGqaNumInputs],
                          const bool (&has_output)[kGqaNumOutputs]) {
  const struct { int input; const char* why; } inputs[] = {
      {kGqaAttnBias, "(an attention bias) is not supported"},
      {kGqaKScale, "(a quantized KV cache) is not supported"},
      {kGqaVScale, "(a quantized KV cache) is not supported"},
  };
  for (const auto& u : inputs) {
    if (in[u.input].present) return c.fail(u.input, u.why);
  }
  if (a.k_quant_type != "NONE" || a.v_quant_type != "NONE") {
    return c.fail_node("a quantized KV cache (k_quant_type '" + a.k_quant_type + "', v_quant_type '" +
                       a.v_quant_type + "') is not supported");
  }
  if (a.qk_output != 0 || has_output[kGqaOutputQk]) return c.fail_node("the output_qk output (qk_output) is not supported");
  if (a.causal == 0 && a.local_window_size > 0) {
    return c.fail_node("local_window_size with causal=0 is not supported");
  }
  return Status::Ok();
}

}  // namespace

Status validate_gqa(const std::string& node, const GqaAttributes& a, const InputDesc (&in)[kGqaNumInputs],
                    const bool (&has_output)[kGqaNumOutputs], bool cuda, GqaDims* out) {
  const GqaChecker c(node, in);
  GqaDims d;
  if (a.num_heads <= 0 || a.kv_num_heads <= 0 || a.num_heads % a.kv_num_heads != 0) {
    return c.fail_node("num_heads (" + std::to_string(a.num_heads) + ") must be a positive multiple of kv_num_heads (" +
                       std::to_string(a.kv_num_heads) + ")");
  }
  if (a.softcap < 0.0f || a.scale < 0.0f) return c.fail_node("scale and softcap must not be negative");
  ORT_FLASH_RETURN_IF_ERROR(refuse_unsupported(c, a, in, has_output));
  d.hq = a.num_heads;
  d.hkv = a.kv_num_heads;

  const int t = in[kGqaQuery].elem_type;
  if (t != 0 && t != kFloat && t != kFloat16 && t != kBFloat16) {
    return c.fail(kGqaQuery, "is " + type_name(t) + "; expected float32, float16 or bfloat16");
  }
  d.dtype = t == kFloat16 ? DType::kFloat16 : (t == kBFloat16 ? DType::kBFloat16 : DType::kFloat32);
  ORT_FLASH_RETURN_IF_ERROR(c.rank(kGqaQuery, 3, "(batch, sequence, hidden)"));
  d.batch = c.at(kGqaQuery, 0);
  d.sq = c.at(kGqaQuery, 1);
  const int64_t hidden = c.at(kGqaQuery, 2);
  d.packed = !in[kGqaKey].present;
  if (d.packed && in[kGqaValue].present) return c.fail(kGqaValue, "is given without 'key'; give both or neither");
  if (!d.packed && !in[kGqaValue].present) return c.fail(kGqaKey, "is given without 'value'; give both or neither");
  const int64_t parts = d.packed ? d.hq + 2 * d.hkv : d.hq;
  if (hidden >= 0 && hidden % parts != 0) {
    return c.fail(kGqaQuery, "has hidden size " + std::to_string(hidden) + ", not a multiple of " +
                                 (d.packed ? "num_heads + 2 kv_num_heads = " : "num_heads = ") + std::to_string(parts));
  }
  d.d = hidden < 0 ? -1 : hidden / parts;
  if (!d.packed) {
    for (int i : {kGqaKey, kGqaValue}) {
      ORT_FLASH_RETURN_IF_ERROR(c.type(i, t));
      ORT_FLASH_RETURN_IF_ERROR(c.rank(i, 3, "(batch, sequence, kv_num_heads x head size)"));
      ORT_FLASH_RETURN_IF_ERROR(c.dim(i, 0, d.batch, "batch"));
      ORT_FLASH_RETURN_IF_ERROR(c.dim(i, 1, d.sq, "sequence"));
      ORT_FLASH_RETURN_IF_ERROR(c.dim(i, 2, d.d < 0 ? -1 : d.hkv * d.d, "kv_num_heads x head size"));
    }
  }
  if (cuda && d.d > 256) return c.fail(kGqaQuery, "has head size " + std::to_string(d.d) + "; the CUDA kernels take at most 256");
  if (in[kGqaQNorm].present != in[kGqaKNorm].present) {
    return c.fail(kGqaQNorm, "and 'k_norm_weight' must be given together");
  }
  d.qk_norm = in[kGqaQNorm].present;
  for (int i : {kGqaQNorm, kGqaKNorm}) {
    if (!d.qk_norm) break;
    ORT_FLASH_RETURN_IF_ERROR(c.type(i, t));
    ORT_FLASH_RETURN_IF_ERROR(c.rank(i, 1, "(head size)"));
    ORT_FLASH_RETURN_IF_ERROR(c.dim(i, 0, d.d, "head size"));
  }
  if (d.qk_norm && !(a.qk_norm_epsilon >= 0.0f)) return c.fail_node("qk_norm_epsilon must not be negative");
  if (in[kGqaHeadSink].present) {
    ORT_FLASH_RETURN_IF_ERROR(c.type(kGqaHeadSink, t));
    ORT_FLASH_RETURN_IF_ERROR(c.rank(kGqaHeadSink, 1, "(num_heads)"));
    ORT_FLASH_RETURN_IF_ERROR(c.dim(kGqaHeadSink, 0, d.hq, "num_heads"));
  }

  if (in[kGqaPastKey].present != in[kGqaPastValue].present) {
    return c.fail(kGqaPastKey, "and 'past_value' must be given together");
  }
  d.has_past = in[kGqaPastKey].present;
  if (d.has_past) {
    for (int i : {kGqaPastKey, kGqaPastValue}) {
      ORT_FLASH_RETURN_IF_ERROR(c.type(i, t));
      ORT_FLASH_RETURN_IF_ERROR(c.rank(i, 4, "(batch, kv_num_heads, cache length, head size)"));
      ORT_FLASH_RETURN_IF_ERROR(c.dim(i, 0, d.batch, "batch"));
      ORT_FLASH_RETURN_IF_ERROR(c.dim(i, 1, d.hkv, "kv_num_heads"));
      ORT_FLASH_RETURN_IF_ERROR(c.dim(i, 3, d.d, "head size"));
    }
    ORT_FLASH_RETURN_IF_ERROR(c.dim(kGqaPastValue, 2, c.at(kGqaPastKey, 2), "cache length of past_key"));
    d.past_len = c.at(kGqaPastKey, 2);
  }
  d.windowed = a.sliding_window_cache != 0;
  if (d.windowed) {
    if (a.local_window_size <= 0) return c.fail_node("sliding_window_cache=1 needs local_window_size > 0");
    if (!d.has_past) return c.fail(kGqaPastKey, "is required with sliding_window_cache=1 (its length is the cache's)");
    if (d.past_len >= 0 && d.past_len < a.local_window_size) {
      return c.fail(kGqaPastKey, "has cache length " + std::to_string(d.past_len) +
                                     ", less than local_window_size " + std::to_string(a.local_window_size) +
                                     " (sliding_window_cache=1)");
    }
  }

  ORT_FLASH_RETURN_IF_ERROR(c.type(kGqaSeqlensK, kInt32));
  ORT_FLASH_RETURN_IF_ERROR(c.type(kGqaTotalSeqLen, kInt32));
  if (!in[kGqaSeqlensK].present) return c.fail(kGqaSeqlensK, "is required");
  if (!in[kGqaTotalSeqLen].present) return c.fail(kGqaTotalSeqLen, "is required");
  ORT_FLASH_RETURN_IF_ERROR(c.rank(kGqaSeqlensK, 1, "(batch,)"));
  ORT_FLASH_RETURN_IF_ERROR(c.dim(kGqaSeqlensK, 0, d.batch, "batch"));
  const InputDesc& total = in[kGqaTotalSeqLen];
  if (total.rank_known && total.shape.size() > 1) return c.fail(kGqaTotalSeqLen, "has shape " + shape_str(total.shape) + "; expected a scalar or (1,)");
  if (total.rank_known && total.shape.size() == 1 && total.shape[0] >= 0 && total.shape[0] != 1) {
    return c.fail(kGqaTotalSeqLen, "has shape " + shape_str(total.shape) + "; expected a scalar or (1,)");
  }

  if (a.do_rotary) {
    if (!in[kGqaCos].present || !in[kGqaSin].present) return c.fail(kGqaCos, "and 'sin_cache' are required with do_rotary=1");
    for (int i : {kGqaCos, kGqaSin}) {
      ORT_FLASH_RETURN_IF_ERROR(c.type(i, t));
      ORT_FLASH_RETURN_IF_ERROR(c.rank(i, 2, "(max position, rotary dim / 2)"));
    }
    ORT_FLASH_RETURN_IF_ERROR(c.dim(kGqaSin, 0, c.at(kGqaCos, 0), "max position of cos_cache"));
    ORT_FLASH_RETURN_IF_ERROR(c.dim(kGqaSin, 1, c.at(kGqaCos, 1), "rotary dim / 2 of cos_cache"));
    const int64_t half = c.at(kGqaCos, 1);
    d.rotary_dim = half < 0 ? -1 : 2 * half;
    d.max_position = c.at(kGqaCos, 0);
    if (d.rotary_dim >= 0 && d.d >= 0 && (d.rotary_dim > d.d || d.rotary_dim == 0)) {
      return c.fail(kGqaCos, "has shape " + shape_str(in[kGqaCos].shape) + ": rotary dim " +
                                 std::to_string(d.rotary_dim) + " must be in [2, head size " + std::to_string(d.d) + "]");
    }
  }
  // Without do_rotary ONNX Runtime's op reads neither the caches nor position_ids; nor does this one.
  if (a.do_rotary && in[kGqaPositionIds].present) {
    ORT_FLASH_RETURN_IF_ERROR(c.type(kGqaPositionIds, kInt64));
    ORT_FLASH_RETURN_IF_ERROR(c.rank(kGqaPositionIds, 2, "(batch, sequence)"));
    ORT_FLASH_RETURN_IF_ERROR(c.dim(kGqaPositionIds, 0, d.batch, "batch"));
    ORT_FLASH_RETURN_IF_ERROR(c.dim(kGqaPositionIds, 1, d.sq, "sequence"));
    d.has_position_ids = true;
  }
  *out = d;
  return Status::Ok();
}

}  // namespace ort_flash
