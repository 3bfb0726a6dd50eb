#include "decode_heuristics.h"

#include <algorithm>

namespace ort_flash {
namespace {

size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

// Decode streams K/V, and one SM's read rate, not its resident CTAs, bounds it: a second CTA on an
// SM that already has one adds little (lab/experiments/tune_decode.py, perf-notes). So time goes by
// waves of one CTA per SM, each as long as the key tiles a CTA reads plus its fill and epilogue;
// take the fewest splits that minimize it (a split past cdiv(key_blocks, tiles) would get no keys).
int64_t splits_by_cost(int64_t ctas, int64_t key_blocks, int64_t skv, int64_t sms) {
  const int64_t most = std::max<int64_t>(1, std::min({kMaxSplits, key_blocks, skv / kMinSplitKeys}));
  int64_t best = 1, best_cost = -1;
  for (int64_t s = 1; s <= most; ++s) {
    const int64_t tiles = ceil_div(key_blocks, s);
    const int64_t cost = ceil_div(ctas * ceil_div(key_blocks, tiles), sms) * (tiles + kCtaOverheadTiles);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best = s;
    }
  }
  return best;
}

}  // namespace

bool decode_shape(int64_t sq, int64_t rows, int64_t bh_kv) {
  return sq <= kMaxDecodeSq && rows <= kMaxDecodeRows && bh_kv <= 65535;
}

int64_t decode_splits(int64_t requested, int64_t ctas, int64_t key_blocks, int64_t skv, int64_t sms) {
  const int64_t splits = requested < 0 ? splits_by_cost(ctas, key_blocks, skv, sms) : requested;
  return std::max<int64_t>(1, std::min({splits, kMaxSplits, key_blocks}));
}

int64_t decode_waves(int64_t ctas, int64_t key_blocks, int64_t splits, int64_t sms) {
  const int64_t tiles = ceil_div(key_blocks, splits);
  return ceil_div(ctas * ceil_div(key_blocks, tiles), sms);
}

int64_t merge_round_trips(int64_t rows, int64_t splits) {
  return std::min(ceil_div(rows, kMergeWideRows) * ceil_div(splits, kMergeWideSplits),
                  ceil_div(rows, kMergeTallRows) * ceil_div(splits, kMergeTallSplits));
}

bool fuse_combine(int64_t splits, int64_t rows, int mode) {
  return splits > 1 && (mode == 1 || (mode < 0 && splits <= kMaxFusedSplits &&
                                      merge_round_trips(rows, splits) <= kMaxFusedRoundTrips));
}

DecodeWorkspace decode_workspace(int64_t parts, int64_t dv) {
  const size_t n = static_cast<size_t>(parts);
  const size_t lse_offset = align_up(n * static_cast<size_t>(dv) * 4);
  return {lse_offset, lse_offset + align_up(n * 4)};
}

}  // namespace ort_flash
