#include "kernel_select.h"

#include <algorithm>

namespace ort_flash {
namespace {

int head_dim_bucket(int64_t d) {
  for (int b : {32, 64, 128, 256}) {
    if (d <= b) return b;
  }
  return 0;
}

int decode_bucket(int64_t d) {
  for (int b : {64, 128, 256}) {
    if (d <= b) return b;
  }
  return 0;
}

// Buckets that have an exact-size variant (aot/variants.py HEAD_DIMS).
bool has_even_variant(int bucket) { return bucket != 32; }

bool has_extras(const FlashParams& p) {
  return p.window_left >= 0 || p.window_right >= 0 || p.softcap > 0.0f || p.seqlens_k != nullptr;
}

// The descriptor kinds take fp16/bf16 calls of an exact head dim, unmasked or with a key-vector
// mask, on a driver that encodes tensor maps, unless ORT_FLASH_TMA=0.
bool descriptor_call(const FlashParams& p, const DeviceKernels& dk, const VariantKey& key, const LaunchSwitches& sw) {
  return sw.tma && key.even_d && (key.mask == MaskKind::kNone || key.mask_keys) && p.dtype != DType::kFloat32 &&
         dk.tensor_maps;
}

}  // namespace

bool strides_aligned(const FlashParams& p) {
  for (const int64_t* s : {p.q_stride, p.k_stride, p.v_stride, p.y_stride}) {
    for (int i = 0; i < 3; ++i) {
      if (s[i] % 16 != 0) return false;
    }
  }
  return true;
}

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
  key->extras = has_extras(p);
  key->precision = p.dtype == DType::kFloat32 ? p.fp32_precision : Fp32Precision::kIeee;
  if (key->even_d && !has_even_variant(key->head_dim)) key->even_d = false;
  // One mask row serves every query row (a (B, 1, 1, S) padding mask, or a single query):
  // the kernels that read it as one key vector per (batch, head), where the build has them.
  key->mask_keys = p.mask_kind != MaskKind::kNone && (p.mask_stride[2] == 0 || p.sq == 1);
  return Status::Ok();
}

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
  key.extras = has_extras(p);
  return key;
}

const LoadedKernel* find_kernel(const DeviceKernels& dk, const VariantKey& key) {
  for (const LoadedKernel& lk : dk.kernels) {
    if (lk.entry->key == key) return &lk;
  }
  return nullptr;
}

const LoadedKernel* pick_tile(const DeviceKernels& dk, const VariantKey& key, bool causal, int64_t measure,
                              bool any_length) {
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

const LoadedKernel* find_superset(const DeviceKernels& dk, VariantKey* key, bool causal) {
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

const LoadedKernel* find_fwd_kernel(const DeviceKernels& dk, VariantKey key) {
  if (const LoadedKernel* k = find_superset(dk, &key)) return k;
  if (!key.mask_keys) return nullptr;
  key.mask_keys = false;
  return find_superset(dk, &key);
}

const LoadedKernel* tma_kernel(const FlashParams& p, const DeviceKernels& dk, VariantKey key,
                               const LaunchSwitches& sw) {
  if (!descriptor_call(p, dk, key, sw)) return nullptr;
  key.kind = KernelKind::kFwdTma;
  return pick_tile(dk, key, p.causal, std::min(p.sq, p.skv));
}

const LoadedKernel* gluon_kernel(const FlashParams& p, const DeviceKernels& dk, VariantKey key,
                                 const LaunchSwitches& sw) {
  if (sw.gluon == 0 || key.extras || !descriptor_call(p, dk, key, sw)) return nullptr;
  key.kind = KernelKind::kFwdGluon;
  return pick_tile(dk, key, p.causal, std::min(p.sq, p.skv), sw.gluon == 1);
}

std::string describe(const VariantKey& k) {
  return std::string(dtype_name(k.dtype)) + ", head dim bucket " + std::to_string(k.head_dim) +
         (k.even_d ? "" : " (masked head dim)") +
         (k.mask == MaskKind::kNone ? ", no mask" : (k.mask == MaskKind::kBool ? ", bool mask" : ", additive mask")) +
         (k.extras ? ", windows/softcap/nonpad_kv_seqlen" : "");
}

}  // namespace ort_flash
