#include "launch_plan.h"

#include <algorithm>

#include "decode_heuristics.h"
#include "kernel_select.h"
#include "tma_desc.h"

namespace ort_flash {
namespace {

KernelLaunch launch_of(const LoadedKernel& k, int64_t gx, int64_t gy, int64_t gz) {
  KernelLaunch l;
  l.kernel = &k;
  l.grid[0] = gx;
  l.grid[1] = gy;
  l.grid[2] = gz;
  l.block = 32u * static_cast<unsigned>(k.entry->num_warps);
  l.shared = static_cast<unsigned>(k.entry->shared);
  return l;
}

KernelLaunch fwd_launch(const LoadedKernel& k, const FlashParams& p, int sm_count) {
  const KernelEntry& e = *k.entry;
  const FwdGrid g = fwd_grid(e, p, sm_count);
  KernelLaunch l = launch_of(k, g.x, g.y, 1);
  l.tile_counters = e.dynamic;
  // A CTA per tile puts B x Hq on the grid's y; a persistent kernel numbers the call's tiles in
  // int32, up to one past the last for each CTA (its next tile: this one + the CTAs).
  if (g.y > 65535) {
    l.error = "batch x query heads = " + std::to_string(g.y) + " exceeds the CUDA grid limit of 65535";
  } else if (e.persistent > 0 && g.tiles > INT32_MAX - g.x) {
    l.error = "batch x query heads x query tiles = " + std::to_string(g.tiles) + " is too many for " +
              std::string(e.variant_name) + ": its CTAs number the tiles, and one past the last each, in int32";
  }
  return l;
}

// The decode plan, or false where the call is no decode shape or the build lacks its kernels.
bool plan_decode(const FlashParams& p, const DeviceKernels& dk, const LaunchSwitches& sw, bool can_split,
                 LaunchPlan* plan) {
  if (sw.decode_splits == 0 || p.hkv <= 0) return false;
  const int64_t rows = p.hq / p.hkv * p.sq;
  if (!decode_shape(p.sq, rows, p.batch * p.hkv)) return false;
  VariantKey key = decode_key(p, KernelKind::kDecode);
  if (key.head_dim == 0) return false;
  const LoadedKernel* k = find_superset(dk, &key, p.causal);  // the base tile plans the splits
  const LoadedKernel* c = find_kernel(dk, decode_key(p, KernelKind::kCombine));
  if (!k || !c) return false;
  const KernelEntry& e = *k->entry;
  const int64_t m_blocks = ceil_div(rows, e.block_m);
  const int64_t ctas = p.batch * p.hkv * m_blocks;
  const int64_t key_blocks = std::max<int64_t>(1, ceil_div(p.skv, e.block_n));
  const int64_t sms = std::max(1, dk.sm_count);
  const int64_t splits = decode_splits(can_split ? sw.decode_splits : 1, ctas, key_blocks, p.skv,
                                       sms * decode_ctas_per_sm(key.head_dim));
  // A grid of more CTAs than SMs takes the tile for it where the build has one (same block_m and
  // block_n, so the same splits and workspace).
  const LoadedKernel* w = pick_tile(dk, key, p.causal, decode_waves(ctas, key_blocks, splits, sms));
  if (w && w->entry->block_m == e.block_m && w->entry->block_n == e.block_n) k = w;

  plan->kind = KernelKind::kDecode;
  plan->num_splits = static_cast<int>(splits);
  plan->fused_merge = fuse_combine(splits, std::min<int64_t>(e.block_m, rows), sw.fused_combine);
  plan->merge_counters = plan->fused_merge ? ctas : 0;
  plan->main = launch_of(*k, splits, p.batch * p.hkv, m_blocks);
  plan->main.pdl = k->entry->pdl && sw.pdl && dk.launch_ex;
  const int64_t combine_rows = p.batch * p.hq * p.sq;
  plan->second = launch_of(*c, combine_rows, 1, 1);
  if (combine_rows > INT32_MAX) plan->second.error = "batch x heads x queries above 2^31 - 1 are not supported";
  if (splits > 1) {
    const DecodeWorkspace ws = decode_workspace(combine_rows * splits, p.dv);
    plan->workspace_bytes = ws.bytes;
    plan->lse_offset = ws.lse_offset;
  }
  return true;
}

}  // namespace

FwdGrid fwd_grid(const KernelEntry& e, const FlashParams& p, int sm_count) {
  const int64_t tiles_m = ceil_div(p.sq, e.block_m);
  const int64_t bh = p.batch * p.hq;
  if (e.persistent <= 0) return {tiles_m, bh, tiles_m * bh};
  return {std::min<int64_t>(tiles_m * bh, static_cast<int64_t>(e.persistent) * std::max(1, sm_count)), 1,
          tiles_m * bh};
}

LaunchPlan plan_launch(const FlashParams& p, const VariantKey& key, const DeviceKernels& dk,
                       const LaunchSwitches& sw, bool can_split) {
  LaunchPlan plan;
  plan.key = key;
  if (plan_decode(p, dk, sw, can_split, &plan)) return plan;
  const LoadedKernel* k = find_fwd_kernel(dk, key);
  const LoadedKernel* g = gluon_kernel(p, dk, key, sw);
  const LoadedKernel* t = g ? nullptr : tma_kernel(p, dk, key, sw);
  const bool described = (g || t) && tma_views_ok(p);
  if (described) {
    plan.kind = g ? KernelKind::kFwdGluon : KernelKind::kFwdTma;
    plan.main = fwd_launch(g ? *g : *t, p, dk.sm_count);
  }
  if (k) (described ? plan.second : plan.main) = fwd_launch(*k, p, dk.sm_count);
  if (!k) {
    plan.error = "no CUDA kernel in this build for " + describe(key) + " on sm_" + std::to_string(dk.arch) +
                 "; see `ort-flash info` for the compiled variants";
  }
  return plan;
}

FlashParams unmasked_twin(const FlashParams& p) {
  FlashParams u = p;
  u.mask = nullptr;
  u.mask_kind = MaskKind::kNone;
  for (int64_t& s : u.mask_stride) s = 0;
  u.mask_stride[3] = 1;
  u.mask_len = 0;
  return u;
}

Status plan_flash_cuda(const FlashParams& p, const DeviceKernels& dk, bool can_split, LaunchPlan* plan) {
  const LaunchSwitches sw = launch_switches();
  if (p.key_bound != nullptr && (p.mask_kind == MaskKind::kNone || p.seqlens_k != nullptr)) {
    return Status::Error("a key bound needs the key mask that states it, and no key lengths");
  }
  if (p.key_bound != nullptr && sw.key_bound) {
    const FlashParams u = unmasked_twin(p);
    VariantKey key{};
    ORT_FLASH_RETURN_IF_ERROR(select_variant(u, &key));
    LaunchPlan bounded = plan_launch(u, key, dk, sw, can_split);
    if (bounded.kind == KernelKind::kFwdGluon && bounded.error.empty() && bounded.main.error.empty()) {
      bounded.bounded = true;
      *plan = bounded;
      return Status::Ok();
    }
  }
  VariantKey key{};
  ORT_FLASH_RETURN_IF_ERROR(select_variant(p, &key));
  *plan = plan_launch(p, key, dk, sw, can_split);
  return Status::Ok();
}

}  // namespace ort_flash
