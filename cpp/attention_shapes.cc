#include "attention_shapes.h"

#include <sstream>
#include <utility>

namespace ort_flash {

const char* const kInputNames[kNumInputs] = {"Q", "K", "V", "attn_mask", "past_key", "past_value",
                                             "nonpad_kv_seqlen"};
const char* const kOutputNames[kNumOutputs] = {"Y", "present_key", "present_value", "softmax_lse"};

namespace {
constexpr int kFloat = 1, kBool = 9, kFloat16 = 10, kBFloat16 = 16, kInt64 = 7;
}  // namespace

std::string type_name(int t) {
  switch (t) {
    case kFloat: return "float32";
    case kFloat16: return "float16";
    case kBFloat16: return "bfloat16";
    case kBool: return "bool";
    case kInt64: return "int64";
    case 11: return "float64";
    case 6: return "int32";
    default: return "type " + std::to_string(t);
  }
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "(";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << (s[i] < 0 ? std::string("?") : std::to_string(s[i]));
  o << ")";
  return o.str();
}

namespace {

class Checker {
 public:
  Checker(const std::string& node, const InputDesc (&in)[kNumInputs]) : node_(node), in_(in) {}
  Status fail(int input, const std::string& what) const {
    return Status::Error("FlashAttention node '" + node_ + "': input '" + kInputNames[input] +
                         "' " + what);
  }
  Status fail_attr(const std::string& what) const {
    return Status::Error("FlashAttention node '" + node_ + "': " + what);
  }
  // a == b unless either is unknown
  static bool same(int64_t a, int64_t b) { return a < 0 || b < 0 || a == b; }
  Status dim_eq(int input, int axis, int64_t want, const char* meaning) const {
    const int64_t got = in_[input].shape[axis];
    if (same(got, want)) return Status::Ok();
    return fail(input, "has shape " + shape_str(in_[input].shape) + ": dim " + std::to_string(axis) +
                           " (" + meaning + ") is " + std::to_string(got) + ", expected " + std::to_string(want));
  }

 private:
  const std::string& node_;
  const InputDesc (&in_)[kNumInputs];
};

int64_t div_or_unknown(int64_t a, int64_t b) { return (a < 0 || b <= 0) ? -1 : a / b; }

Status validate_packed(const Checker& c, const Attributes& attrs, const InputDesc (&in)[kNumInputs],
                       AttentionDims* out);
Status validate_kv_packed(const Checker& c, const Attributes& attrs, const InputDesc (&in)[kNumInputs],
                          AttentionDims* out);
Status validate_common(const Checker& c, const InputDesc (&in)[kNumInputs], bool cuda, AttentionDims* out);

}  // namespace

int onnx_type_of(DType t) {
  return t == DType::kFloat32 ? kFloat : (t == DType::kFloat16 ? kFloat16 : kBFloat16);
}

std::vector<int64_t> AttentionDims::y_shape() const {
  if (rank == 3) return {batch, sq, (hq < 0 || dv < 0) ? -1 : hq * dv};
  return {batch, hq, sq, dv};
}

std::vector<int64_t> AttentionDims::present_shape(bool value) const {
  return {batch, hkv, total(), value ? dv : d};
}

Status validate(const std::string& node, const Attributes& attrs, const InputDesc (&in)[kNumInputs],
                bool cuda, AttentionDims* out) {
  Checker c(node, in);
  AttentionDims& r = *out;
  if (!in[kQ].present) return c.fail(kQ, "is required");
  if (!in[kK].present && in[kV].present) {
    return c.fail(kK, "is missing; V cannot be given without K (K and V both omitted: Q is packed QKV; "
                      "V alone omitted: K is packed KV)");
  }
  r.packed = !in[kK].present;
  r.kv_packed = in[kK].present && !in[kV].present;
  // Types.
  const int qt = in[kQ].elem_type;
  if (qt == kFloat) r.dtype = DType::kFloat32;
  else if (qt == kFloat16) r.dtype = DType::kFloat16;
  else if (qt == kBFloat16) r.dtype = DType::kBFloat16;
  else if (qt != 0) return c.fail(kQ, "is " + type_name(qt) + "; expected float32, float16 or bfloat16");
  for (int i : {kK, kV, kPastKey, kPastValue}) {
    if (in[i].present && in[i].elem_type != 0 && qt != 0 && in[i].elem_type != qt) {
      return c.fail(i, "is " + type_name(in[i].elem_type) + "; expected " + type_name(qt) + " like Q");
    }
  }
  if (in[kMask].present && in[kMask].elem_type != 0 && qt != 0 && in[kMask].elem_type != kBool &&
      in[kMask].elem_type != qt) {
    return c.fail(kMask, "is " + type_name(in[kMask].elem_type) + "; expected bool or " + type_name(qt) + " like Q");
  }
  if (in[kNonpad].present && in[kNonpad].elem_type != 0 && in[kNonpad].elem_type != kInt64) {
    return c.fail(kNonpad, "is " + type_name(in[kNonpad].elem_type) + "; expected int64");
  }
  if (in[kMask].present) r.mask_kind = in[kMask].elem_type == kBool ? MaskKind::kBool : MaskKind::kAdditive;

  // Attributes.
  auto num = [](double v) { std::ostringstream o; o << v; return o.str(); };
  if (attrs.is_causal != 0 && attrs.is_causal != 1) {
    return c.fail_attr("attribute is_causal is " + std::to_string(attrs.is_causal) + "; expected 0 or 1");
  }
  if (!(attrs.softcap >= 0.0f) || std::isinf(attrs.softcap)) {
    return c.fail_attr("attribute softcap is " + num(attrs.softcap) + "; expected a finite value >= 0 (0 = off)");
  }
  for (auto [name, w] : {std::pair<const char*, int64_t>{"left_window_size", attrs.left_window},
                         {"right_window_size", attrs.right_window}}) {
    if (w < -1) return c.fail_attr(std::string("attribute ") + name + " is " + std::to_string(w) + "; expected -1 (unbounded) or >= 0");
  }
  if (!std::isnan(attrs.scale) && !std::isfinite(attrs.scale)) {
    return c.fail_attr("attribute scale is " + num(attrs.scale) + "; expected a finite value");
  }

  // Layout and heads.
  if (r.packed) {
    ORT_FLASH_RETURN_IF_ERROR(validate_packed(c, attrs, in, &r));
    if (!in[kQ].rank_known) return Status::Ok();  // checked at run time
    return validate_common(c, in, cuda, &r);
  }
  if (r.kv_packed) {
    ORT_FLASH_RETURN_IF_ERROR(validate_kv_packed(c, attrs, in, &r));
    if (!in[kQ].rank_known || !in[kK].rank_known) return Status::Ok();  // checked at run time
    return validate_common(c, in, cuda, &r);
  }
  if (!in[kQ].rank_known || !in[kK].rank_known || !in[kV].rank_known) return Status::Ok();  // checked at run time
  const auto& qs = in[kQ].shape;
  const auto& ks = in[kK].shape;
  const auto& vs = in[kV].shape;
  r.rank = static_cast<int>(qs.size());
  if (r.rank != 3 && r.rank != 4) {
    return c.fail(kQ, "has shape " + shape_str(qs) + "; expected 4-D (B, Hq, Sq, D) or 3-D (B, Sq, Hq*D)");
  }
  for (int i : {kK, kV}) {
    if (static_cast<int>(in[i].shape.size()) != r.rank) {
      return c.fail(i, "has rank " + std::to_string(in[i].shape.size()) + "; expected rank " +
                           std::to_string(r.rank) + " like Q");
    }
  }
  r.batch = qs[0];
  if (r.rank == 4) {
    r.hq = qs[1]; r.sq = qs[2]; r.d = qs[3];
    r.hkv = ks[1]; r.skv_new = ks[2];
    r.dv = vs[3];
    if (attrs.q_num_heads > 0 && !Checker::same(attrs.q_num_heads, r.hq)) {
      return c.fail_attr("attribute q_num_heads=" + std::to_string(attrs.q_num_heads) +
                         " disagrees with Q's head axis (" + std::to_string(r.hq) + ")");
    }
    if (attrs.kv_num_heads > 0 && !Checker::same(attrs.kv_num_heads, r.hkv)) {
      return c.fail_attr("attribute kv_num_heads=" + std::to_string(attrs.kv_num_heads) +
                         " disagrees with K's head axis (" + std::to_string(r.hkv) + ")");
    }
    ORT_FLASH_RETURN_IF_ERROR(c.dim_eq(kK, 3, r.d, "head size, like Q's"));
    ORT_FLASH_RETURN_IF_ERROR(c.dim_eq(kV, 1, r.hkv, "kv heads, like K's"));
  } else {
    if (attrs.q_num_heads <= 0 || attrs.kv_num_heads <= 0) {
      return c.fail_attr("3-D Q, K, V need the attributes q_num_heads and kv_num_heads (got " +
                         std::to_string(attrs.q_num_heads) + ", " + std::to_string(attrs.kv_num_heads) + ")");
    }
    r.hq = attrs.q_num_heads; r.hkv = attrs.kv_num_heads;
    r.sq = qs[1]; r.skv_new = ks[1];
    if (qs[2] >= 0 && qs[2] % r.hq != 0) return c.fail(kQ, "hidden size " + std::to_string(qs[2]) + " is not a multiple of q_num_heads=" + std::to_string(r.hq));
    if (ks[2] >= 0 && ks[2] % r.hkv != 0) return c.fail(kK, "hidden size " + std::to_string(ks[2]) + " is not a multiple of kv_num_heads=" + std::to_string(r.hkv));
    if (vs[2] >= 0 && vs[2] % r.hkv != 0) return c.fail(kV, "hidden size " + std::to_string(vs[2]) + " is not a multiple of kv_num_heads=" + std::to_string(r.hkv));
    r.d = div_or_unknown(qs[2], r.hq);
    r.dv = div_or_unknown(vs[2], r.hkv);
    const int64_t dk = div_or_unknown(ks[2], r.hkv);
    if (!Checker::same(dk, r.d)) {
      return c.fail(kK, "has head size " + std::to_string(dk) + " (hidden " + std::to_string(ks[2]) +
                            " / kv_num_heads " + std::to_string(r.hkv) + "); expected Q's head size " + std::to_string(r.d));
    }
  }
  ORT_FLASH_RETURN_IF_ERROR(c.dim_eq(kK, 0, r.batch, "batch, like Q's"));
  ORT_FLASH_RETURN_IF_ERROR(c.dim_eq(kV, 0, r.batch, "batch, like Q's"));
  ORT_FLASH_RETURN_IF_ERROR(c.dim_eq(kV, r.rank == 4 ? 2 : 1, r.skv_new, "kv sequence, like K's"));
  return validate_common(c, in, cuda, &r);
}

namespace {

// What both packed forms ask first: no KV cache (present = past ++ new needs K and V apart) and
// the head attributes (the 3-D layout's); `form` names the form in the messages.
Status packed_heads(const Checker& c, const Attributes& attrs, const InputDesc (&in)[kNumInputs],
                    const std::string& form, AttentionDims* out) {
  if (in[kPastKey].present || in[kPastValue].present) {
    return c.fail(in[kPastKey].present ? kPastKey : kPastValue,
                  "cannot be combined with " + form + ": a KV cache needs K and V inputs");
  }
  if (attrs.q_num_heads <= 0 || attrs.kv_num_heads <= 0) {
    return c.fail_attr(form + " needs the attributes q_num_heads and kv_num_heads (got " +
                       std::to_string(attrs.q_num_heads) + ", " + std::to_string(attrs.kv_num_heads) + ")");
  }
  out->hq = attrs.q_num_heads; out->hkv = attrs.kv_num_heads;
  out->rank = 3;
  return Status::Ok();
}

// Packed QKV (K and V omitted): Q is (B, S, (Hq + 2 Hkv) * D), each token's Hq query heads, then
// its Hkv key heads, then its Hkv value heads, every head D wide (ONNX Runtime's Attention op
// packs its QKV projection so). Keys are the same tokens as the queries: no KV cache.
Status validate_packed(const Checker& c, const Attributes& attrs, const InputDesc (&in)[kNumInputs],
                       AttentionDims* out) {
  AttentionDims& r = *out;
  ORT_FLASH_RETURN_IF_ERROR(packed_heads(c, attrs, in, "packed QKV (K and V omitted)", &r));
  if (!in[kQ].rank_known) return Status::Ok();
  const auto& qs = in[kQ].shape;
  const int64_t heads = r.hq + 2 * r.hkv;
  if (qs.size() != 3) {
    return c.fail(kQ, "has shape " + shape_str(qs) + "; with K and V omitted (packed QKV) expected 3-D (B, S, (" +
                          std::to_string(r.hq) + " + 2*" + std::to_string(r.hkv) + ") * D)");
  }
  r.batch = qs[0]; r.sq = qs[1]; r.skv_new = qs[1];
  if (qs[2] >= 0 && qs[2] % heads != 0) {
    return c.fail(kQ, "packed QKV width " + std::to_string(qs[2]) + " is not a multiple of q_num_heads + 2*kv_num_heads = " +
                          std::to_string(heads));
  }
  r.d = r.dv = div_or_unknown(qs[2], heads);
  if (r.d >= 0 && r.d % 8 != 0) {
    return c.fail(kQ, "packed QKV has head size " + std::to_string(r.d) +
                          "; packed QKV needs a multiple of 8 (each of Q, K and V then starts 16-byte aligned)");
  }
  return Status::Ok();
}

// Packed KV (V omitted, K given): Q is 3-D (B, Sq, Hq * D) and K is (B, Skv, 2 * Hkv * D), each
// key token's Hkv key heads, then its Hkv value heads, every head D wide. No KV cache.
Status validate_kv_packed(const Checker& c, const Attributes& attrs, const InputDesc (&in)[kNumInputs],
                          AttentionDims* out) {
  AttentionDims& r = *out;
  ORT_FLASH_RETURN_IF_ERROR(packed_heads(c, attrs, in, "packed KV (V omitted)", &r));
  if (!in[kQ].rank_known || !in[kK].rank_known) return Status::Ok();
  const auto& qs = in[kQ].shape;
  const auto& ks = in[kK].shape;
  if (qs.size() != 3) {
    return c.fail(kQ, "has shape " + shape_str(qs) + "; with V omitted (packed KV) expected 3-D (B, Sq, " +
                          std::to_string(r.hq) + " * D)");
  }
  if (ks.size() != 3) {
    return c.fail(kK, "has shape " + shape_str(ks) + "; with V omitted (packed KV) expected 3-D (B, Skv, 2*" +
                          std::to_string(r.hkv) + " * D)");
  }
  r.batch = qs[0]; r.sq = qs[1]; r.skv_new = ks[1];
  if (qs[2] >= 0 && qs[2] % r.hq != 0) {
    return c.fail(kQ, "hidden size " + std::to_string(qs[2]) + " is not a multiple of q_num_heads=" + std::to_string(r.hq));
  }
  r.d = r.dv = div_or_unknown(qs[2], r.hq);
  if (ks[2] >= 0 && r.d >= 0 && ks[2] != 2 * r.hkv * r.d) {
    return c.fail(kK, "has shape " + shape_str(ks) + "; with V omitted (packed KV) its last dim holds K and V: "
                          "expected 2 * kv_num_heads * D = 2*" + std::to_string(r.hkv) + "*" + std::to_string(r.d) +
                          " = " + std::to_string(2 * r.hkv * r.d));
  }
  if (r.d >= 0 && r.d % 8 != 0) {
    return c.fail(kQ, "has head size " + std::to_string(r.d) +
                          "; packed KV needs a multiple of 8 (K and V then start 16-byte aligned)");
  }
  return c.dim_eq(kK, 0, r.batch, "batch, like Q's");
}

// What both layouts check once the dimensions are known: heads, head size, cache, lengths, mask.
Status validate_common(const Checker& c, const InputDesc (&in)[kNumInputs], bool cuda, AttentionDims* out) {
  AttentionDims& r = *out;
  if (r.hq == 0 || r.hkv == 0) return c.fail(r.hq == 0 ? kQ : kK, "has zero heads");
  if (r.hq > 0 && r.hkv > 0 && r.hq % r.hkv != 0) {
    return c.fail(kK, "has " + std::to_string(r.hkv) + " heads; Q's " + std::to_string(r.hq) +
                          " heads must be a multiple of them (GQA/MQA)");
  }
  if (cuda && (r.d > 256 || r.dv > 256)) {
    return c.fail(r.d > 256 ? kQ : kV, "has head size " + std::to_string(r.d > 256 ? r.d : r.dv) +
                                           "; the CUDA kernels support head sizes up to 256");
  }

  // Cache.
  if (in[kPastKey].present != in[kPastValue].present) {
    return c.fail(in[kPastKey].present ? kPastValue : kPastKey, "is missing; past_key and past_value go together");
  }
  if (in[kPastKey].present) {
    if (in[kNonpad].present) return c.fail(kNonpad, "cannot be combined with past_key/past_value (ONNX Attention)");
    r.has_past = true;
    for (int i : {kPastKey, kPastValue}) {
      if (!in[i].rank_known) continue;
      if (in[i].shape.size() != 4) {
        return c.fail(i, "has shape " + shape_str(in[i].shape) + "; expected 4-D (B, Hkv, P, " +
                             (i == kPastKey ? "D)" : "Dv)"));
      }
      ORT_FLASH_RETURN_IF_ERROR(c.dim_eq(i, 0, r.batch, "batch, like Q's"));
      ORT_FLASH_RETURN_IF_ERROR(c.dim_eq(i, 1, r.hkv, "kv heads"));
      ORT_FLASH_RETURN_IF_ERROR(c.dim_eq(i, 3, i == kPastKey ? r.d : r.dv, i == kPastKey ? "head size D" : "value head size Dv"));
    }
    r.past = in[kPastKey].rank_known ? in[kPastKey].shape[2] : -1;
    if (in[kPastValue].rank_known) ORT_FLASH_RETURN_IF_ERROR(c.dim_eq(kPastValue, 2, r.past, "past length, like past_key's"));
  }
  if (in[kNonpad].present && in[kNonpad].rank_known) {
    if (in[kNonpad].shape.size() != 1) return c.fail(kNonpad, "has shape " + shape_str(in[kNonpad].shape) + "; expected (B,)");
    ORT_FLASH_RETURN_IF_ERROR(c.dim_eq(kNonpad, 0, r.batch, "batch"));
  }

  // Mask: rank 1-4, right-aligned broadcast to (B, Hq, Sq, total) (rank 1: one row of keys for
  // every query, as ONNX Attention broadcasts it); a shorter last dim is padded with -inf/false.
  if (in[kMask].present && in[kMask].rank_known) {
    const auto& ms = in[kMask].shape;
    if (ms.size() < 1 || ms.size() > 4) {
      return c.fail(kMask, "has shape " + shape_str(ms) + "; expected rank 1 to 4, broadcastable to (B, Hq, Sq, total_kv)");
    }
    r.mask_shape.assign(4 - ms.size(), 1);
    r.mask_shape.insert(r.mask_shape.end(), ms.begin(), ms.end());
    const int64_t target[3] = {r.batch, r.hq, r.sq};
    const char* names[3] = {"batch", "q heads", "q sequence"};
    for (int a = 0; a < 3; ++a) {
      const int64_t m = r.mask_shape[a];
      if (m != 1 && !Checker::same(m, target[a])) {
        return c.fail(kMask, "has shape " + shape_str(ms) + ", which does not broadcast to (B, Hq, Sq, total_kv) = " +
                                 shape_str({r.batch, r.hq, r.sq, r.total()}) + ": its " + names[a] +
                                 " axis is " + std::to_string(m) + ", expected 1 or " + std::to_string(target[a]));
      }
    }
    const int64_t last = r.mask_shape[3];
    if (last >= 0 && r.total() >= 0 && last > r.total()) {
      return c.fail(kMask, "has shape " + shape_str(ms) + ": its key axis (" + std::to_string(last) +
                               ") is longer than the keys attended (" + std::to_string(r.total()) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

}  // namespace ort_flash
