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
  const int64_t window = c.attrs.local_window_size;
  const int64_t cap = c.present_len;
  // Rows a windowed cache keeps after `t` tokens (gqa_shapes.h).
  auto kept = [&](int64_t t) {
    const int64_t g = cap - window + 1;
    return t <= cap ? t : t - g * ((t - cap + g - 1) / g);
  };
  for (auto* v : {&out->total, &out->past, &out->row0, &out->keys, &out->kept}) v->assign(d.batch, 0);
  for (int64_t b = 0; b < d.batch; ++b) {
    const int64_t total = static_cast<int64_t>(c.seqlens_k[b]) + 1;
    const int64_t past = out->first_prompt ? 0 : total - d.sq;
    const std::string row = "input 'seqlens_k'[" + std::to_string(b) + "] is " + std::to_string(total - 1);
    if (total < 1 || total > total_max) {
      return fail(row + "; expected 0 to total_sequence_length - 1 = " + std::to_string(total_max - 1));
    }
    if (past < 0) return fail(row + ": fewer keys than the " + std::to_string(d.sq) + " new tokens");
    out->total[b] = total;
    out->past[b] = past;
    if (!d.windowed) {
      if (past + d.sq > cap) {
        return fail(row + ": the new tokens end at " + std::to_string(past + d.sq) + ", past the cache length " +
                    std::to_string(cap));
      }
      out->row0[b] = past;
      out->keys[b] = total;
      continue;
    }
    // A windowed cache keeps no padding: a first prompt's rows are all full (as ONNX Runtime's op).
    if (out->first_prompt && total != d.sq) {
      return fail(row + ": a right-padded prompt (a row shorter than the " + std::to_string(d.sq) +
                  " tokens) cannot go into a windowed cache (sliding_window_cache=1)");
    }
    out->row0[b] = kept(past);
    out->keys[b] = out->row0[b] + d.sq;
    out->kept[b] = kept(total);
    out->compact = out->compact || out->keys[b] > cap;
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

// The RMS norm of one head row (fp32, in place): x / sqrt(mean(x^2) + eps) * w.
void rms_norm(float* x, const float* w, int64_t d, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
  for (int64_t i = 0; i < d; ++i) x[i] = x[i] * r * w[i];
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
  // A present of its own: zeros (ONNX Runtime's op does the same), then each row's past.
  if (!shared) {
    const size_t bytes = static_cast<size_t>(d.batch * d.hkv * plen) * row;
    std::memset(pk, 0, bytes);
    std::memset(pv, 0, bytes);
  }
  // The buffer attention reads: present, or where a windowed cache overflows, a staging buffer
  // of its kept rows and the new tokens, compacted into present afterwards.
  int64_t klen = plen;
  std::vector<unsigned char> staged;
  char* kb = pk;
  char* vb = pv;
  if (len.compact) {
    klen = *std::max_element(len.keys.begin(), len.keys.end());
    staged.resize(2 * static_cast<size_t>(d.batch * d.hkv * klen) * row);
    kb = reinterpret_cast<char*>(staged.data());
    vb = kb + static_cast<size_t>(d.batch * d.hkv * klen) * row;
  }
  if (!shared || len.compact) {  // each row's past rows [0, row0) into the buffer
    for (int64_t b = 0; b < d.batch && d.has_past; ++b) {
      for (int64_t h = 0; h < d.hkv; ++h) {
        const size_t n = static_cast<size_t>(std::min(len.row0[b], d.past_len)) * row;
        const size_t src = static_cast<size_t>((b * d.hkv + h) * d.past_len) * row;
        const size_t dst = static_cast<size_t>((b * d.hkv + h) * klen) * row;
        std::memcpy(kb + dst, static_cast<const char*>(c.past_key) + src, n);
        std::memcpy(vb + dst, static_cast<const char*>(c.past_value) + src, n);
      }
    }
  }

  const bool rotary = c.attrs.do_rotary != 0;
  const bool interleaved = c.attrs.rotary_interleaved != 0;
  const bool norm = c.q_norm != nullptr;
  const bool q_copy = gqa_q_copied(c);
  std::vector<unsigned char> q_rot;  // Q rotated and/or normed
  if (q_copy) q_rot.resize(static_cast<size_t>(d.batch * d.sq * d.hq) * row);
  std::vector<float> norm_w;  // the Q weight, then the K weight
  if (norm) {
    norm_w.resize(2 * static_cast<size_t>(d.d));
    cpu_row_to_float(d.dtype, c.q_norm, d.d, norm_w.data());
    cpu_row_to_float(d.dtype, c.k_norm, d.d, norm_w.data() + d.d);
  }
  const float eps = c.attrs.qk_norm_epsilon;
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
      const int64_t slot = len.row0[b] + s;
      if (rotary) {
        const int64_t pos = position_of(c, len, b, s);
        cpu_row_to_float(d.dtype, static_cast<const char*>(c.cos_cache) + pos * half * es, half, cs);
        cpu_row_to_float(d.dtype, static_cast<const char*>(c.sin_cache) + pos * half * es, half, cs + half);
      }
      for (int64_t h = 0; h < d.hkv; ++h) {
        const char* k = k_in + (src * kv_row + h * d.d) * es;
        char* dst = kb + ((b * d.hkv + h) * klen + slot) * row;
        if (rotary || norm) {
          cpu_row_to_float(d.dtype, k, d.d, x);
          if (norm) rms_norm(x, norm_w.data() + d.d, d.d, eps);
          if (rotary) rotate(x, cs, cs + half, d.rotary_dim, interleaved);
          cpu_row_from_float(d.dtype, x, d.d, dst);
        } else {
          std::memcpy(dst, k, row);
        }
        std::memcpy(vb + ((b * d.hkv + h) * klen + slot) * row, v_in + (src * kv_row + h * d.d) * es, row);
      }
      if (!q_copy) continue;
      for (int64_t h = 0; h < d.hq; ++h) {
        cpu_row_to_float(d.dtype, q_in + (src * q_row + h * d.d) * es, d.d, x);
        if (norm) rms_norm(x, norm_w.data(), d.d, eps);
        if (rotary) rotate(x, cs, cs + half, d.rotary_dim, interleaved);
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
    key_mask.assign(static_cast<size_t>(d.batch * klen), 0);
    for (int64_t b = 0; b < d.batch; ++b) std::memset(key_mask.data() + b * klen, 1, static_cast<size_t>(len.total[b]));
  }
  const GqaKeys keys{kb, vb, klen, len.keys.data(), key_mask.empty() ? nullptr : key_mask.data()};
  FlashParams p = gqa_flash_params(c, len.first_prompt, q_copy ? q_rot.data() : c.query, q_copy, keys);
  // Attention sinks: head_sink per query head, or smooth_softmax=1's sink of 0 (head_sink wins,
  // as in ONNX Runtime's op).
  std::vector<float> sink;
  if (c.head_sink != nullptr) {
    sink.resize(static_cast<size_t>(d.hq));
    cpu_row_to_float(d.dtype, c.head_sink, d.hq, sink.data());
  } else if (c.attrs.smooth_softmax == 1) {
    sink.assign(static_cast<size_t>(d.hq), 0.0f);
  }
  if (!sink.empty()) p.sink = sink.data();
  try {
    run_flash_cpu(p, parallel_for);
  } catch (const std::exception& e) {
    return Status::Error("GroupQueryAttention node '" + node + "': CPU kernel failed: " + e.what());
  }
  if (!len.compact) return Status::Ok();
  // Present keeps each row's kept most recent positions, from row 0.
  for (int64_t b = 0; b < d.batch; ++b) {
    const size_t n = static_cast<size_t>(len.kept[b]) * row;
    const size_t from = static_cast<size_t>(len.keys[b] - len.kept[b]) * row;
    for (int64_t h = 0; h < d.hkv; ++h) {
      std::memcpy(pk + static_cast<size_t>((b * d.hkv + h) * plen) * row, kb + static_cast<size_t>((b * d.hkv + h) * klen) * row + from, n);
      std::memcpy(pv + static_cast<size_t>((b * d.hkv + h) * plen) * row, vb + static_cast<size_t>((b * d.hkv + h) * klen) * row + from, n);
    }
  }
  return Status::Ok();
}

FlashParams gqa_flash_params(const GqaCall& c, bool first_prompt, const void* q, bool q_copied, const GqaKeys& keys) {
  const GqaDims& d = c.dims;
  const int64_t q_row = (d.packed ? d.hq + 2 * d.hkv : d.hq) * d.d;
  FlashParams p;
  p.dtype = d.dtype;
  p.batch = d.batch;
  p.hq = d.hq;
  p.hkv = d.hkv;
  p.sq = d.sq;
  p.skv = keys.len;
  p.d = p.dv = d.d;
  p.q = q;
  if (q_copied) {  // the rotated or normed copy
    p.q_stride[0] = d.sq * d.hq * d.d; p.q_stride[1] = d.d; p.q_stride[2] = d.hq * d.d;
  } else {
    p.q_stride[0] = d.sq * q_row; p.q_stride[1] = d.d; p.q_stride[2] = q_row;
  }
  p.k = keys.k;
  p.v = keys.v;
  for (int64_t* st : {p.k_stride, p.v_stride}) {
    st[0] = d.hkv * keys.len * d.d; st[1] = keys.len * d.d; st[2] = d.d;
  }
  p.y = c.output;
  p.y_stride[0] = d.sq * d.hq * d.d; p.y_stride[1] = d.d; p.y_stride[2] = d.hq * d.d;
  p.scale = c.attrs.scale > 0.0f ? c.attrs.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.d)));
  p.softcap = c.attrs.softcap;
  p.causal = c.attrs.causal != 0;
  p.fp8 = c.attrs.fp8;  // on CUDA where the FP8 path takes the call (a first prompt), else a notice
  // A window of W keys: the query's own and the W - 1 before it (W = 0: gqa_attends_nothing).
  const int64_t window = c.attrs.local_window_size;
  p.window_left = window > 0 ? window - 1 : -1;
  // Row s of batch row b sees its row's keys j < counts_b, causally up to its own: row0_b + s
  // later (the kernel's bottom-right alignment on the row's key count), s in the first prompt,
  // where the padding rows (s >= T_b) keep s too. There the row lengths are a key mask and the same
  // counts as a key bound (the CUDA Gluon kernels take the bound, every other kernel the mask), or,
  // where every row holds S = total_sequence_length tokens (no mask given), a plain causal call
  // over the first S keys: the kernels without a key bound.
  if (!gqa_needs_key_mask(c, first_prompt)) {
    p.seqlens_k = keys.counts;
  } else if (keys.mask) {
    p.key_bound = keys.counts;
    p.mask = keys.mask;
    p.mask_kind = MaskKind::kBool;
    p.mask_stride[0] = keys.len; p.mask_stride[1] = 0; p.mask_stride[2] = 0; p.mask_stride[3] = 1;
    p.mask_len = keys.len;
  } else {
    p.skv = std::min<int64_t>(keys.len, c.total_sequence_length);
  }
  return p;
}

}  // namespace ort_flash
