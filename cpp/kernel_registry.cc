#include "kernel_registry.h"

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

namespace ort_flash {
namespace {

std::mutex g_mutex;
// Keyed by context; DeviceKernels are never freed (see header).
std::map<CUcontext, std::unique_ptr<DeviceKernels>>& by_context() {
  static auto* m = new std::map<CUcontext, std::unique_ptr<DeviceKernels>>();
  return *m;
}

std::string compiled_archs() {
  size_t n = 0;
  const KernelEntry* t = kernel_table(&n);
  std::set<int> archs;
  for (size_t i = 0; i < n; ++i) archs.insert(t[i].arch);
  std::string s;
  for (int a : archs) s += (s.empty() ? "sm_" : ", sm_") + std::to_string(a);
  return s.empty() ? "none" : s;
}

// Loads into `ctx` (made current by the caller) every kernel for the device. Caller holds g_mutex.
Status load_into_context(const CudaDriver* d, CUcontext ctx, CUdevice dev, int device,
                         const DeviceKernels** out) {
  auto it = by_context().find(ctx);
  if (it != by_context().end()) {
    *out = it->second.get();
    return Status::Ok();
  }
  int major = 0, minor = 0, sms = 0, smem_optin = 0;
  ORT_FLASH_RETURN_IF_ERROR(cuda_check(
      d->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
      "cuDeviceGetAttribute"));
  ORT_FLASH_RETURN_IF_ERROR(cuda_check(
      d->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
      "cuDeviceGetAttribute"));
  ORT_FLASH_RETURN_IF_ERROR(cuda_check(
      d->cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
      "cuDeviceGetAttribute"));
  ORT_FLASH_RETURN_IF_ERROR(cuda_check(
      d->cuDeviceGetAttribute(&smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
      "cuDeviceGetAttribute"));
  const int arch = major * 10 + minor;
  const int table_arch = pick_table_arch(arch);
  if (table_arch == 0) {
    return Status::Error("this GPU (device " + std::to_string(device) + ", sm_" +
                         std::to_string(arch) + ") has no FlashAttention kernels in this build "
                         "(compiled for " + compiled_archs() + "); rebuild ort_flash with "
                         "ORT_FLASH_CUDA_ARCHS including " + std::to_string(arch));
  }
  auto dk = std::make_unique<DeviceKernels>();
  dk->context = ctx;
  dk->device = device;
  dk->arch = arch;
  dk->table_arch = table_arch;
  dk->sm_count = sms;
  dk->tensor_maps = d->cuTensorMapEncodeTiled != nullptr;
  dk->launch_ex = d->cuLaunchKernelEx != nullptr;
  size_t n = 0;
  const KernelEntry* table = kernel_table(&n);
  for (size_t i = 0; i < n; ++i) {
    const KernelEntry& e = table[i];
    if (e.arch != table_arch) continue;
    const std::string what = std::string("loading kernel ") + e.variant_name + " for sm_" +
                             std::to_string(arch);
    if (e.shared > smem_optin) {
      return Status::Error(what + ": needs " + std::to_string(e.shared) +
                           " bytes of shared memory, the device allows " + std::to_string(smem_optin));
    }
    CUmodule module = nullptr;
    ORT_FLASH_RETURN_IF_ERROR(cuda_check(d->cuModuleLoadData(&module, e.cubin), (what + ": cuModuleLoadData").c_str()));
    CUfunction fn = nullptr;
    ORT_FLASH_RETURN_IF_ERROR(cuda_check(d->cuModuleGetFunction(&fn, module, e.kernel_name),
                                         (what + ": cuModuleGetFunction").c_str()));
    if (e.shared > 48 * 1024) {
      ORT_FLASH_RETURN_IF_ERROR(cuda_check(
          d->cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, e.shared),
          (what + ": cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)").c_str()));
    }
    dk->kernels.push_back({&e, fn});
  }
  // Never freed, like the modules (1 MiB). A failure here only costs the fused merge.
  if (d->cuMemAlloc(&dk->decode_counters, kCounterSlotBytes * kDecodeCounterSlots) != CUDA_SUCCESS) {
    dk->decode_counters = 0;
  }
  *out = dk.get();
  by_context()[ctx] = std::move(dk);
  return Status::Ok();
}

}  // namespace

int pick_table_arch(int arch) {
  size_t n = 0;
  const KernelEntry* t = kernel_table(&n);
  int best = 0;
  for (size_t i = 0; i < n; ++i) {
    const int a = t[i].arch;
    if (a / 10 == arch / 10 && a <= arch && a > best) best = a;
  }
  return best;
}

Status prepare_device(int device, const DeviceKernels** out) {
  const CudaDriver* d = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(cuda_driver(&d));
  std::lock_guard<std::mutex> lock(g_mutex);
  CUdevice dev = 0;
  ORT_FLASH_RETURN_IF_ERROR(cuda_check(d->cuDeviceGet(&dev, device),
                                       ("cuDeviceGet(" + std::to_string(device) + ")").c_str()));
  CUcontext ctx = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(cuda_check(d->cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain"));
  ORT_FLASH_RETURN_IF_ERROR(cuda_check(d->cuCtxPushCurrent(ctx), "cuCtxPushCurrent"));
  Status s = load_into_context(d, ctx, dev, device, out);
  CUcontext popped = nullptr;
  d->cuCtxPopCurrent(&popped);
  return s;
}

Status kernels_for_stream(CUstream stream, const DeviceKernels** out) {
  const CudaDriver* d = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(cuda_driver(&d));
  CUcontext ctx = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(cuda_check(d->cuStreamGetCtx(stream, &ctx), "cuStreamGetCtx"));
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = by_context().find(ctx);
  if (it != by_context().end()) {
    *out = it->second.get();
    return Status::Ok();
  }
  int capturing = CU_STREAM_CAPTURE_STATUS_NONE;
  ORT_FLASH_RETURN_IF_ERROR(cuda_check(d->cuStreamIsCapturing(stream, &capturing), "cuStreamIsCapturing"));
  if (capturing != CU_STREAM_CAPTURE_STATUS_NONE) {
    return Status::Error("the FlashAttention kernels are not loaded in this stream's CUDA context "
                         "and cannot be loaded during CUDA graph capture; run the session once "
                         "before capturing");
  }
  ORT_FLASH_RETURN_IF_ERROR(cuda_check(d->cuCtxPushCurrent(ctx), "cuCtxPushCurrent"));
  CUdevice dev = 0;
  Status s = cuda_check(d->cuCtxGetDevice(&dev), "cuCtxGetDevice");
  if (s.ok()) s = load_into_context(d, ctx, dev, static_cast<int>(dev), out);
  CUcontext popped = nullptr;
  d->cuCtxPopCurrent(&popped);
  return s;
}

}  // namespace ort_flash
