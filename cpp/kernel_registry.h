// Loads the AOT cubins into CUDA contexts and finds the function for a variant.
//
// Modules are loaded once per CUDA context, under a lock, when a CUDA kernel of the op is
// created (session creation): never inside a run that a CUDA graph might be capturing. Loaded
// modules live as long as the process (unloading at exit races the driver's own teardown).
#pragma once

#include <vector>

#include "cuda_driver.h"
#include "kernel_table.h"

namespace ort_flash {

struct LoadedKernel {
  const KernelEntry* entry;
  CUfunction function;
};

struct DeviceKernels {
  CUcontext context;
  int device;
  int arch;        // the device's SM version, e.g. 90
  int table_arch;  // the compiled arch chosen for it
  int sm_count;
  // The driver can encode TMA tensor maps (cuTensorMapEncodeTiled): the kFwdTma and kFwdGluon
  // kernels are usable.
  bool tensor_maps = false;
  // The driver has cuLaunchKernelEx: kernels built for programmatic dependent launch can use it.
  bool launch_ex = false;
  std::vector<LoadedKernel> kernels;
  // Arrival counters for the split-KV kernel's fused merge (aot/flash_decode.py):
  // kDecodeCounterSlots sets of kDecodeCountersPerSlot int32, handed out one set per CUDA stream
  // by cpp/cuda_launch.cc, each followed by the tile counter pair (two int64) of the persistent
  // kernels that hand out tiles dynamically (KernelEntry::dynamic). 0 if the allocation failed:
  // the merge then runs as its own kernel, those kernels take their tiles round robin.
  CUdeviceptr decode_counters = 0;
};

// Sets of counters (a stream's set: kCounterSlotBytes, the decode counters, then the tile counter
// pair at kTileCounterOffset; contract.gen.h, from aot/contract.py).
constexpr int kDecodeCounterSlots = 64;

// Loads every kernel compiled for `device`'s arch into its primary context (the one ONNX
// Runtime's CUDA EP uses). Safe to call from many threads; loads happen once.
Status prepare_device(int device, const DeviceKernels** out);

// The kernels loaded in the context `stream` belongs to. Loads them now if that context has
// none yet, unless the stream is capturing a graph (then an error says to create the session
// first).
Status kernels_for_stream(CUstream stream, const DeviceKernels** out);

// The compiled arch that serves an SM version: the highest one of the same major version not
// above it (a cubin runs on later minors of its major only). 0 if none.
int pick_table_arch(int arch);

}  // namespace ort_flash
