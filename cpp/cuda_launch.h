// Runs FlashParams on the GPU: picks the compiled variant (the one place where runtime flags map
// to compile-time specializations) and launches it on the caller's stream.
#pragma once

#include <functional>

#include "cuda_driver.h"
#include "flash_params.h"
#include "kernel_registry.h"
#include "kernel_table.h"

namespace ort_flash {

// Device memory for the split-KV partials: returns `bytes` on the stream's device, owned by the
// caller and valid until the work queued on the stream has run (stream-ordered reuse is fine).
using WorkspaceFn = std::function<Status(size_t bytes, void** ptr)>;

// How a call runs: the forward kernel (kFwdTma: its TMA-descriptor twin; kFwdGluon: the Gluon
// kernel, same arguments), or the decode kernel
// with `num_splits` KV splits (more than one needs `workspace_bytes` of scratch for the partials;
// up to 32 splits, where the merge tile takes at most two dependent L2 round trips, the split
// kernel merges them itself if the stream has arrival counters, see stream_counters in
// cuda_launch.cc; else the combine kernel does).
struct LaunchPlan {
  KernelKind kind = KernelKind::kFwd;
  int num_splits = 1;
  size_t workspace_bytes = 0;
  // With more than one split: merge in the split kernel (where the stream then has counters), not
  // in the combine kernel.
  bool fused_merge = false;
  const KernelEntry* kernel = nullptr;  // the (first) kernel it launches; null if none is compiled
  const LoadedKernel* loaded = nullptr;  // its function (kFwdTma: the TMA twin; kFwdGluon: Gluon's)
  // kFwdTma, kFwdGluon: the pointer kernel, run where the tensor maps cannot be encoded; kDecode:
  // the combine kernel.
  const LoadedKernel* second = nullptr;
  // kDecode: launch the split kernel with programmatic stream serialization (its cubin waits for
  // the grid before it; KernelEntry::pdl, ORT_FLASH_PDL, a driver with cuLaunchKernelEx).
  bool pdl = false;
};

// The dispatcher: the decode kernel when few query rows per KV head (Sq <= 16, GQA group x Sq
// <= 64) meet a compiled decode variant; split so that waves of one CTA per SM times the key tiles
// per CTA are fewest, each split at least 128 keys; a grid of more CTAs than SMs takes the decode
// tile for it where the build has one (aot/variants.py DECODE_WIDE_WAVES). `can_split` false (no
// workspace) keeps one split. ORT_FLASH_DECODE_SPLITS overrides: 0 = always the forward kernel, N = N splits;
// ORT_FLASH_FUSED_COMBINE=0 always merges in the combine kernel, =1 always in the split kernel.
// Otherwise the forward kernel (its key-vector-mask variant when the mask's query stride is 0),
// as kFwdTma when the call has no mask or a key-vector one, the build has the TMA twin of the
// variant (sm_90, fp16/bf16, exact head dim 64/128), the driver can encode tensor maps, every
// Q/K/V/Y view is 16-byte aligned with positive strides, and ORT_FLASH_TMA is not "0". Before
// that, as kFwdGluon where the build has the Gluon kernel for the call (sm_90, fp16/bf16, exact
// head dim 64/128, no mask, no extras, min(Sq, Skv) in its entry's [tile_min_len, tile_max_len):
// aot/variants.py GLUON_*; ORT_FLASH_GLUON=1: whatever the length), the same views can be described, and neither
// ORT_FLASH_GLUON nor ORT_FLASH_TMA is "0".
Status plan_flash_cuda(const FlashParams& p, const DeviceKernels& dk, bool can_split, LaunchPlan* plan);

// The grid of a forward launch of entry `e` for `p` on a GPU with `sm_count` SMs: (ceil(Sq /
// block_m), B * Hq), or for a persistent entry (KernelEntry::persistent) one row of min(persistent x
// SMs, ceil(Sq / block_m) x B * Hq) CTAs, whose kernel reads B * Hq from its window_right argument:
// *window_right is set to it then, left as it is otherwise. `tiles`: the call's query tiles,
// ceil(Sq / block_m) x B * Hq.
struct FwdGrid {
  int64_t x, y, tiles;
};
FwdGrid fwd_grid(const KernelEntry& e, const FlashParams& p, int sm_count, int32_t* window_right);

// The variant `p` needs, or an error naming what this build cannot run.
Status select_variant(const FlashParams& p, VariantKey* key);

// Launches the kernels for `p` on `stream` (asynchronous). Sq == 0 or B*Hq == 0 launch
// nothing. Without `workspace` the decode path runs unsplit.
Status launch_flash_cuda(const FlashParams& p, CUstream stream, const WorkspaceFn& workspace = nullptr);

// The same with the kernels of `dk` (launch_flash_cuda: those loaded in the stream's
// context). ort_flash._C's launch_with_table passes a table of its own (tests).
Status launch_flash_cuda_with(const FlashParams& p, const DeviceKernels& dk, CUstream stream,
                              const WorkspaceFn& workspace = nullptr);

}  // namespace ort_flash
