#include "cuda_launch.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernel_registry.h"

namespace ort_flash {
namespace {

// Split-KV decode dispatch (aot/flash_decode.py; aot/variants.py DECODE_* mirror these).
constexpr int64_t kMaxDecodeSq = 16;
constexpr int64_t kMaxDecodeRows = 64;     // GQA group x Sq packed into one CTA's rows
constexpr int64_t kMaxSplits = 128;
constexpr int64_t kMinSplitKeys = 128;     // a split shorter than this costs more than it gains
constexpr int64_t kCtaOverheadTiles = 4;   // a CTA's pipeline fill and epilogue, in key tiles

// ORT_FLASH_DECODE_SPLITS: unset/empty = heuristic (-1), 0 = forward kernel, N = N splits.
int64_t decode_splits_override() {
  static const int64_t v = [] {
    const char* e = std::getenv("ORT_FLASH_DECODE_SPLITS");
    if (!e || !*e) return static_cast<int64_t>(-1);
    char* end = nullptr;
    const long long n = std::strtoll(e, &end, 10);
    return (end && *end == 0 && n >= 0) ? static_cast<int64_t>(n) : static_cast<int64_t>(-1);
  }();
  return v;
}

// Where the split kernel merges its own partials (the last CTA of a row block), rather than the
// combine kernel: that CTA loads a tile of 4 rows x 16 splits or 16 rows x 4 splits of partials
// at once (one dependent L2 round trip each, aot/flash_decode.py) after an arrival atomic; the
// combine kernel costs a second launch but merges every row in parallel. Measured on the H200
// (JIT, experiments/decode_floor.py, docs/perf-notes.md, decode v5): fused 10.7 against 11.4 us at B1 4k
// (16 splits, one trip), 36.4 against 37.2 at B1 32k, 38.6 against 39.1 at 32 splits (two
// trips); a 16-row block at 16 splits (Sq = 4: four trips) lost 2.7 us at B1 4k. Past 32 splits
// it is not measured.
constexpr int kMaxFusedSplits = 32;
constexpr int64_t kMaxFusedRoundTrips = 2;

// The fused merge's dependent round trips for a block of `rows` packed rows: the kernel takes
// the tile with fewer (flash_decode.py's merge_round_trips mirrors this).
int64_t merge_round_trips(int64_t rows, int64_t splits) {
  auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  return std::min(cdiv(rows, 4) * cdiv(splits, 16), cdiv(rows, 16) * cdiv(splits, 4));
}

// ORT_FLASH_FUSED_COMBINE: unset = fused within kMaxFusedSplits and kMaxFusedRoundTrips, 0 = never, 1 = always
// (where the stream has counters); A/B comparisons and the tests of both paths.
int fused_combine_mode() {
  static const int v = [] {
    const char* e = std::getenv("ORT_FLASH_FUSED_COMBINE");
    if (e && std::string(e) == "0") return 0;
    if (e && std::string(e) == "1") return 1;
    return -1;
  }();
  return v;
}

// ORT_FLASH_PDL: unset = kernels built for it (KernelEntry::pdl) launch with programmatic
// stream serialization, 0 = never (A/B comparisons and the tests of both paths). Such a kernel
// may start while the grid before it on the stream drains; it waits for that grid
// (griddepcontrol.wait) before touching memory, and never releases the next grid early. Measured
// on the H200 (JIT, experiments/decode_floor.py, docs/perf-notes.md, decode v7): -0.6 us per decode call
// at B1 4k-32k (10.9 -> 10.2 us at 4k), nothing measurable at B32.
bool pdl_enabled() {
  static const bool v = [] {
    const char* e = std::getenv("ORT_FLASH_PDL");
    return !(e && std::string(e) == "0");
  }();
  return v;
}

// cuLaunchKernel, or cuLaunchKernelEx with programmatic stream serialization where `pdl` (and
// the driver has it: LaunchPlan::pdl is only set where it does).
Status launch_kernel(const CudaDriver& d, const LoadedKernel& k, unsigned gx, unsigned gy, unsigned gz,
                     CUstream stream, void** args, bool pdl) {
  const KernelEntry& e = *k.entry;
  const unsigned threads = 32u * static_cast<unsigned>(e.num_warps);
  const unsigned shared = static_cast<unsigned>(e.shared);
  const std::string what = std::string(pdl ? "cuLaunchKernelEx(" : "cuLaunchKernel(") + e.variant_name + ")";
  if (!pdl || !d.cuLaunchKernelEx) {
    return cuda_check(d.cuLaunchKernel(k.function, gx, gy, gz, threads, 1, 1, shared, stream, args, nullptr),
                      what.c_str());
  }
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.value = 1;
  CUlaunchConfig cfg{gx, gy, gz, threads, 1, 1, shared, stream, &attr, 1};
  return cuda_check(d.cuLaunchKernelEx(&cfg, k.function, args, nullptr), what.c_str());
}

// `rows`: the packed rows of a full row block (min(block_m, group * sq)).
bool fuse_combine(int splits, int64_t rows) {
  const int mode = fused_combine_mode();
  return splits > 1 && (mode == 1 || (mode < 0 && splits <= kMaxFusedSplits &&
                                      merge_round_trips(rows, splits) <= kMaxFusedRoundTrips));
}

// The arrival counters the split kernel's fused merge uses on `stream`, or 0 (the merge then
// runs as its own kernel); the set's tile counter pair is at *out + kTileCounterOffset (a
// DYNAMIC_TILES kernel: aot/flash_fwd_gluon_ws.py, its last CTA zeroes it again). The counters
// must be zero at launch, and no two launches may use one set at once. One set per (context,
// stream): launches on one stream run one after another, the last CTA of each row block resets
// its counter (of a dynamic launch, the pair), and a set is zeroed on the stream before its
// first use. Concurrent runs of ONNX Runtime use different streams, so different sets; a CUDA
// graph replays its launches on the stream it was captured on or on one serialized with it (ORT
// replays its graphs on the capturing stream). A stream first seen while it is capturing gets
// none (zeroing it then would land in the graph only), nor do streams past the 64th or calls with
// more than 4096 row blocks (those fill the GPU unsplit anyway).
Status stream_counters(const CudaDriver& d, const DeviceKernels& dk, CUstream stream, int64_t needed,
                       CUdeviceptr* out) {
  *out = 0;
  if (!dk.decode_counters || needed > kDecodeCountersPerSlot) return Status::Ok();
  static std::mutex mutex;
  static auto* slots = new std::map<std::pair<CUcontext, CUstream>, int>();
  static auto* used = new std::map<CUcontext, int>();
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(dk.context, stream);
  auto it = slots->find(key);
  if (it == slots->end()) {
    int capturing = CU_STREAM_CAPTURE_STATUS_NONE;
    ORT_FLASH_RETURN_IF_ERROR(cuda_check(d.cuStreamIsCapturing(stream, &capturing), "cuStreamIsCapturing"));
    int& n = (*used)[dk.context];
    if (capturing != CU_STREAM_CAPTURE_STATUS_NONE || n >= kDecodeCounterSlots) return Status::Ok();
    ORT_FLASH_RETURN_IF_ERROR(cuda_check(
        d.cuMemsetD8Async(dk.decode_counters + n * kCounterSlotBytes, 0, kCounterSlotBytes, stream),
        "cuMemsetD8Async (split-KV counters)"));
    it = slots->emplace(key, n++).first;
  }
  *out = dk.decode_counters + static_cast<size_t>(it->second) * kCounterSlotBytes;
  return Status::Ok();
}

// ORT_FLASH_TMA=0 keeps the pointer kernels on sm_90 (A/B comparisons, a driver that misbehaves);
// the Gluon kernel reads TMA descriptors too, so it stays off as well.
bool tma_enabled() {
  static const bool v = [] {
    const char* e = std::getenv("ORT_FLASH_TMA");
    return !(e && std::string(e) == "0");
  }();
  return v;
}

// ORT_FLASH_GLUON: unset = the Gluon kernel on the calls its table ranges cover (aot/variants.py
// GLUON_LENGTHS); 0 = never, the dispatch of a build without it (A/B comparisons, a fallback
// should it misbehave); 1 = on every call it can take, whatever the length (tests, measurements).
int gluon_mode() {
  static const int v = [] {
    const char* e = std::getenv("ORT_FLASH_GLUON");
    if (e && std::string(e) == "0") return 0;
    if (e && std::string(e) == "1") return 1;
    return -1;
  }();
  return v;
}

int decode_bucket(int64_t d) {
  for (int b : {64, 128, 256}) {
    if (d <= b) return b;
  }
  return 0;
}

const LoadedKernel* find_kernel(const DeviceKernels& dk, const VariantKey& key) {
  for (const LoadedKernel& lk : dk.kernels) {
    if (lk.entry->key == key) return &lk;
  }
  return nullptr;
}

// Among the entries of `key` whose tile is for this call (its causal flag, or any), the one with
// the largest tile_min_len up to `measure` (and below its tile_max_len, where set): for the TMA
// and Gluon kinds min(Sq, Skv), the table's per-(causal, sequence length) tiles and ranges
// (aot/variants.py TMA_TILES, GLUON_LENGTHS); for the decode kind the grid's CTAs per SM
// (DECODE_WIDE_WAVES). A key with one entry returns it whenever its range covers the call;
// `any_length` ignores the ranges.
const LoadedKernel* pick_tile(const DeviceKernels& dk, const VariantKey& key, bool causal, int64_t measure,
                              bool any_length = false) {
  const LoadedKernel* best = nullptr;
  for (const LoadedKernel& lk : dk.kernels) {
    const KernelEntry& e = *lk.entry;
    if (!(e.key == key) || (e.tile_causal >= 0 && e.tile_causal != (causal ? 1 : 0)) ||
        (!any_length && (e.tile_min_len > measure || (e.tile_max_len > 0 && measure >= e.tile_max_len)))) {
      continue;
    }
    if (!best || e.tile_min_len > best->entry->tile_min_len) best = &lk;
  }
  return best;
}

// The kernel for `key`, or where the build compiles its shape class only as a superset
// (aot/variants.py superset_only: rare shapes), the variant that computes the same result from
// more general code: with extras (the call's neutral windows, softcap 0 and no key lengths leave
// every score as it is), with a masked head dim (all of D in bounds). Exact first. Updates *key to
// the one found, so that a tile search (the decode kind's wide tile) looks in the same variant;
// for the decode kind returns its base tile (tile_min_len 0 or the least), which plans the splits.
const LoadedKernel* find_superset(const DeviceKernels& dk, VariantKey* key, bool causal = false) {
  const VariantKey base = *key;
  for (int i = 0; i < 4; ++i) {
    VariantKey k = base;
    k.extras = base.extras || (i & 1);
    k.even_d = base.even_d && !(i & 2);
    if (i && k == base) continue;
    const LoadedKernel* found = k.kind == KernelKind::kDecode ? pick_tile(dk, k, causal, 1) : find_kernel(dk, k);
    if (found) {
      *key = k;
      return found;
    }
  }
  return nullptr;
}

// A forward kernel for `key`; a key-vector mask falls back to the full-mask variant (same result:
// it reads the mask through its strides) where this build has no key-vector one.
const LoadedKernel* find_fwd_kernel(const DeviceKernels& dk, VariantKey key) {
  if (const LoadedKernel* k = find_superset(dk, &key)) return k;
  if (!key.mask_keys) return nullptr;
  key.mask_keys = false;
  return find_superset(dk, &key);
}

size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

int head_dim_bucket(int64_t d) {
  for (int b : {32, 64, 128, 256}) {
    if (d <= b) return b;
  }
  return 0;
}

// Buckets that have an exact-size variant (aot/variants.py HEAD_DIMS).
bool has_even_variant(int bucket) { return bucket != 32; }

bool strides_aligned(const FlashParams& p) {
  for (const int64_t* s : {p.q_stride, p.k_stride, p.v_stride, p.y_stride}) {
    for (int i = 0; i < 3; ++i) {
      if (s[i] % 16 != 0) return false;
    }
  }
  return true;
}

std::string describe(const VariantKey& k) {
  return std::string(dtype_name(k.dtype)) + ", head dim bucket " + std::to_string(k.head_dim) +
         (k.even_d ? "" : " (masked head dim)") +
         (k.mask == MaskKind::kNone ? ", no mask" : (k.mask == MaskKind::kBool ? ", bool mask" : ", additive mask")) +
         (k.extras ? ", windows/softcap/nonpad_kv_seqlen" : "");
}

// The runtime arguments every kernel of the family shares, by value, in kernel order.
// Launch arrays point into it, so it must outlive the cuLaunchKernel call.
struct KernelArgs {
  CUdeviceptr q, k, v, y, lse, mask, seqlens;
  float scale, softcap;
  // hq, group, sq, skv, d, dv, offset, causal, window_left, window_right, mask_len, has_seqlens,
  // store_lse
  int32_t ints[13];
  int64_t strides[15];  // q, k, v, y (b, h, s) then the mask's (b, h, q); its key stride is 1
  CUdeviceptr global_scratch = 0, profile_scratch = 0;

  explicit KernelArgs(const FlashParams& p)
      : q(reinterpret_cast<CUdeviceptr>(p.q)), k(reinterpret_cast<CUdeviceptr>(p.k)),
        v(reinterpret_cast<CUdeviceptr>(p.v)), y(reinterpret_cast<CUdeviceptr>(p.y)),
        lse(reinterpret_cast<CUdeviceptr>(p.lse)), mask(reinterpret_cast<CUdeviceptr>(p.mask)),
        seqlens(reinterpret_cast<CUdeviceptr>(p.seqlens_k)), scale(p.scale), softcap(p.softcap),
        ints{static_cast<int32_t>(p.hq), static_cast<int32_t>(p.hq / p.hkv),
             static_cast<int32_t>(p.sq), static_cast<int32_t>(p.skv), static_cast<int32_t>(p.d),
             static_cast<int32_t>(p.dv), static_cast<int32_t>(p.offset), p.causal ? 1 : 0,
             static_cast<int32_t>(p.window_left), static_cast<int32_t>(p.window_right),
             static_cast<int32_t>(p.mask_kind == MaskKind::kNone ? p.skv : p.mask_len),
             p.seqlens_k != nullptr ? 1 : 0, p.lse != nullptr ? 1 : 0} {
    for (int i = 0; i < 3; ++i) {
      strides[i] = p.q_stride[i];
      strides[3 + i] = p.k_stride[i];
      strides[6 + i] = p.v_stride[i];
      strides[9 + i] = p.y_stride[i];
      strides[12 + i] = p.mask_stride[i];
    }
  }
  void push_outputs_and_masks(std::vector<void*>& a) {
    for (void* x : {static_cast<void*>(&lse), static_cast<void*>(&mask), static_cast<void*>(&seqlens)}) a.push_back(x);
  }
  void push_scalars(std::vector<void*>& a) {
    a.push_back(&scale);
    a.push_back(&softcap);
    for (int32_t& i : ints) a.push_back(&i);
  }
  void push_strides_and_scratch(std::vector<void*>& a) {
    for (int64_t& s : strides) a.push_back(&s);
    a.push_back(&global_scratch);
    a.push_back(&profile_scratch);
  }
};

// One tensor descriptor argument as the kFwdTma kernels take it: the map, then the logical
// (B, H, S, D) dims and element strides.
struct TmaArg {
  CUtensorMap map;
  int32_t dims[4];
  int64_t strides[4];
  void push(std::vector<void*>& a) {
    a.push_back(&map);
    for (int32_t& d : dims) a.push_back(&d);
    for (int64_t& s : strides) a.push_back(&s);
  }
};

constexpr int64_t kTmaElem = 2;  // fp16 / bf16

// Whether the copy engine can address the (B, H, S, D) view at `base` with element strides
// (b, h, s) and a contiguous last dim: a 16-byte aligned base, strides positive multiples of 16
// bytes below 2^40, no empty dim.
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

bool tma_views_ok(const FlashParams& p) {
  return tma_view_ok(p.q, p.batch, p.hq, p.sq, p.d, p.q_stride) &&
         tma_view_ok(p.k, p.batch, p.hkv, p.skv, p.d, p.k_stride) &&
         tma_view_ok(p.v, p.batch, p.hkv, p.skv, p.dv, p.v_stride) &&
         tma_view_ok(p.y, p.batch, p.hq, p.sq, p.dv, p.y_stride);
}

// Encodes a view tma_view_ok accepted for the box the cubin expects; false if the driver
// refuses it (the caller then runs the pointer kernel).
bool encode_tma(const CudaDriver& drv, const TmaBox& box, DType dtype, const void* base,
                int64_t b, int64_t h, int64_t s, int64_t d, const int64_t stride[3], TmaArg* out) {
  constexpr int64_t kElem = kTmaElem;
  const int64_t dims[4] = {b, h, s, d};
  // The driver's order is innermost first: (D, S, H, B), byte strides of S, H, B.
  const uint64_t gdims[4] = {static_cast<uint64_t>(d), static_cast<uint64_t>(s), static_cast<uint64_t>(h),
                             static_cast<uint64_t>(b)};
  const uint64_t gstrides[3] = {static_cast<uint64_t>(stride[2] * kElem), static_cast<uint64_t>(stride[1] * kElem),
                                static_cast<uint64_t>(stride[0] * kElem)};
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

// The four descriptors of `p` for kernel entry `e`; false if any cannot be encoded.
bool encode_tma_args(const CudaDriver& drv, const FlashParams& p, const KernelEntry& e, TmaArg out[4]) {
  return encode_tma(drv, e.tma[0], p.dtype, p.q, p.batch, p.hq, p.sq, p.d, p.q_stride, &out[0]) &&
         encode_tma(drv, e.tma[1], p.dtype, p.k, p.batch, p.hkv, p.skv, p.d, p.k_stride, &out[1]) &&
         encode_tma(drv, e.tma[2], p.dtype, p.v, p.batch, p.hkv, p.skv, p.dv, p.v_stride, &out[2]) &&
         encode_tma(drv, e.tma[3], p.dtype, p.y, p.batch, p.hq, p.sq, p.dv, p.y_stride, &out[3]);
}

// The TMA twin of a forward variant, when this build has one for the device and TMA is on.
// Unmasked and key-vector-masked calls only: with a full mask tile the TMA cubins spilled
// registers and measured 0.38-0.84x the pointer kernels on the H200 (tools/ab_tma.py,
// docs/perf-notes.md), so full masks stay on the pointer kernels.
const LoadedKernel* tma_kernel(const FlashParams& p, const DeviceKernels& dk, VariantKey key) {
  if (!tma_enabled() || !key.even_d || (key.mask != MaskKind::kNone && !key.mask_keys) ||
      p.dtype == DType::kFloat32 || !dk.tensor_maps) {
    return nullptr;
  }
  key.kind = KernelKind::kFwdTma;
  return pick_tile(dk, key, p.causal, std::min(p.sq, p.skv));
}

// The Gluon kernel for a call it can take (aot/variants.py GLUON_*: the build has it for the
// device, fp16/bf16, D == Dv == 64 or 128 with aligned strides, no extras, no mask or a key-vector
// one where the build has its cubins: GLUON_WS_MASKS) from the min(Sq, Skv) range of its table
// entry (GLUON_LENGTHS; any with ORT_FLASH_GLUON=1), unless ORT_FLASH_GLUON=0 or ORT_FLASH_TMA=0.
const LoadedKernel* gluon_kernel(const FlashParams& p, const DeviceKernels& dk, VariantKey key) {
  if (gluon_mode() == 0 || !tma_enabled() || !key.even_d || (key.mask != MaskKind::kNone && !key.mask_keys) ||
      key.extras || p.dtype == DType::kFloat32 || !dk.tensor_maps) {
    return nullptr;
  }
  key.kind = KernelKind::kFwdGluon;
  return pick_tile(dk, key, p.causal, std::min(p.sq, p.skv), gluon_mode() == 1);
}

}  // namespace

Status select_variant(const FlashParams& p, VariantKey* key) {
  const int bucket = head_dim_bucket(p.d > p.dv ? p.d : p.dv);
  if (bucket == 0) {
    return Status::Error("head dims D=" + std::to_string(p.d) + ", Dv=" + std::to_string(p.dv) +
                         " exceed the CUDA kernels' limit of 256");
  }
  key->dtype = p.dtype;
  key->head_dim = bucket;
  key->even_d = p.d == bucket && p.dv == bucket && strides_aligned(p);
  key->mask = p.mask_kind;
  key->extras = p.window_left >= 0 || p.window_right >= 0 || p.softcap > 0.0f || p.seqlens_k != nullptr;
  key->precision = p.dtype == DType::kFloat32 ? p.fp32_precision : Fp32Precision::kIeee;
  if (key->even_d && !has_even_variant(key->head_dim)) key->even_d = false;
  // One mask row serves every query row (a (B, 1, 1, S) padding mask, or a single query):
  // the kernels that read it as one key vector per (batch, head), where the build has them.
  key->mask_keys = p.mask_kind != MaskKind::kNone && (p.mask_stride[2] == 0 || p.sq == 1);
  return Status::Ok();
}

namespace {

VariantKey decode_key(const FlashParams& p, KernelKind kind) {
  VariantKey key{};
  key.dtype = p.dtype;
  key.head_dim = decode_bucket(p.d > p.dv ? p.d : p.dv);
  key.kind = kind;
  key.precision = Fp32Precision::kIeee;
  if (kind == KernelKind::kCombine) {
    key.even_d = false;
    key.mask = MaskKind::kNone;
    key.extras = false;
    return key;
  }
  key.even_d = p.d == key.head_dim && p.dv == key.head_dim && strides_aligned(p);
  key.mask = p.mask_kind;
  key.extras = p.window_left >= 0 || p.window_right >= 0 || p.softcap > 0.0f || p.seqlens_k != nullptr;
  return key;
}

Status launch_decode(const FlashParams& p, const DeviceKernels& dk, const LaunchPlan& plan,
                     CUstream stream, const WorkspaceFn& workspace);
Status plan_decode(const FlashParams& p, const DeviceKernels& dk, bool can_split, LaunchPlan* plan);

}  // namespace

Status plan_flash_cuda(const FlashParams& p, const DeviceKernels& dk, bool can_split, LaunchPlan* plan) {
  *plan = LaunchPlan{};
  ORT_FLASH_RETURN_IF_ERROR(plan_decode(p, dk, can_split, plan));
  if (plan->kind == KernelKind::kFwd) {
    VariantKey key{};
    ORT_FLASH_RETURN_IF_ERROR(select_variant(p, &key));
    const LoadedKernel* k = find_fwd_kernel(dk, key);
    const LoadedKernel* g = gluon_kernel(p, dk, key);
    const LoadedKernel* t = g ? nullptr : tma_kernel(p, dk, key);
    if ((g || t) && tma_views_ok(p)) {
      plan->kind = g ? KernelKind::kFwdGluon : KernelKind::kFwdTma;
      plan->loaded = g ? g : t;
      plan->second = k;
    } else {
      plan->loaded = k;
    }
    if (plan->loaded) plan->kernel = plan->loaded->entry;
  }
  return Status::Ok();
}

namespace {

Status plan_decode(const FlashParams& p, const DeviceKernels& dk, bool can_split, LaunchPlan* plan) {
  const int64_t forced = decode_splits_override();
  if (forced == 0 || p.hkv <= 0 || p.sq > kMaxDecodeSq) return Status::Ok();
  const int64_t group = p.hq / p.hkv;
  const int64_t rows = group * p.sq;
  if (rows > kMaxDecodeRows || p.batch * p.hkv > 65535) return Status::Ok();
  VariantKey key = decode_key(p, KernelKind::kDecode);
  if (key.head_dim == 0) return Status::Ok();
  const LoadedKernel* k = find_superset(dk, &key, p.causal);  // the base tile plans the splits
  const LoadedKernel* c = find_kernel(dk, decode_key(p, KernelKind::kCombine));
  if (!k || !c) return Status::Ok();
  const KernelEntry& e = *k->entry;
  plan->kind = KernelKind::kDecode;
  plan->kernel = &e;
  plan->loaded = k;
  plan->second = c;
  const int64_t ctas = p.batch * p.hkv * ((rows + e.block_m - 1) / e.block_m);
  const int64_t key_blocks = std::max<int64_t>(1, (p.skv + e.block_n - 1) / e.block_n);
  const int64_t sms = std::max(1, dk.sm_count);
  int64_t splits = can_split ? forced : 1;
  if (splits < 0) {
    // Decode streams K/V, and on the H200 one SM's read rate, not its resident CTAs, bounds it:
    // a second CTA on an SM that already has one adds little (experiments/tune_decode.py, perf-notes).
    // So time goes by waves of one CTA per SM, each as long as the key tiles a CTA reads plus its
    // fill and epilogue; take the fewest splits that minimize it (a split past
    // cdiv(key_blocks, tiles) would get no keys). experiments/tune_decode.py's choose_splits mirrors this.
    const int64_t most = std::max<int64_t>(1, std::min({kMaxSplits, key_blocks, p.skv / kMinSplitKeys}));
    int64_t best_cost = -1;
    for (int64_t s = 1; s <= most; ++s) {
      const int64_t tiles = (key_blocks + s - 1) / s;
      const int64_t active = (key_blocks + tiles - 1) / tiles;
      const int64_t cost = (ctas * active + sms - 1) / sms * (tiles + kCtaOverheadTiles);
      if (best_cost < 0 || cost < best_cost) {
        best_cost = cost;
        splits = s;
      }
    }
  }
  splits = std::max<int64_t>(1, std::min({splits, kMaxSplits, key_blocks}));
  plan->num_splits = static_cast<int>(splits);
  plan->fused_merge = fuse_combine(plan->num_splits, std::min<int64_t>(e.block_m, rows));
  // A grid of more CTAs than SMs takes the tile for it where the build has one (same block_m and
  // block_n, so the same splits and workspace).
  const int64_t tiles = (key_blocks + splits - 1) / splits;
  const int64_t waves = (ctas * ((key_blocks + tiles - 1) / tiles) + sms - 1) / sms;
  const LoadedKernel* w = pick_tile(dk, key, p.causal, waves);
  if (w && w->entry->block_m == e.block_m && w->entry->block_n == e.block_n) {
    plan->loaded = w;
    plan->kernel = w->entry;
  }
  const CudaDriver* d = nullptr;
  plan->pdl = plan->loaded->entry->pdl && pdl_enabled() && cuda_driver(&d).ok() && d->cuLaunchKernelEx;
  if (splits > 1) {
    const size_t parts = static_cast<size_t>(p.batch * p.hq * p.sq * splits);
    plan->workspace_bytes = align_up(parts * static_cast<size_t>(p.dv) * 4) + align_up(parts * 4);
  }
  return Status::Ok();
}

}  // namespace

FwdGrid fwd_grid(const KernelEntry& e, const FlashParams& p, int sm_count, int32_t* window_right) {
  const int64_t tiles_m = (p.sq + e.block_m - 1) / e.block_m;
  const int64_t bh = p.batch * p.hq;
  if (e.persistent <= 0) return {tiles_m, bh, tiles_m * bh};
  // The kernel takes no windows (a call with one never reaches it), so the argument is free.
  *window_right = static_cast<int32_t>(bh);
  return {std::min<int64_t>(tiles_m * bh, static_cast<int64_t>(e.persistent) * std::max(1, sm_count)), 1,
          tiles_m * bh};
}

Status launch_flash_cuda(const FlashParams& p, CUstream stream, const WorkspaceFn& workspace) {
  if (p.sq == 0 || p.batch == 0 || p.hq == 0) return Status::Ok();
  // A call no kernel can take fails before the kernels load.
  VariantKey key{};
  ORT_FLASH_RETURN_IF_ERROR(select_variant(p, &key));
  const DeviceKernels* dk = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(kernels_for_stream(stream, &dk));
  return launch_flash_cuda_with(p, *dk, stream, workspace);
}

Status launch_flash_cuda_with(const FlashParams& p, const DeviceKernels& dk, CUstream stream,
                              const WorkspaceFn& workspace) {
  if (p.sq == 0 || p.batch == 0 || p.hq == 0) return Status::Ok();
  const CudaDriver* d = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(cuda_driver(&d));
  VariantKey key{};
  ORT_FLASH_RETURN_IF_ERROR(select_variant(p, &key));
  if (p.sq > INT32_MAX || p.skv > INT32_MAX) {
    return Status::Error("sequence lengths above 2^31 - 1 are not supported");
  }
  LaunchPlan plan;
  ORT_FLASH_RETURN_IF_ERROR(plan_flash_cuda(p, dk, static_cast<bool>(workspace), &plan));
  if (plan.kind == KernelKind::kDecode) return launch_decode(p, dk, plan, stream, workspace);
  const bool described = plan.kind == KernelKind::kFwdTma || plan.kind == KernelKind::kFwdGluon;
  const LoadedKernel* k = described ? plan.second : plan.loaded;
  if (!k) {
    return Status::Error("no CUDA kernel in this build for " + describe(key) + " on sm_" +
                         std::to_string(dk.arch) + "; see `ort-flash info` for the compiled variants");
  }
  // The launch ABI (aot/build.py): runtime arguments in kernel order, then two scratch pointers.
  KernelArgs a(p);
  std::vector<void*> args;
  args.reserve(kTmaLaunchArgCount + 2);
  const LoadedKernel* launched = k;
  TmaArg tma[kTmaDescriptors];
  // The Gluon kernel takes exactly the TMA kernel's arguments (kGluonLaunchArgCount).
  if (described && encode_tma_args(*d, p, *plan.loaded->entry, tma)) launched = plan.loaded;
  if (launched != k) {
    for (TmaArg& t : tma) t.push(args);
  } else {
    for (CUdeviceptr* x : {&a.q, &a.k, &a.v, &a.y}) args.push_back(x);
  }
  a.push_outputs_and_masks(args);
  a.push_scalars(args);
  a.push_strides_and_scratch(args);
  const KernelEntry& le = *launched->entry;
  const size_t expected = (launched == k ? kLaunchArgCount
                           : (plan.kind == KernelKind::kFwdGluon ? kGluonLaunchArgCount : kTmaLaunchArgCount)) + 2;
  if (args.size() != expected) return Status::Error("internal error: launch argument count mismatch");
  // a.ints[9] is window_right, pushed above by address: a persistent kernel reads B * Hq there.
  const FwdGrid grid = fwd_grid(le, p, dk.sm_count, &a.ints[9]);
  // A CTA per tile puts B * Hq on the grid's y; a persistent kernel numbers the call's tiles in
  // int32, up to one past the last for each CTA (its next tile: this one + the CTAs).
  if (grid.y > 65535) {
    return Status::Error("batch x query heads = " + std::to_string(grid.y) + " exceeds the CUDA grid limit of 65535");
  }
  if (le.persistent > 0 && grid.tiles > INT32_MAX - grid.x) {
    return Status::Error("batch x query heads x query tiles = " + std::to_string(grid.tiles) + " is too many for " +
                         std::string(le.variant_name) + ": its CTAs number the tiles, and one past the last each, in int32");
  }
  if (le.dynamic) {
    // The tile counter pair rides in the (unused) key-lengths pointer, has_seqlens (a.ints[11])
    // saying whether there is one: without (no set for this stream) the kernel takes its tiles
    // round robin, in the same order.
    CUdeviceptr counters = 0;
    ORT_FLASH_RETURN_IF_ERROR(stream_counters(*d, dk, stream, 0, &counters));
    a.seqlens = counters ? counters + kTileCounterOffset : 0;
    a.ints[11] = counters ? 1 : 0;
  }
  return cuda_check(d->cuLaunchKernel(launched->function, static_cast<unsigned>(grid.x),
                                      static_cast<unsigned>(grid.y), 1, 32 * le.num_warps, 1, 1,
                                      static_cast<unsigned>(le.shared), stream, args.data(), nullptr),
                    (std::string("cuLaunchKernel(") + le.variant_name + ")").c_str());
}

namespace {

Status launch_decode(const FlashParams& p, const DeviceKernels& dk, const LaunchPlan& plan,
                     CUstream stream, const WorkspaceFn& workspace) {
  const CudaDriver* d = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(cuda_driver(&d));
  const LoadedKernel* k = plan.loaded;
  const LoadedKernel* c = plan.second;
  const KernelEntry& e = *k->entry;
  CUdeviceptr opart = 0, lpart = 0;
  if (plan.num_splits > 1) {
    void* ws = nullptr;
    ORT_FLASH_RETURN_IF_ERROR(workspace(plan.workspace_bytes, &ws));
    if (!ws) return Status::Error("no workspace for the split-KV partials");
    opart = reinterpret_cast<CUdeviceptr>(ws);
    const size_t parts = static_cast<size_t>(p.batch * p.hq * p.sq * plan.num_splits);
    lpart = opart + align_up(parts * static_cast<size_t>(p.dv) * 4);
  }
  const int64_t group = p.hq / p.hkv;
  const int64_t m_blocks = (p.sq * group + e.block_m - 1) / e.block_m;
  CUdeviceptr counters = 0;
  if (plan.fused_merge) {
    ORT_FLASH_RETURN_IF_ERROR(stream_counters(*d, dk, stream, p.batch * p.hkv * m_blocks, &counters));
  }
  KernelArgs a(p);
  int32_t splits = plan.num_splits;
  int32_t fused = counters != 0 ? 1 : 0;
  std::vector<void*> args{&a.q, &a.k, &a.v, &a.y};
  a.push_outputs_and_masks(args);
  args.push_back(&opart);
  args.push_back(&lpart);
  args.push_back(&counters);
  a.push_scalars(args);
  args.push_back(&splits);
  args.push_back(&fused);
  a.push_strides_and_scratch(args);
  if (args.size() != kDecodeArgCount + 2) return Status::Error("internal error: decode argument count mismatch");
  ORT_FLASH_RETURN_IF_ERROR(launch_kernel(*d, *k, static_cast<unsigned>(splits),
                                          static_cast<unsigned>(p.batch * p.hkv),
                                          static_cast<unsigned>(m_blocks), stream, args.data(), plan.pdl));
  if (splits == 1 || fused) return Status::Ok();
  const KernelEntry& ce = *c->entry;
  const int64_t rows = p.batch * p.hq * p.sq;
  if (rows > INT32_MAX) return Status::Error("batch x heads x queries above 2^31 - 1 are not supported");
  // hq, sq, dv, store_lse and Y's strides come from the shared arguments.
  void* cargs[kCombineArgCount + 2] = {&opart, &lpart, &a.y, &a.lse, &a.ints[0], &a.ints[2], &a.ints[5],
                                       &splits, &a.ints[12], &a.strides[9], &a.strides[10],
                                       &a.strides[11], &a.global_scratch, &a.profile_scratch};
  return launch_kernel(*d, *c, static_cast<unsigned>(rows), 1, 1, stream, cargs, false);
}

}  // namespace

}  // namespace ort_flash
