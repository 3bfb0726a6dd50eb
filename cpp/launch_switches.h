// The environment switches of the CUDA launcher, read once per process into one struct. They
// exist for A/B comparisons, for tests of each path, and as fallbacks should a path misbehave.
#pragma once

#include <cstdint>

namespace ort_flash {

struct LaunchSwitches {
  // ORT_FLASH_DECODE_SPLITS: -1 (unset, empty or not a count) = the cost model
  // (decode_heuristics.h), 0 = always the forward kernel, N = N splits.
  int64_t decode_splits = -1;
  // ORT_FLASH_FUSED_COMBINE: -1 (unset) = the split kernel merges within the heuristic's limits,
  // 0 = never (always the combine kernel), 1 = always (where the stream has counters).
  int fused_combine = -1;
  // ORT_FLASH_PDL: false ("0") = never launch with programmatic stream serialization; otherwise the
  // kernels built for it (KernelEntry::pdl) do (perf-notes "decode v7").
  bool pdl = true;
  // ORT_FLASH_TMA: false ("0") = the pointer kernels on sm_90, neither the TMA nor the Gluon kind
  // (both read TMA descriptors).
  bool tma = true;
  // ORT_FLASH_GLUON: -1 (unset) = the Gluon kernel on the calls its table ranges cover
  // (aot/variants.py GLUON_LENGTHS), 0 = never, 1 = on every call it can take, whatever the length.
  int gluon = -1;
  // ORT_FLASH_KEY_BOUND: false ("0") = a call with a key bound per batch row (FlashParams::key_bound)
  // reads the key mask given with it; otherwise it runs the unmasked Gluon kernel bounding each row,
  // where one takes it (perf-notes "A key bound per row for batched first prompts").
  bool key_bound = true;
  // ORT_FLASH_ROTARY_ON_LOAD: true (unset, "1") = the Gluon kernels turn a GroupQueryAttention first
  // prompt's Q by its rotary as they load it where they take the call (FlashParams::rotary_half),
  // and the prepare kernel writes K and V only; false ("0") = the prepare kernel writes a rotated
  // copy of Q (perf-notes "Q's rotary on load timed").
  bool rotary_on_load = true;
  // ORT_FLASH_WINDOW_SHIFT: true (unset, "1") = a decode step past a window-sized cache's capacity
  // runs over present (the kept rows moved down in place by the shift kernels, no stage); false
  // ("0") = over a stage, then the compaction.
  bool window_shift = true;
};

// The switches of this process, read from the environment at the first call.
const LaunchSwitches& launch_switches();

}  // namespace ort_flash
