#include "gqa_launch.h"

#include "launch_switches.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace ort_flash {
namespace {

// The kernels' arguments: contract.gen.h's GqaPrepareArgs and SinkRescaleArgs (their fields the
// kernels' parameters, their order the launch's). Pointers the call does not use are 0: the kernels
// never read them.
template <class Args>
Status launch(const CudaDriver& drv, const LoadedKernel& k, int64_t gx, int64_t gy, Args& a, CUstream stream) {
  std::vector<void*> args = a.pointers();
  return launch_grid(drv, k, gx, gy, 1, args.data(), stream);
}

std::string missing_prepare(const DeviceKernels& dk, DType dtype) {
  return std::string("this build has no GroupQueryAttention prepare kernels for ") + dtype_name(dtype) + " on sm_" +
         std::to_string(dk.table_arch) + " (aot/gqa_prepare.py)";
}

std::string missing_rescale(const DeviceKernels& dk, DType dtype) {
  return std::string("this build has no attention-sink rescale kernels for ") + dtype_name(dtype) + " on sm_" +
         std::to_string(dk.table_arch) + " (aot/sink_rescale.py), which attention sinks (head_sink, "
         "smooth_softmax=1) need on CUDA";
}

// Q's rotary for the attention kernel to apply as it loads Q (FlashParams::rotary_half).
void set_rotary(const GqaCall& c, FlashParams* p) {
  p->rotary_cos = c.cos_cache;
  p->rotary_sin = c.sin_cache;
  p->rotary_half = c.dims.rotary_dim / 2;
  p->max_position = c.dims.max_position;
}

// Whether the attention turns Q by its rotary as it loads it, so that the prepare kernel writes no
// rotated copy of Q: a first prompt (positions are the rows: no position_ids) with
// half-split rotary over the whole head, no Q norm and no windowed cache, cos/sin rows 16-byte
// aligned (the kernel loads them as vectors), that a Gluon kernel takes (gluon_takes_rotary), unless
// ORT_FLASH_ROTARY_ON_LOAD=0. The call is planned only, before the scratch block exists: present's
// address stands in for the block's key counts, key mask and log-sum-exp, of which the planner
// reads only whether they are given.
Status rotary_on_load(const GqaCall& c, bool first, bool mask, bool sinks, CUstream stream, bool* on_load) {
  const GqaDims& d = c.dims;
  *on_load = false;
  if (c.attrs.do_rotary == 0 || !first || c.position_ids != nullptr || c.q_norm != nullptr ||
      c.attrs.rotary_interleaved != 0 || d.rotary_dim != d.d || d.windowed || !launch_switches().rotary_on_load) {
    return Status::Ok();
  }
  const int64_t row_bytes = d.rotary_dim / 2 * dtype_size(d.dtype);
  if (((dev(c.cos_cache) | dev(c.sin_cache)) % 16) != 0 || row_bytes % 16 != 0) return Status::Ok();
  const void* stand_in = c.present_key;
  const GqaKeys keys{c.present_key, c.present_value, c.present_len, static_cast<const int64_t*>(stand_in),
                     mask ? stand_in : nullptr};
  FlashParams p = gqa_flash_params(c, first, c.query, false, keys);
  if (sinks) p.lse = static_cast<float*>(const_cast<void*>(stand_in));
  set_rotary(c, &p);
  return gluon_takes_rotary(p, stream, true, on_load);
}

}  // namespace

const LoadedKernel* gqa_kernel(const DeviceKernels& dk, KernelKind kind, DType dtype, int64_t d) {
  const LoadedKernel* best = nullptr;  // the smallest BLOCK_D that holds d
  for (const LoadedKernel& k : dk.kernels) {
    const VariantKey& key = k.entry->key;
    if (key.kind == kind && key.dtype == dtype && key.head_dim >= d &&
        (!best || key.head_dim < best->entry->key.head_dim)) {
      best = &k;
    }
  }
  return best;
}

Status gqa_cuda_ready(int device, DType dtype, bool sinks, bool windowed) {
  const DeviceKernels* dk = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(prepare_device(device, &dk));
  for (KernelKind kind : {KernelKind::kGqaPrepare, KernelKind::kGqaPast}) {
    if (!gqa_kernel(*dk, kind, dtype, 0)) return Status::Error(missing_prepare(*dk, dtype));
  }
  for (KernelKind kind : {KernelKind::kGqaCompact, KernelKind::kGqaShift}) {
    if (windowed && !gqa_kernel(*dk, kind, dtype, 0)) {
      return Status::Error(missing_prepare(*dk, dtype) + ": its " +
                           (kind == KernelKind::kGqaCompact ? "compaction" : "shift") +
                           " kernel, which a windowed KV cache (sliding_window_cache=1) needs");
    }
  }
  if (sinks && !gqa_kernel(*dk, KernelKind::kSinkRescale, dtype, 0)) return Status::Error(missing_rescale(*dk, dtype));
  return Status::Ok();
}

Status run_gqa_cuda(const std::string& node, const GqaCall& c, CUstream stream, const WorkspaceFn& scratch) {
  const GqaDims& d = c.dims;
  auto fail = [&](const std::string& what) {
    return Status::Error("GroupQueryAttention node '" + node + "': " + what);
  };
  bool first = false;
  ORT_FLASH_RETURN_IF_ERROR(gqa_phase(node, c, &first));
  if (d.batch == 0 || d.sq == 0) return Status::Ok();
  const int64_t plen = c.present_len;
  // A windowed cache (sliding_window_cache=1; present is the past's C rows): each row's resident
  // rows and new tokens go to a stage of C + S rows, the attention reads it, then the compaction
  // writes present (aot/gqa_prepare.py). Which rows a batch row keeps depends on its length, which
  // lives on the device. Where total_sequence_length (the rows' largest total) is at most C, no row
  // can pass C and each keeps all its T_b positions where they lie: present itself is the stage
  // (C rows), the new tokens go in place at row past_b, as in a cache that is not windowed. One new
  // token past C (decode at a full window) runs over present too, unless ORT_FLASH_WINDOW_SHIFT=0
  // (the stage; the shift measured faster on an H100 at batch 1 and 8, W = C = 4096, 8 KV heads:
  // 0.047 / 0.284 ms against 0.057 / 0.330 at d128, 0.030 / 0.141 against 0.032 / 0.170 at d64,
  // perf-notes "The full-window shift in parallel"): each row's kept rows move down by the E_b
  // rows it drops (a buffer shared with past in place, by the shift kernels; a present of its own
  // from the past, by the past copy), the new token after them. Past and present must then be one
  // buffer each or distinct (never K shared and V not).
  const bool windowed = d.windowed;
  const bool shared = c.past_key == c.present_key && c.past_value == c.present_value;
  const bool distinct = c.past_key != c.present_key && c.past_value != c.present_value &&
                        c.past_key != c.present_value && c.past_value != c.present_key;
  const bool shift_on = launch_switches().window_shift;
  const bool full = windowed && c.total_sequence_length > plen && d.sq == 1 && (shared || distinct) && shift_on;
  const bool in_place = windowed && (c.total_sequence_length <= plen || full);
  const bool staged = windowed && !in_place;  // a stage of its own in the scratch block
  const int64_t stage_len = staged ? plen + d.sq : (in_place ? plen : 0);
  for (int64_t n : {plen, d.past_len, d.max_position, d.batch * d.sq, d.hq + 2 * d.hkv, stage_len}) {
    if (n > std::numeric_limits<int32_t>::max()) return fail("a dimension of " + std::to_string(n) + " exceeds int32");
  }
  const CudaDriver* drv = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(cuda_driver(&drv));
  const DeviceKernels* dk = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(kernels_for_stream(stream, &dk));
  const LoadedKernel* prepare = gqa_kernel(*dk, KernelKind::kGqaPrepare, d.dtype, d.d);
  const LoadedKernel* past = gqa_kernel(*dk, KernelKind::kGqaPast, d.dtype, d.d);
  const LoadedKernel* compact = windowed ? gqa_kernel(*dk, KernelKind::kGqaCompact, d.dtype, d.d) : nullptr;
  const LoadedKernel* shift = full && shared ? gqa_kernel(*dk, KernelKind::kGqaShift, d.dtype, d.d) : nullptr;
  if (!prepare || !past || (windowed && !compact) || (full && shared && !shift)) {
    return fail(missing_prepare(*dk, d.dtype));
  }
  // Attention sinks: the attention stores its log-sum-exp, then the rescale kernel applies them
  // (a window of 0 keys runs no attention: its zero rows stay zero).
  const bool sinks = gqa_has_sinks(c) && !gqa_attends_nothing(c);
  const LoadedKernel* rescale = sinks ? gqa_kernel(*dk, KernelKind::kSinkRescale, d.dtype, d.d) : nullptr;
  if (sinks && !rescale) return fail(missing_rescale(*dk, d.dtype));
  const int64_t rescale_rows = sinks ? rescale->entry->block_m : 1;
  const int64_t rescale_grid = d.batch * d.hq * ((d.sq + rescale_rows - 1) / rescale_rows);
  if (sinks && rescale_grid > std::numeric_limits<int32_t>::max()) {
    return fail(std::to_string(rescale_grid) + " programs of the attention-sink rescale exceed int32");
  }

  const int es = dtype_size(d.dtype);
  const bool rotary = c.attrs.do_rotary != 0;
  // A batch of one row holds S tokens (gqa_needs_key_mask): no mask, the plain causal kernels.
  const bool mask = gqa_needs_key_mask(c, first) && d.batch > 1;
  bool on_load = false;  // Q's rotary applied by the attention kernel
  ORT_FLASH_RETURN_IF_ERROR(rotary_on_load(c, first, mask, sinks, stream, &on_load));
  const bool q_copy = gqa_q_copied(c) && !on_load;  // Q rotated and/or normed into a copy of its own
  // gqa_prepare's rows of a batch row: NH = (Q heads if copied) + 2 Hkv per token.
  const int64_t block_rows = prepare->entry->block_m;
  const int64_t rows = d.sq * ((q_copy ? d.hq : 0) + 2 * d.hkv);
  if (rows + block_rows > std::numeric_limits<int32_t>::max()) {
    return fail(std::to_string(rows) + " (token, head) rows of a batch row exceed int32");
  }
  const size_t q_bytes = q_copy ? static_cast<size_t>(d.batch * d.sq * d.hq * d.d) * es : 0;
  const size_t len_bytes = static_cast<size_t>(d.batch) * sizeof(int64_t);
  const size_t mask_bytes = mask ? static_cast<size_t>(d.batch * plen) : 0;
  const size_t stage_bytes = staged ? static_cast<size_t>(d.batch * d.hkv * stage_len * d.d) * es : 0;
  // The shift's save buffers: min(G, BLOCK_ROWS) rows for each of its blocks of BLOCK_ROWS rows
  // (aot/gqa_prepare.py MODE 3).
  const int64_t shift_rows = shift ? shift->entry->block_m : 1;
  const int64_t shift_blocks = (plen + shift_rows - 1) / shift_rows;
  const int64_t gap = windowed ? plen - c.attrs.local_window_size + 1 : 1;
  const size_t save_bytes =
      shift ? static_cast<size_t>(d.batch * d.hkv * shift_blocks * std::min(gap, shift_rows) * d.d) * es : 0;
  // The block: [rotated Q | lengths | key mask | the attention's log-sum-exp (B, Hq, S) with sinks
  // | a staged windowed cache's stage K | stage V | the shift's save K | save V].
  size_t bytes = aligned(q_bytes) + aligned(len_bytes) + mask_bytes;
  const size_t lse_offset = aligned(bytes);
  if (sinks) bytes = lse_offset + static_cast<size_t>(d.batch * d.hq * d.sq) * sizeof(float);
  const size_t stage_offset = aligned(bytes);
  if (staged) bytes = stage_offset + 2 * aligned(stage_bytes);
  const size_t save_offset = aligned(bytes);
  if (shift) bytes = save_offset + 2 * aligned(save_bytes);
  void* buf = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(scratch(bytes, &buf));
  char* q_rot = static_cast<char*>(buf);
  auto* totals = reinterpret_cast<int64_t*>(q_rot + aligned(q_bytes));
  char* key_mask = reinterpret_cast<char*>(totals) + aligned(len_bytes);
  float* lse = sinks ? reinterpret_cast<float*>(q_rot + lse_offset) : nullptr;
  void* stage_k = in_place ? c.present_key : nullptr;
  void* stage_v = in_place ? c.present_value : nullptr;
  if (staged) {
    stage_k = q_rot + stage_offset;
    stage_v = q_rot + stage_offset + aligned(stage_bytes);
  }

  // The new tokens' element strides per (batch, token); heads are D apart.
  const int64_t q_row = (d.packed ? d.hq + 2 * d.hkv : d.hq) * d.d;
  const int64_t kv_row = d.packed ? q_row : d.hkv * d.d;
  const char* query = static_cast<const char*>(c.query);
  GqaPrepareArgs a;
  a.Q = dev(query);
  a.K = d.packed ? dev(query + d.hq * d.d * es) : dev(c.key);
  a.V = d.packed ? dev(query + (d.hq + d.hkv) * d.d * es) : dev(c.value);
  a.PastK = dev(c.past_key);
  a.PastV = dev(c.past_value);
  a.PresentK = dev(c.present_key);
  a.PresentV = dev(c.present_value);
  a.QRot = q_copy ? dev(q_rot) : 0;
  a.Cos = rotary ? dev(c.cos_cache) : 0;
  a.Sin = rotary ? dev(c.sin_cache) : 0;
  a.StageK = dev(stage_k);
  a.StageV = dev(stage_v);
  a.PositionIds = dev(c.position_ids);
  a.Seqlens = dev(c.seqlens_k);
  a.Totals = dev(totals);
  a.KeyMask = mask ? dev(key_mask) : 0;
  a.QNorm = dev(c.q_norm);
  a.KNorm = dev(c.k_norm);
  a.qk_norm = c.q_norm != nullptr;
  a.qk_eps = c.attrs.qk_norm_epsilon;
  a.S = static_cast<int32_t>(d.sq);
  a.Hq = static_cast<int32_t>(d.hq);
  a.Hkv = static_cast<int32_t>(d.hkv);
  a.D = static_cast<int32_t>(d.d);
  a.q_heads = q_copy ? a.Hq : 0;
  a.rotary = rotary ? (c.attrs.rotary_interleaved ? 2 : 1) : 0;
  a.rotary_half = rotary ? static_cast<int32_t>(d.rotary_dim / 2) : 0;
  a.max_position = rotary ? static_cast<int32_t>(d.max_position) : 0;
  a.has_position_ids = c.position_ids != nullptr;
  a.first_prompt = first;
  a.write_mask = mask;
  a.total_max = c.total_sequence_length;
  a.present_len = static_cast<int32_t>(plen);
  a.past_len = d.has_past ? static_cast<int32_t>(d.past_len) : 0;
  // cap > 0: the windowed cache's capacity C and G = C - W + 1 (C >= W > 0: validate_gqa).
  a.cap = windowed ? static_cast<int32_t>(plen) : 0;
  a.gap = static_cast<int32_t>(gap);
  a.stage_len = static_cast<int32_t>(stage_len);
  a.shared = shared;
  a.stride_qb = d.sq * q_row; a.stride_qs = q_row;
  a.stride_kb = d.sq * kv_row; a.stride_ks = kv_row;
  a.stride_vb = d.sq * kv_row; a.stride_vs = kv_row;

  // A present of its own: zeros and each row's past (rows the new tokens take are left to them);
  // a windowed cache's stage: each row's resident rows (at most C); where present is the stage,
  // a present of its own the kept ones (from row E_b), and a buffer shared with past holds them
  // already, moved down in place past C: the rows of each block that another block overwrites saved
  // first, then every block moved (a program per block of rows of a (batch row, KV head)).
  const int64_t cache_rows = past->entry->block_m;
  if (!shared || staged) {
    ORT_FLASH_RETURN_IF_ERROR(launch(*drv, *past, (plen + cache_rows - 1) / cache_rows, d.batch * d.hkv, a, stream));
  } else if (shift) {
    GqaPrepareArgs s = a;
    s.StageK = dev(q_rot + save_offset);
    s.StageV = dev(q_rot + save_offset + aligned(save_bytes));
    for (int32_t phase : {0, 1}) {
      s.shift_phase = phase;
      ORT_FLASH_RETURN_IF_ERROR(launch(*drv, *shift, shift_blocks, d.batch * d.hkv, s, stream));
    }
  }
  // BLOCK_ROWS rows of one batch row per program, a row being one head of one token: the Q heads
  // (only where Q is rotated or normed), then the K heads, then the V heads of each token. The
  // kernel counts them in int32 (checked above).
  ORT_FLASH_RETURN_IF_ERROR(launch(*drv, *prepare, d.batch * ((rows + block_rows - 1) / block_rows), 1, a, stream));

  if (gqa_attends_nothing(c)) {  // (never windowed: validate_gqa asks W > 0 there)
    return cuda_check(drv->cuMemsetD8Async(dev(c.output), 0, static_cast<size_t>(d.batch * d.sq * d.hq * d.d) * es,
                                           stream),
                      "cuMemsetD8Async");
  }
  const GqaKeys keys = windowed ? GqaKeys{stage_k, stage_v, stage_len, totals, nullptr}
                                : GqaKeys{c.present_key, c.present_value, plen, totals, mask ? key_mask : nullptr};
  FlashParams p = gqa_flash_params(c, first, q_copy ? q_rot : c.query, q_copy, keys);
  p.lse = lse;
  if (on_load) set_rotary(c, &p);
  ORT_FLASH_RETURN_IF_ERROR(launch_flash_cuda(p, stream, scratch));
  // Present's C rows from the stage, after the attention read it (same stream). Where present is
  // the stage, rows [0, L(T_b)) stay where they are: a shared buffer needs nothing, a present of its
  // own the compaction's zeros after them.
  if (staged || (in_place && !shared)) {
    const int64_t compact_rows = compact->entry->block_m;
    ORT_FLASH_RETURN_IF_ERROR(
        launch(*drv, *compact, (plen + compact_rows - 1) / compact_rows, d.batch * d.hkv, a, stream));
  }
  if (!sinks) return Status::Ok();
  // Each row y *= 1 / (1 + exp(sink_h - lse)), in place on the same stream (aot/sink_rescale.py):
  // head_sink's value per head, or 0 (smooth_softmax=1) where the call has no head_sink.
  SinkRescaleArgs r;
  r.Y = dev(c.output);
  r.Lse = dev(lse);
  r.Sinks = dev(c.head_sink);
  r.has_sinks = c.head_sink != nullptr;
  r.Hq = a.Hq;
  r.Sq = a.S;
  r.D = a.D;
  r.stride_yb = p.y_stride[0], r.stride_yh = p.y_stride[1], r.stride_ym = p.y_stride[2];
  return launch(*drv, *rescale, rescale_grid, 1, r, stream);
}

}  // namespace ort_flash
