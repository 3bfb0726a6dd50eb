// Variant and tile choice: the one place where a call's runtime flags map to the compiled
// specializations (aot/variants.py's Variant and tile tables), over a device's loaded kernels.
// Pure: reads FlashParams, the table and the switches; no driver.
#pragma once

#include <string>

#include "flash_params.h"
#include "kernel_registry.h"
#include "kernel_table.h"
#include "launch_switches.h"
#include "status.h"

namespace ort_flash {

// Whether every Q, K, V and Y stride of `p` is a multiple of 16 elements (the exact-head-dim
// variants' and the FP8 kernels' alignment).
bool strides_aligned(const FlashParams& p);

// The forward variant `p` needs, or an error naming what no build can run.
Status select_variant(const FlashParams& p, VariantKey* key);

// The decode-kind key (kDecode: the split kernel; kCombine: its merge) of `p`; head_dim 0 when
// no decode bucket holds its head dims.
VariantKey decode_key(const FlashParams& p, KernelKind kind);

// The kernel of exactly `key` (any tile), or null.
const LoadedKernel* find_kernel(const DeviceKernels& dk, const VariantKey& key);

// Among the entries of `key` whose tile is for this call (its causal flag, or any), the one with
// the largest tile_min_len up to `measure` (and below its tile_max_len, where set): for the TMA
// and Gluon kinds min(Sq, Skv) (aot/variants.py TMA_TILES, GLUON_LENGTHS); for the decode kind
// the grid's waves of one CTA per SM (DECODE_WIDE_WAVES). `any_length` ignores the ranges.
const LoadedKernel* pick_tile(const DeviceKernels& dk, const VariantKey& key, bool causal, int64_t measure,
                              bool any_length = false);

// The kernel for `key`, or where the build compiles its shape class only as a superset
// (aot/variants.py superset_only), the variant that computes the same result from more general
// code: with extras (neutral windows, softcap 0 and no key lengths leave every score as it is),
// with a masked head dim. Exact first. Updates *key to the one found, so that a tile search looks
// in the same variant; for the decode kind returns its base tile, which plans the splits.
const LoadedKernel* find_superset(const DeviceKernels& dk, VariantKey* key, bool causal = false);

// A forward kernel for `key`; a key-vector mask falls back to the full-mask variant (same result:
// it reads the mask through its strides) where this build has no key-vector one.
const LoadedKernel* find_fwd_kernel(const DeviceKernels& dk, VariantKey key);

// The TMA twin of forward variant `key` for `p`, where the build has one and TMA is on. Unmasked
// and key-vector-masked calls only: full masks stay on the pointer kernels, whose TMA twins spill (perf-notes v3).
const LoadedKernel* tma_kernel(const FlashParams& p, const DeviceKernels& dk, VariantKey key,
                               const LaunchSwitches& sw);

// The Gluon kernel for a call it can take (aot/variants.py GLUON_*: fp16/bf16, D == Dv == 64 or
// 128 with aligned strides, no extras, no mask or a key-vector one where built) from the
// min(Sq, Skv) range of its entry (any with ORT_FLASH_GLUON=1), unless Gluon or TMA is off.
const LoadedKernel* gluon_kernel(const FlashParams& p, const DeviceKernels& dk, VariantKey key,
                                 const LaunchSwitches& sw);

// `key` in words, for error messages.
std::string describe(const VariantKey& key);

}  // namespace ort_flash
