// FlashAttention-2 style forward pass on the CPU (see cpu_flash.h).
//
// Work item = (batch, kv head, tile of query rows). The rows of a tile are the packed
// (query i, q head of the kv head's group) pairs in i-major order, so a decode step of a GQA
// group shares one pass over K/V and a causal tile covers few distinct query positions. For
// each key block (kBlockN keys) of the tile's attended key range, K^T and V are converted to
// fp32 tile buffers, scores S = (scale * Q) K^T are formed with vectorizable loops, and every
// row updates its running max m, sum l and output accumulator (online softmax, fp32).
// Nothing of size Sq x Skv exists; the buffers are O(tile), in a per-thread arena.
//
// Build with -O3 (auto-vectorization); never with -ffast-math / -ffinite-math-only: the
// masking relies on IEEE -inf arithmetic.
#include "cpu_flash.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace ort_flash {
namespace {

constexpr int64_t kMaxRows = 64;   // query rows per tile, at most
constexpr int64_t kMinRows = 8;    // tiles shrink down to this to give the pool enough tasks
constexpr int64_t kMinTasks = 16;
constexpr int64_t kBlockN = 64;    // keys per block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

// ---- fp16 / bf16 <-> fp32 (stores round to nearest even) -----------------------------------

struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

inline float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, sizeof f); return f; }
inline uint32_t to_bits(float f) { uint32_t u; std::memcpy(&u, &f, sizeof u); return u; }

inline float to_float(float x) { return x; }
inline float to_float(BFloat16 x) { return from_bits(uint32_t(x.bits) << 16); }
inline float to_float(Half x) {  // selects by masks, so that conversion loops vectorize
  const uint32_t em = x.bits & 0x7fffu;
  const uint32_t is_sub = 0u - uint32_t(em < 0x0400u);        // zero or subnormal
  const uint32_t is_inf_nan = 0u - uint32_t(em >= 0x7c00u);
  // Rebias the exponent by 127 - 15; inf / nan by another 112 to reach 255 (payload kept).
  const uint32_t normal = (em << 13) + (112u << 23) + (is_inf_nan & (112u << 23));
  const uint32_t subnormal = to_bits(float(int32_t(em)) * 0x1p-24f);  // em * 2^-24, exact
  const uint32_t u = (is_sub & subnormal) | (~is_sub & normal);
  return from_bits(u | (uint32_t(x.bits & 0x8000u) << 16));
}

inline void store(float x, float* out) { *out = x; }
inline void store(float x, BFloat16* out) {
  uint32_t u = to_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    out->bits = uint16_t((u >> 16) | 0x40u);  // quiet nan
    return;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  out->bits = uint16_t(u >> 16);
}
inline void store(float x, Half* out) {
  uint32_t u = to_bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  uint32_t h;
  if (u >= 0x47800000u) {          // |x| >= 2^16, inf, nan
    h = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 0x38800000u) {    // |x| < 2^-14: fp16 subnormal; the fp32 add rounds at 2^-24
    h = to_bits(from_bits(u) + 0.5f) - 0x3f000000u;
  } else {                         // normal: rebias, round half to even (may carry into inf)
    u += 0xc8000fffu + ((u >> 13) & 1u);
    h = u >> 13;
  }
  out->bits = uint16_t(h | sign);
}

// ---- int64 helpers -------------------------------------------------------------------------

inline int64_t sat_add(int64_t a, int64_t b) {
  if (b > 0 && a > kInt64Max - b) return kInt64Max;
  if (b < 0 && a < kInt64Min - b) return kInt64Min;
  return a + b;
}
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- the tile worker -----------------------------------------------------------------------

constexpr int64_t kLanes = 8;  // V and accumulator rows are padded to a multiple of this (zeros)
inline int64_t round_up(int64_t x) { return ceil_div(x, kLanes) * kLanes; }

// Vectorizable conversion of n elements to fp32.
template <class T>
inline void load_row(const T* src, int64_t n, float scale, float* dst) {
  for (int64_t e = 0; e < n; ++e) dst[e] = scale * to_float(src[e]);
}
template <class T>
inline void load_row(const T* src, int64_t n, float* dst) {
  for (int64_t e = 0; e < n; ++e) dst[e] = to_float(src[e]);
}

struct Row {
  int64_t q_off, y_off, lse_off, mask_off;  // element offsets of (b, h, i, 0)
  int64_t lo, hi;                            // keys [lo, hi) pass the positional rules
};

// Per-thread scratch, reused across tasks and calls: ONNX Runtime's ParallelFor runs one item
// per task, so buffers allocated per task would be allocated per tile. Kept under kKeepFloats.
struct Arena {
  std::vector<float> floats;
  std::vector<Row> rows;
};
constexpr size_t kKeepFloats = size_t(1) << 22;  // 16 MiB per thread at most between calls

Arena& thread_arena() {
  thread_local Arena arena;
  return arena;
}

template <class T>
class TileWorker {
 public:
  TileWorker(const FlashParams& p, int64_t tile_rows, Arena& arena)
      : p_(p),
        group_(p.hq / p.hkv),
        tiles_(ceil_div(group_ * p.sq, tile_rows)),
        tile_rows_(tile_rows),
        dv8_(round_up(p.dv)) {
    const size_t sizes[] = {
        size_t(tile_rows * p.d),   // qs_: scale * Q rows of the tile
        size_t(p.d * kBlockN),     // kt_: K block, transposed
        size_t(p.d),               // krow_: one K row converted to fp32
        size_t(kBlockN * dv8_),    // vb_: V block, rows padded to dv8_
        size_t(tile_rows * kBlockN),  // s_: scores, then probabilities
        size_t(tile_rows * dv8_),  // acc_: unnormalized outputs
        size_t(tile_rows),         // m_: running max
        size_t(tile_rows)};        // l_: running sum
    float** ptrs[] = {&qs_, &kt_, &krow_, &vb_, &s_, &acc_, &m_, &l_};
    // Buffers start 64 bytes apart modulo 4 KiB, so that loads from one and stores to another
    // do not falsely alias (4K aliasing stalls the PV loop otherwise).
    const size_t kStagger = 16;
    size_t total = 0;
    for (size_t n : sizes) total += n + kStagger;
    if (arena.floats.size() < total) arena.floats.resize(total);
    if (arena.rows.size() < size_t(tile_rows)) arena.rows.resize(size_t(tile_rows));
    float* next = arena.floats.data();
    for (size_t i = 0; i < 8; ++i) {
      *ptrs[i] = next;
      next += sizes[i] + kStagger;
    }
    rows_ = arena.rows.data();
    // The score loop runs over all kBlockN columns of kt_: keep unused ones finite (zero).
    std::fill(kt_, kt_ + sizes[1], 0.0f);
  }

  void run(int64_t item) {
    const int64_t t = item % tiles_;
    const int64_t hk = (item / tiles_) % p_.hkv;
    const int64_t b = item / tiles_ / p_.hkv;
    const int64_t n0 = t * tile_rows_;
    const int64_t nrows = std::min(tile_rows_, group_ * p_.sq - n0);
    int64_t lo = kInt64Max, hi = kInt64Min;
    for (int64_t r = 0; r < nrows; ++r) {
      Row& row = rows_[r];
      set_row(row, b, hk * group_ + (n0 + r) % group_, (n0 + r) / group_);
      if (row.lo < row.hi) {
        lo = std::min(lo, row.lo);
        hi = std::max(hi, row.hi);
      }
    }
    start_tile(nrows);
    const T* k = static_cast<const T*>(p_.k) + b * p_.k_stride[0] + hk * p_.k_stride[1];
    const T* v = static_cast<const T*>(p_.v) + b * p_.v_stride[0] + hk * p_.v_stride[1];
    for (int64_t kb = lo; kb < hi; kb += kBlockN) {
      const int64_t nb = std::min(kBlockN, hi - kb);
      int64_t ja, jb;  // keys of the block that some row attends
      if (!block_range(0, nrows, kb, nb, ja, jb)) continue;  // a gap between windows
      load_k(k, kb, ja, jb);
      for (int64_t j = ja; j < jb; ++j) {
        float* dst = vb_ + j * dv8_;
        load_row(v + (kb + j) * p_.v_stride[2], p_.dv, dst);
        std::fill(dst + p_.dv, dst + dv8_, 0.0f);  // padding read by the PV loop
      }
      scores(nrows, kb, nb);
      for (int64_t r = 0; r < nrows; ++r) softmax_update(r, kb, nb);
    }
    finish_tile(nrows);
  }

 private:
  // [ja, jb): the keys of block [kb, kb + nb) that rows [r0, r1) attend; false if none.
  bool block_range(int64_t r0, int64_t r1, int64_t kb, int64_t nb, int64_t& ja,
                   int64_t& jb) const {
    ja = nb;
    jb = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const Row& row = rows_[r];
      const int64_t a = std::max(row.lo, kb) - kb, z = std::min(row.hi, kb + nb) - kb;
      if (a < z) {
        ja = std::min(ja, a);
        jb = std::max(jb, z);
      }
    }
    return ja < jb;
  }

  void set_row(Row& row, int64_t b, int64_t h, int64_t i) const {
    row.q_off = b * p_.q_stride[0] + h * p_.q_stride[1] + i * p_.q_stride[2];
    row.y_off = b * p_.y_stride[0] + h * p_.y_stride[1] + i * p_.y_stride[2];
    row.lse_off = (b * p_.hq + h) * p_.sq + i;
    row.mask_off = b * p_.mask_stride[0] + h * p_.mask_stride[1] + i * p_.mask_stride[2];
    int64_t hi = p_.skv;
    int64_t offset = p_.offset;
    if (p_.seqlens_k != nullptr) {
      hi = std::min(hi, p_.seqlens_k[b]);
      offset = sat_add(p_.seqlens_k[b], -p_.sq);
    }
    if (p_.mask_kind != MaskKind::kNone) hi = std::min(hi, p_.mask_len);
    const int64_t pos = sat_add(i, offset);
    if (p_.causal) hi = std::min(hi, sat_add(pos, 1));
    if (p_.window_right >= 0) hi = std::min(hi, sat_add(sat_add(pos, p_.window_right), 1));
    row.lo = p_.window_left >= 0 ? std::max<int64_t>(0, sat_add(pos, -p_.window_left)) : 0;
    row.hi = hi;
  }

  void start_tile(int64_t nrows) {
    const T* q = static_cast<const T*>(p_.q);
    for (int64_t r = 0; r < nrows; ++r) {
      load_row(q + rows_[r].q_off, p_.d, p_.scale, qs_ + r * p_.d);
      m_[r] = kNegInf;
      l_[r] = 0.0f;
    }
    std::fill(acc_, acc_ + nrows * dv8_, 0.0f);
  }

  // kt_ = K[kb + ja : kb + jb]^T in fp32 (columns outside [ja, jb) keep stale finite values
  // whose scores no row reads); conversion runs on contiguous rows, the transpose on fp32.
  void load_k(const T* k, int64_t kb, int64_t ja, int64_t jb) {
    const int64_t d = p_.d;
    for (int64_t j = ja; j < jb; ++j) {
      const T* src = k + (kb + j) * p_.k_stride[2];
      const float* row = src_row(src);
      for (int64_t e = 0; e < d; ++e) kt_[e * kBlockN + j] = row[e];
    }
  }
  const float* src_row(const float* src) { return src; }
  template <class U>
  const float* src_row(const U* src) {
    load_row(src, p_.d, krow_);
    return krow_;
  }

  // s_[r, :] = qs_[r] . kt_ over the whole block, four rows per pass over kt_; the inner loop
  // runs over kBlockN contiguous keys.
  void scores(int64_t nrows, int64_t kb, int64_t nb) {
    const int64_t d = p_.d;
    const float* kt = kt_;
    for (int64_t r0 = 0; r0 < nrows; r0 += 4) {
      const int64_t nr = std::min<int64_t>(4, nrows - r0);
      int64_t ja, jb;
      if (!block_range(r0, r0 + nr, kb, nb, ja, jb)) continue;
      float t[4][kBlockN] = {};
      const float* q0 = qs_ + r0 * d;
      const float* q1 = q0 + (nr > 1 ? d : 0);
      const float* q2 = q0 + (nr > 2 ? 2 * d : 0);
      const float* q3 = q0 + (nr > 3 ? 3 * d : 0);
      for (int64_t e = 0; e < d; ++e) {
        const float a0 = q0[e], a1 = q1[e], a2 = q2[e], a3 = q3[e];
        const float* kr = kt + e * kBlockN;
        for (int64_t j = 0; j < kBlockN; ++j) {
          t[0][j] += a0 * kr[j];
          t[1][j] += a1 * kr[j];
          t[2][j] += a2 * kr[j];
          t[3][j] += a3 * kr[j];
        }
      }
      for (int64_t r = 0; r < nr; ++r)
        std::memcpy(s_ + (r0 + r) * kBlockN, t[r], sizeof(float) * kBlockN);
    }
  }

  // Softcap, masks, then the online-softmax update of row r with keys [kb, kb + nb).
  void softmax_update(int64_t r, int64_t kb, int64_t nb) {
    const Row& row = rows_[r];
    const int64_t j0 = std::max(row.lo, kb) - kb;
    const int64_t j1 = std::min(row.hi, kb + nb) - kb;
    if (j0 >= j1) return;
    float* s = s_ + r * kBlockN;
    if (p_.softcap > 0.0f) {
      const float c = p_.softcap;
      for (int64_t j = j0; j < j1; ++j) s[j] = c * std::tanh(s[j] / c);
    }
    const int64_t ms = p_.mask_stride[3];
    if (p_.mask_kind == MaskKind::kBool) {
      const uint8_t* mk = static_cast<const uint8_t*>(p_.mask) + row.mask_off + kb * ms;
      for (int64_t j = j0; j < j1; ++j)
        if (mk[j * ms] == 0) s[j] = kNegInf;
    } else if (p_.mask_kind == MaskKind::kAdditive) {
      const T* mk = static_cast<const T*>(p_.mask) + row.mask_off + kb * ms;
      for (int64_t j = j0; j < j1; ++j) s[j] += to_float(mk[j * ms]);
    }
    float mx = kNegInf;
    for (int64_t j = j0; j < j1; ++j) mx = std::max(mx, s[j]);
    if (mx == kNegInf) {  // nothing attended in this block, or only NaN scores (max skips NaN)
      for (int64_t j = j0; j < j1; ++j)
        if (std::isnan(s[j])) m_[r] = l_[r] = std::numeric_limits<float>::quiet_NaN();  // NaN row
      return;
    }
    const float m_old = m_[r];
    const float m_new = std::max(m_old, mx);
    const float alpha = std::exp(m_old - m_new);  // 0 on the first attended block
    float sum = 0.0f;
    for (int64_t j = j0; j < j1; ++j) {
      s[j] = std::exp(s[j] - m_new);
      sum += s[j];
    }
    const int64_t dv8 = dv8_;
    float* acc = acc_ + r * dv8;
    if (alpha != 1.0f)
      for (int64_t e = 0; e < dv8; ++e) acc[e] *= alpha;
    // acc += sum_j s[j] * V[j], four keys per pass over acc (masked keys have s[j] = 0).
    int64_t j = j0;
    for (; j + 4 <= j1; j += 4) {
      const float p0 = s[j], p1 = s[j + 1], p2 = s[j + 2], p3 = s[j + 3];
      const float* v0 = vb_ + j * dv8;
      const float* v1 = v0 + dv8;
      const float* v2 = v1 + dv8;
      const float* v3 = v2 + dv8;
      for (int64_t e = 0; e < dv8; e += kLanes)
        for (int64_t u = 0; u < kLanes; ++u)
          acc[e + u] += (p0 * v0[e + u] + p1 * v1[e + u]) + (p2 * v2[e + u] + p3 * v3[e + u]);
    }
    for (; j < j1; ++j) {
      const float pj = s[j];
      const float* vr = vb_ + j * dv8;
      for (int64_t e = 0; e < dv8; e += kLanes)
        for (int64_t u = 0; u < kLanes; ++u) acc[e + u] += pj * vr[e + u];
    }
    m_[r] = m_new;
    l_[r] = l_[r] * alpha + sum;
  }

  void finish_tile(int64_t nrows) {
    T* y = static_cast<T*>(p_.y);
    const int64_t dv = p_.dv;
    for (int64_t r = 0; r < nrows; ++r) {
      const Row& row = rows_[r];
      const float m = m_[r], l = l_[r];
      const bool empty = m == kNegInf;  // no attended key: y = 0, lse = -inf
      const float* acc = acc_ + r * dv8_;
      T* dst = y + row.y_off;
      if (empty) {
        for (int64_t e = 0; e < dv; ++e) store(0.0f, dst + e);
      } else {
        for (int64_t e = 0; e < dv; ++e) store(acc[e] / l, dst + e);
      }
      if (p_.lse != nullptr) p_.lse[row.lse_off] = empty ? kNegInf : m + std::log(l);
    }
  }

  const FlashParams& p_;
  const int64_t group_, tiles_, tile_rows_, dv8_;
  float *qs_, *kt_, *krow_, *vb_, *s_, *acc_, *m_, *l_;
  Row* rows_;
};

void validate(const FlashParams& p) {
  auto fail = [](const std::string& what) {
    throw std::invalid_argument("ort_flash CPU FlashAttention: " + what);
  };
  if (p.dtype != DType::kFloat32 && p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16)
    fail("unknown dtype");
  if (p.mask_kind != MaskKind::kNone && p.mask_kind != MaskKind::kBool &&
      p.mask_kind != MaskKind::kAdditive)
    fail("unknown mask kind");
  if (p.batch < 0 || p.hq < 0 || p.hkv < 0 || p.sq < 0 || p.skv < 0 || p.d < 0 || p.dv < 0)
    fail("negative size");
  if (p.hq > 0 && (p.hkv <= 0 || p.hq % p.hkv != 0))
    fail("q heads (" + std::to_string(p.hq) + ") must be a multiple of kv heads (" +
         std::to_string(p.hkv) + ")");
  if (p.window_left < -1 || p.window_right < -1) fail("window sizes must be -1 or >= 0");
  if (p.mask_kind != MaskKind::kNone && p.mask_len < 0) fail("negative mask_len");
  if (p.batch == 0 || p.hq == 0 || p.sq == 0) return;  // nothing is read or written
  if (p.y == nullptr && p.dv > 0) fail("null Y");
  if (p.q == nullptr && p.d > 0) fail("null Q");
  if (p.skv > 0 && ((p.k == nullptr && p.d > 0) || (p.v == nullptr && p.dv > 0)))
    fail("null K or V");
  if (p.mask_kind != MaskKind::kNone && p.mask == nullptr && p.skv > 0 && p.mask_len > 0)
    fail("null mask");
}

// Tile height: kMaxRows, halved (down to kMinRows) while there are too few tasks.
int64_t pick_tile_rows(const FlashParams& p) {
  const int64_t rows = p.hq / p.hkv * p.sq;
  int64_t tile = kMaxRows;
  while (tile > kMinRows && p.batch * p.hkv * ceil_div(rows, tile) < kMinTasks) tile /= 2;
  return std::min(tile, rows);
}

template <class T>
void run_typed(const FlashParams& p, const ParallelFor& parallel_for) {
  const int64_t tile_rows = pick_tile_rows(p);
  const int64_t items = p.batch * p.hkv * ceil_div(p.hq / p.hkv * p.sq, tile_rows);
  std::exception_ptr error;
  std::mutex error_mutex;
  const std::function<void(size_t, size_t)> task = [&](size_t begin, size_t end) {
    try {
      Arena& arena = thread_arena();
      TileWorker<T> worker(p, tile_rows, arena);
      for (size_t it = begin; it < end; ++it) worker.run(int64_t(it));
      if (arena.floats.size() > kKeepFloats) arena = Arena();
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  if (parallel_for) {
    parallel_for(size_t(items), task);
  } else {
    task(0, size_t(items));
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

void run_flash_cpu(const FlashParams& p, const ParallelFor& parallel_for) {
  validate(p);
  if (p.batch == 0 || p.hq == 0 || p.sq == 0) return;
  switch (p.dtype) {
    case DType::kFloat32: run_typed<float>(p, parallel_for); break;
    case DType::kFloat16: run_typed<Half>(p, parallel_for); break;
    case DType::kBFloat16: run_typed<BFloat16>(p, parallel_for); break;
  }
}

}  // namespace ort_flash
