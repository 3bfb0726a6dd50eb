// The CUDA launcher's pure planner: FlashParams and a device's kernels in, one LaunchPlan out,
// holding everything the executor (cuda_launch.cc) needs to pack the arguments and launch.
// No driver calls: plan_with_table runs it for any build and GPU where there is neither.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "flash_params.h"
#include "kernel_registry.h"
#include "kernel_table.h"
#include "launch_switches.h"
#include "status.h"

namespace ort_flash {

// One kernel launch as planned: the kernel, its grid, block and dynamic shared memory.
struct KernelLaunch {
  const LoadedKernel* kernel = nullptr;  // null: the build has no such kernel
  int64_t grid[3] = {1, 1, 1};
  unsigned block = 0;
  unsigned shared = 0;
  // With programmatic stream serialization (KernelEntry::pdl, ORT_FLASH_PDL, a driver with
  // cuLaunchKernelEx): the kernel waits for the grid before it first thing.
  bool pdl = false;
  // A persistent kernel that hands out tiles as CTAs free up (KernelEntry::dynamic): it takes the
  // stream's tile counter pair in its TileCounter argument, or 0 (round-robin tiles) without one.
  bool tile_counters = false;
  // Why this launch cannot run (a grid past CUDA's or the kernel's limits); empty if it can.
  std::string error;
};

// How a call runs, by kind:
//   kFwd       main: the forward kernel.
//   kFwdTma    main: the TMA-descriptor twin; second: the pointer kernel, run where the driver
//   kFwdGluon  cannot encode the maps (main: the Gluon kernel, which takes the same arguments).
//   kDecode    main: the split kernel over `num_splits` KV splits; second: the combine kernel,
//              run with more than one split unless the split kernel merges them (fused_merge,
//              where the stream then has counters).
struct LaunchPlan {
  KernelKind kind = KernelKind::kFwd;
  VariantKey key{};  // the forward variant the call needs (select_variant)
  KernelLaunch main;
  KernelLaunch second;
  // Why the call cannot run at all (no kernel for its variant); empty if it can.
  std::string error;
  int num_splits = 1;
  // More than one split: scratch for the partials (outputs, then log-sum-exps at lse_offset).
  size_t workspace_bytes = 0;
  size_t lse_offset = 0;
  bool fused_merge = false;
  // fused_merge: the arrival counters the split kernel needs (one per row block); a stream's set
  // holds kDecodeCountersPerSlot.
  int64_t merge_counters = 0;

  // A call with a key bound (FlashParams::key_bound) planned as its unmasked twin on the Gluon
  // kernel, which bounds each batch row's keys itself: the executor drops the mask.
  bool bounded = false;

  // The kernel the call launches first (null if none is compiled).
  const KernelEntry* first() const { return main.kernel ? main.kernel->entry : nullptr; }
  // TMA descriptors are encoded for `main`.
  bool described() const { return kind == KernelKind::kFwdTma || kind == KernelKind::kFwdGluon; }
};

// The dispatcher, for a call whose forward variant is `key` (select_variant). The decode kernel
// when few query rows per KV head (decode_heuristics.h) meet a compiled decode variant, split by
// the cost model (`can_split` false: no workspace, one split; ORT_FLASH_DECODE_SPLITS overrides,
// 0 = never decode); a grid of more CTAs than SMs takes the decode tile for it where the build has
// one (aot/variants.py DECODE_WIDE_WAVES). Otherwise the forward kernel (its key-vector-mask
// variant when the mask's query stride is 0): as kFwdGluon where the build has the Gluon kernel
// for the call (kernel_select.h gluon_kernel), else as kFwdTma where it has the TMA twin, when the
// views can be described (tma_desc.h) and the driver can encode tensor maps.
LaunchPlan plan_launch(const FlashParams& p, const VariantKey& key, const DeviceKernels& dk,
                       const LaunchSwitches& sw, bool can_split);

// select_variant, then plan_launch with this process's switches. A call with a key bound (and its
// mask) is planned first without the mask (unless ORT_FLASH_KEY_BOUND=0): where that takes the
// Gluon kernel, the plan is that one (`bounded`); else the masked call's.
Status plan_flash_cuda(const FlashParams& p, const DeviceKernels& dk, bool can_split, LaunchPlan* plan);

// The call as a bounded plan runs it: the key-vector mask dropped, the key bound kept.
FlashParams unmasked_twin(const FlashParams& p);

// The grid of a forward launch of entry `e` for `p` on `sm_count` SMs: (ceil(Sq / block_m),
// B x Hq), or for a persistent entry one row of min(persistent x SMs, its tiles) CTAs (the kernel
// reads B x Hq from its Q descriptor's dims). `tiles`: ceil(Sq / block_m) x B x Hq.
struct FwdGrid {
  int64_t x, y, tiles;
};
FwdGrid fwd_grid(const KernelEntry& e, const FlashParams& p, int sm_count);

}  // namespace ort_flash
