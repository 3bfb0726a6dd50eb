// The split-KV decode cost model: when the decode kernel takes a call, into how many KV splits it
// cuts the keys, and which kernel merges them. Pure functions of plain numbers (no driver, no
// table), so they read and test easily (lab/experiments/tune_decode.py choose_splits; the merge's
// tiles: aot/flash_decode.py merge_round_trips, which tests/test_aot_table.py holds fuse_combine to).
#pragma once

#include <cstddef>
#include <cstdint>

#include "contract.gen.h"  // kMaxDecodeSq, kMaxDecodeRows, kMerge*: the decode kernel's (aot/contract.py)

namespace ort_flash {

constexpr int64_t kMaxSplits = 128;
constexpr int64_t kMinSplitKeys = 128;    // a split shorter than this costs more than it gains
constexpr int64_t kCtaOverheadTiles = 4;  // a CTA's pipeline fill and epilogue, in key tiles
// The split kernel merges its own partials up to this many splits and this many dependent L2
// round trips of its merge tile; past them the combine kernel does (perf-notes decode v5).
constexpr int64_t kMaxFusedSplits = 32;
constexpr int64_t kMaxFusedRoundTrips = 2;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The decode CTAs one SM runs side by side at full effect, which the split count's waves count:
// at head dim 64 one CTA's loads leave the SM's read rate part used and a second co-resident CTA
// reads more; from head dim 128 it adds little (perf-notes "GenAI fidelity and d64 decode").
inline int64_t decode_ctas_per_sm(int64_t head_dim) { return head_dim <= 64 ? 2 : 1; }

// Whether a call of `sq` query rows, `rows` = GQA group x sq packed rows and `bh_kv` = B x Hkv
// grid rows is a decode shape at all.
bool decode_shape(int64_t sq, int64_t rows, int64_t bh_kv);

// The split count: `requested` splits (ORT_FLASH_DECODE_SPLITS; 1 without a workspace), or for
// -1 the cost model's, for a grid of `ctas` CTAs per split over `key_blocks` key tiles of a call
// of `skv` keys on `sms` SMs. Clamped to [1, min(kMaxSplits, key_blocks)].
int64_t decode_splits(int64_t requested, int64_t ctas, int64_t key_blocks, int64_t skv, int64_t sms);

// The waves of one CTA per SM the split grid takes (picks the decode tile for wide grids).
int64_t decode_waves(int64_t ctas, int64_t key_blocks, int64_t splits, int64_t sms);

// The fused merge's dependent round trips for a block of `rows` packed rows: the kernel takes the
// tile (kMergeWide*, kMergeTall*) with fewer.
int64_t merge_round_trips(int64_t rows, int64_t splits);

// Whether the split kernel merges `splits` partials of a row block of `rows` packed rows itself
// (`mode`: LaunchSwitches::fused_combine; -1 = by the limits above).
bool fuse_combine(int64_t splits, int64_t rows, int mode);

// Scratch for the partials of `parts` = B x Hq x Sq x splits rows: the outputs (fp32, `dv` wide),
// then the log-sum-exps (fp32) at `lse_offset`; each part 256-byte aligned.
struct DecodeWorkspace {
  size_t lse_offset;
  size_t bytes;
};
DecodeWorkspace decode_workspace(int64_t parts, int64_t dv);

}  // namespace ort_flash
