// TMA tensor descriptors of Q, K, V, Y for the kFwdTma and kFwdGluon kernels: whether a call's
// views can be described (pure, for the planner), and their encoding (through the driver).
#pragma once

#include <cstdint>
#include <vector>

#include "cuda_driver.h"
#include "flash_params.h"
#include "kernel_table.h"

namespace ort_flash {

// One descriptor argument as those kernels take it: the map, then the logical (B, H, S, D) dims
// and element strides.
struct TmaArg {
  CUtensorMap map;
  int32_t dims[kTmaRank];
  int64_t strides[kTmaRank];
  void push(std::vector<void*>& args) {
    args.push_back(&map);
    for (int32_t& d : dims) args.push_back(&d);
    for (int64_t& s : strides) args.push_back(&s);
  }
};

static_assert(sizeof(CUtensorMap) == kTmaMapBytes, "a descriptor argument's map, by value (aot/contract.py)");

// Whether the copy engine can address every Q/K/V/Y view of `p`: 16-byte aligned bases, strides
// positive multiples of 16 bytes below 2^40, no empty dim.
bool tma_views_ok(const FlashParams& p);

// The four descriptors of `p` (views tma_views_ok accepted) for the boxes of kernel entry `e`;
// false if the driver refuses any (the caller then runs the pointer kernel).
bool encode_tma_args(const CudaDriver& drv, const FlashParams& p, const KernelEntry& e, TmaArg out[kTmaDescriptors]);

}  // namespace ort_flash
