#include "gqa_call.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <string>

namespace ort_flash {

Status gqa_phase(const std::string& node, const GqaCall& c, bool* first_prompt) {
  const GqaDims& d = c.dims;
  auto fail = [&](const std::string& what) {
    return Status::Error("GroupQueryAttention node '" + node + "': " + what);
  };
  const int64_t total_max = c.total_sequence_length;
  *first_prompt = d.sq == total_max;
  // Several new tokens after a past (chunked prefill): ONNX Runtime's op takes one batch row only.
  if (!*first_prompt && d.sq > 1 && d.batch != 1) {
    return fail("a call of " + std::to_string(d.sq) + " new tokens after a past (total_sequence_length " +
                std::to_string(total_max) + ") needs batch 1, got " + std::to_string(d.batch));
  }
  if (total_max < d.sq) {
    return fail("input 'total_sequence_length' is " + std::to_string(total_max) + ", less than the " +
                std::to_string(d.sq) + " new tokens");
  }
  return Status::Ok();
}

Status gqa_lengths(const std::string& node, const GqaCall& c, GqaLengths* out) {
  const GqaDims& d = c.dims;
  auto fail = [&](const std::string& what) {
    return Status::Error("GroupQueryAttention node '" + node + "': " + what);
  };
  const int64_t total_max = c.total_sequence_length;
  ORT_FLASH_RETURN_IF_ERROR(gqa_phase(node, c, &out->first_prompt));
  out->total.assign(d.batch, 0);
  out->past.assign(d.batch, 0);
  for (int64_t b = 0; b < d.batch; ++b) {
    const int64_t total = static_cast<int64_t>(c.seqlens_k[b]) + 1;
    const int64_t past = out->first_prompt ? 0 : total - d.sq;
    const std::string row = "input 'seqlens_k'[" + std::to_string(b) + "] is " + std::to_string(total - 1);
    if (total < 1 || total > total_max) {
      return fail(row + "; expected 0 to total_sequence_length - 1 = " + std::to_string(total_max - 1));
    }
    if (past < 0) return fail(row + ": fewer keys than the " + std::to_string(d.sq) + " new tokens");
    if (past + d.sq > c.present_len) {
      return fail(row + ": the new tokens end at " + std::to_string(past + d.sq) + ", past the cache length " +
                  std::to_string(c.present_len));
    }
    out->total[b] = total;
    out->past[b] = past;
  }
  return Status::Ok();
}

namespace {

// Rotates one head row (fp32, in place) by the angle table row (cos, sin) of rotary_dim / 2
// entries: halves (x[i], x[i + R/2]) or interleaved pairs (x[2i], x[2i + 1]); dims past R unchanged.
void rotate(float* x, const float* cos, const float* sin, int64_t rotary_dim, bool interleaved) {
  const int64_t half = rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const float x1 = x[a], x2 = x[b];
    x[a] = x1 * cos[i] - x2 * sin[i];
    x[b] = x2 * cos[i] + x1 * sin[i];
  }
}

// The rotary position of new token s of batch row b, as ONNX Runtime's op takes it: in the first
// prompt s (padding tokens included), or position_ids[0, 0] + s where given (its other entries
// are not read); later, the row's past length + s, or position_ids[b, s].
int64_t position_of(const GqaCall& c, const GqaLengths& len, int64_t b, int64_t s) {
  if (len.first_prompt) return (c.position_ids ? c.position_ids[0] : 0) + s;
  if (c.position_ids) return c.position_ids[b * c.dims.sq + s];
  return len.past[b] + s;
}

}  // namespace

Status run_gqa_cpu(const std::string& node, const GqaCall& c, const ParallelFor& parallel_for) {
  const GqaDims& d = c.dims;
  GqaLengths len;
  ORT_FLASH_RETURN_IF_ERROR(gqa_lengths(node, c, &len));
  const int es = dtype_size(d.dtype);
  const int64_t row = d.d * es;
  const int64_t plen = c.present_len;
  // Element strides of the new tokens' heads: (batch, token, head).
  const int64_t q_row = (d.packed ? d.hq + 2 * d.hkv : d.hq) * d.d;
  const int64_t kv_row = d.packed ? q_row : d.hkv * d.d;
  const char* q_in = static_cast<const char*>(c.query);
  const char* k_in = d.packed ? q_in + d.hq * row : static_cast<const char*>(c.key);
  const char* v_in = d.packed ? q_in + (d.hq + d.hkv) * row : static_cast<const char*>(c.value);
  char* pk = static_cast<char*>(c.present_key);
  char* pv = static_cast<char*>(c.present_value);
  const bool shared = c.past_key == c.present_key && c.past_value == c.present_value;
  // A present of its own: zeros, then each row's past (ONNX Runtime's op does the same).
  if (!shared) {
    const size_t bytes = static_cast<size_t>(d.batch * d.hkv * plen) * row;
    std::memset(pk, 0, bytes);
    std::memset(pv, 0, bytes);
    if (d.has_past) {
      for (int64_t b = 0; b < d.batch; ++b) {
        for (int64_t h = 0; h < d.hkv; ++h) {
          const size_t n = static_cast<size_t>(std::min(len.past[b], d.past_len)) * row;
          const size_t src = static_cast<size_t>((b * d.hkv + h) * d.past_len) * row;
          const size_t dst = static_cast<size_t>((b * d.hkv + h) * plen) * row;
          std::memcpy(pk + dst, static_cast<const char*>(c.past_key) + src, n);
          std::memcpy(pv + dst, static_cast<const char*>(c.past_value) + src, n);
        }
      }
    }
  }

  const bool rotary = c.attrs.do_rotary != 0;
  const bool interleaved = c.attrs.rotary_interleaved != 0;
  std::vector<unsigned char> q_rot;
  if (rotary) q_rot.resize(static_cast<size_t>(d.batch * d.sq * d.hq) * row);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t s = 0; s < d.sq; ++s) {
      const int64_t pos = position_of(c, len, b, s);
      if (rotary && (pos < 0 || pos >= d.max_position)) {
        return Status::Error("GroupQueryAttention node '" + node + "': rotary position " + std::to_string(pos) +
                             " of batch row " + std::to_string(b) + ", token " + std::to_string(s) +
                             " is outside cos_cache's " + std::to_string(d.max_position) + " rows");
      }
    }
  }
  // One task per (batch row, new token): its K and V into the cache, its Q rotated.
  auto tokens = [&](size_t begin, size_t end) {
    std::vector<float> buf(static_cast<size_t>(d.d) + static_cast<size_t>(d.rotary_dim));
    float* x = buf.data();
    float* cs = x + d.d;
    const int64_t half = d.rotary_dim / 2;
    for (size_t t = begin; t < end; ++t) {
      const int64_t b = static_cast<int64_t>(t) / d.sq, s = static_cast<int64_t>(t) % d.sq;
      const int64_t src = (b * d.sq + s);
      const int64_t slot = len.past[b] + s;
      if (rotary) {
        const int64_t pos = position_of(c, len, b, s);
        cpu_row_to_float(d.dtype, static_cast<const char*>(c.cos_cache) + pos * half * es, half, cs);
        cpu_row_to_float(d.dtype, static_cast<const char*>(c.sin_cache) + pos * half * es, half, cs + half);
      }
      for (int64_t h = 0; h < d.hkv; ++h) {
        const char* k = k_in + (src * kv_row + h * d.d) * es;
        char* dst = pk + ((b * d.hkv + h) * plen + slot) * row;
        if (rotary) {
          cpu_row_to_float(d.dtype, k, d.d, x);
          rotate(x, cs, cs + half, d.rotary_dim, interleaved);
          cpu_row_from_float(d.dtype, x, d.d, dst);
        } else {
          std::memcpy(dst, k, row);
        }
        std::memcpy(pv + ((b * d.hkv + h) * plen + slot) * row, v_in + (src * kv_row + h * d.d) * es, row);
      }
      if (!rotary) continue;
      for (int64_t h = 0; h < d.hq; ++h) {
        cpu_row_to_float(d.dtype, q_in + (src * q_row + h * d.d) * es, d.d, x);
        rotate(x, cs, cs + half, d.rotary_dim, interleaved);
        cpu_row_from_float(d.dtype, x, d.d, q_rot.data() + (src * d.hq + h) * row);
      }
    }
  };
  try {
    if (parallel_for) {
      parallel_for(static_cast<size_t>(d.batch * d.sq), tokens);
    } else {
      tokens(0, static_cast<size_t>(d.batch * d.sq));
    }
  } catch (const std::exception& e) {
    return Status::Error("GroupQueryAttention node '" + node + "': " + e.what());
  }

  if (gqa_attends_nothing(c)) {
    std::memset(c.output, 0, static_cast<size_t>(d.batch * d.sq * d.hq) * row);
    return Status::Ok();
  }
  // The key mask only where a row is shorter than the prompt (the host knows the lengths here).
  std::vector<unsigned char> key_mask;
  if (gqa_needs_key_mask(c, len.first_prompt) &&
      std::any_of(len.total.begin(), len.total.end(), [&](int64_t t) { return t < d.sq; })) {
    key_mask.assign(static_cast<size_t>(d.batch * plen), 0);
    for (int64_t b = 0; b < d.batch; ++b) std::memset(key_mask.data() + b * plen, 1, static_cast<size_t>(len.total[b]));
  }
  const FlashParams p = gqa_flash_params(c, len.first_prompt, rotary ? q_rot.data() : c.query, len.total.data(),
                                         key_mask.empty() ? nullptr : key_mask.data());
  try {
    run_flash_cpu(p, parallel_for);
  } catch (const std::exception& e) {
    return Status::Error("GroupQueryAttention node '" + node + "': CPU kernel failed: " + e.what());
  }
  return Status::Ok();
}

FlashParams gqa_flash_params(const GqaCall& c, bool first_prompt, const void* q, const int64_t* totals,
                             const void* key_mask) {
  const GqaDims& d = c.dims;
  const int64_t plen = c.present_len;
  const int64_t q_row = (d.packed ? d.hq + 2 * d.hkv : d.hq) * d.d;
  FlashParams p;
  p.dtype = d.dtype;
  p.batch = d.batch;
  p.hq = d.hq;
  p.hkv = d.hkv;
  p.sq = d.sq;
  p.skv = plen;
  p.d = p.dv = d.d;
  p.q = q;
  if (c.attrs.do_rotary != 0) {  // the rotated copy
    p.q_stride[0] = d.sq * d.hq * d.d; p.q_stride[1] = d.d; p.q_stride[2] = d.hq * d.d;
  } else {
    p.q_stride[0] = d.sq * q_row; p.q_stride[1] = d.d; p.q_stride[2] = q_row;
  }
  p.k = c.present_key;
  p.v = c.present_value;
  for (int64_t* st : {p.k_stride, p.v_stride}) {
    st[0] = d.hkv * plen * d.d; st[1] = plen * d.d; st[2] = d.d;
  }
  p.y = c.output;
  p.y_stride[0] = d.sq * d.hq * d.d; p.y_stride[1] = d.d; p.y_stride[2] = d.hq * d.d;
  p.scale = c.attrs.scale > 0.0f ? c.attrs.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.d)));
  p.softcap = c.attrs.softcap;
  p.causal = c.attrs.causal != 0;
  // A window of W keys: the query's own and the W - 1 before it (W = 0: gqa_attends_nothing).
  const int64_t window = c.attrs.local_window_size;
  p.window_left = window > 0 ? window - 1 : -1;
  // Row s of batch row b sees keys j < T_b, causally up to its position: past_b + s later (the
  // kernel's bottom-right alignment on the row's total length T_b), s in the first prompt, where
  // the padding rows (s >= T_b) keep s too. There the row lengths are a key mask.
  if (!gqa_needs_key_mask(c, first_prompt)) {
    p.seqlens_k = totals;
  } else if (key_mask) {
    p.mask = key_mask;
    p.mask_kind = MaskKind::kBool;
    p.mask_stride[0] = plen; p.mask_stride[1] = 0; p.mask_stride[2] = 0; p.mask_stride[3] = 1;
    p.mask_len = plen;
  }
  return p;
}

}  // namespace ort_flash
