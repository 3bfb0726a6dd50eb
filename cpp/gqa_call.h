// One GroupQueryAttention call with its concrete values, and how it maps onto FlashParams:
// which cache positions the new tokens go to, their rotary positions, and the attention that
// then runs over the present buffer. The semantics are ONNX Runtime's op's
// (ort_flash/reference_gqa.py holds them as a float64 reference).
#pragma once

#include <cstdint>
#include <vector>

#include "cpu_flash.h"
#include "flash_params.h"
#include "gqa_shapes.h"
#include "status.h"

namespace ort_flash {

struct GqaCall {
  GqaDims dims;
  GqaAttributes attrs;
  const void* query = nullptr;
  const void* key = nullptr;    // null: packed QKV in query
  const void* value = nullptr;
  const void* past_key = nullptr;
  const void* past_value = nullptr;
  const int32_t* seqlens_k = nullptr;  // (B,): total length - 1 per batch row
  int32_t total_sequence_length = 0;
  const void* cos_cache = nullptr;
  const void* sin_cache = nullptr;
  const int64_t* position_ids = nullptr;  // (B, S) or null
  const void* head_sink = nullptr;        // (Hq,) in the query's type, or null
  const void* q_norm = nullptr;           // (D,) in the query's type, or null: the Q heads' RMS norm
  const void* k_norm = nullptr;           // (D,), given with q_norm: the new K heads' RMS norm
  void* output = nullptr;
  void* present_key = nullptr;
  void* present_value = nullptr;
  int64_t present_len = 0;  // present's sequence length
};

// Per batch row: the tokens seen after this call (total), the position of the first new token
// (past), and in the key buffer attention reads: the row of the first new token (row0) and the
// keys (keys). Without a windowed cache row0 = past and keys = total; with one (ONNX Runtime's
// sliding_window_cache) the buffer holds the L(past) most recent positions, row0 = L(past),
// keys = row0 + S, and present keeps the kept = L(total) most recent (see gqa_shapes.h).
struct GqaLengths {
  bool first_prompt = false;  // S == total_sequence_length: the prompt, right-padded to S
  bool compact = false;       // a windowed cache whose keys overflow it: staged, then compacted
  std::vector<int64_t> total, past, row0, keys, kept;
};

// What the host knows without reading seqlens_k: whether the call is a first prompt (S ==
// total_sequence_length), or an error for a call ONNX Runtime's op refuses by its shapes.
Status gqa_phase(const std::string& node, const GqaCall& c, bool* first_prompt);

// The lengths of `c` from seqlens_k (host memory), or an error naming the node and the value.
Status gqa_lengths(const std::string& node, const GqaCall& c, GqaLengths* out);

// A window of 0 keys (local_window_size 0): every output row is 0, no attention runs.
inline bool gqa_attends_nothing(const GqaCall& c) { return c.attrs.local_window_size == 0; }

// The buffers the attention reads after the cache writes: K and V (B, Hkv, len, D) (present, or
// the CPU's staging buffer of a compacting windowed cache), the (B,) int64 key counts per row,
// and null, or in a causal first prompt the (B, len) bool mask j < T_b (then counts are unused).
struct GqaKeys {
  const void* k;
  const void* v;
  int64_t len;
  const int64_t* counts;
  const void* mask;
};

// Whether a node or call has attention sinks: a head_sink input, or smooth_softmax=1 (a sink of 0
// per head; head_sink wins where both are given, as in ONNX Runtime's op).
inline bool gqa_has_sinks(const GqaAttributes& a, bool head_sink) { return head_sink || a.smooth_softmax == 1; }
inline bool gqa_has_sinks(const GqaCall& c) { return gqa_has_sinks(c.attrs, c.head_sink != nullptr); }

// Whether the call writes a Q of its own (B, S, Hq, D) before the attention: rotated and/or normed.
inline bool gqa_q_copied(const GqaCall& c) { return c.attrs.do_rotary != 0 || c.q_norm != nullptr; }

// The attention both execution providers run: `q` the copy of gqa_q_copied (B, S, Hq, D)
// contiguous where `q_copied`, else c.query (then any rotary is the kernel's: FlashParams::rotary_half).
FlashParams gqa_flash_params(const GqaCall& c, bool first_prompt, const void* q, bool q_copied, const GqaKeys& keys);

// Whether a causal first prompt may need the key mask (its rows shorter than S keep their own
// positions, so the kernel's bottom-right alignment on T_b cannot stand in for it). A first prompt
// whose rows all hold S tokens needs none: it is a plain causal call over the first S keys. The
// CPU knows the rows' lengths; on CUDA they live on the device, but a batch of one row holds
// total_sequence_length = S tokens by the op's contract (the maximum over the batch's rows). A
// windowed cache keeps no padding: its first prompt's rows all hold S tokens (gqa_lengths refuses
// a shorter one; on CUDA the prepare kernel gives it no keys), so it reads the rows' key counts.
inline bool gqa_needs_key_mask(const GqaCall& c, bool first_prompt) {
  return first_prompt && c.attrs.causal != 0 && !c.dims.windowed;
}

// Runs the call on the host: the new K and V (K rotated) written into the present buffers at
// each row's position (the past copied first unless past and present share one buffer), Q
// rotated, then the fused attention over the present buffer.
Status run_gqa_cpu(const std::string& node, const GqaCall& c, const ParallelFor& parallel_for);

}  // namespace ort_flash
