#include "cuda_driver.h"

#include <dlfcn.h>

#include <mutex>

namespace ort_flash {
namespace {

CudaDriver g_driver;
Status g_status = Status::Error("CUDA driver not loaded");
std::once_flag g_once;

Status load() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    return Status::Error(std::string("cannot load the CUDA driver (libcuda.so.1): ") +
                         (err ? err : "unknown error") +
                         "; the CUDA execution provider needs an NVIDIA driver");
  }
  CudaDriver& d = g_driver;
  struct Entry { const char* name; void** slot; };
  const Entry entries[] = {
      {"cuInit", reinterpret_cast<void**>(&d.cuInit)},
      {"cuDriverGetVersion", reinterpret_cast<void**>(&d.cuDriverGetVersion)},
      {"cuGetErrorName", reinterpret_cast<void**>(&d.cuGetErrorName)},
      {"cuGetErrorString", reinterpret_cast<void**>(&d.cuGetErrorString)},
      {"cuDeviceGet", reinterpret_cast<void**>(&d.cuDeviceGet)},
      {"cuDeviceGetAttribute", reinterpret_cast<void**>(&d.cuDeviceGetAttribute)},
      {"cuDevicePrimaryCtxRetain", reinterpret_cast<void**>(&d.cuDevicePrimaryCtxRetain)},
      {"cuCtxPushCurrent_v2", reinterpret_cast<void**>(&d.cuCtxPushCurrent)},
      {"cuCtxPopCurrent_v2", reinterpret_cast<void**>(&d.cuCtxPopCurrent)},
      {"cuCtxGetDevice", reinterpret_cast<void**>(&d.cuCtxGetDevice)},
      {"cuStreamGetCtx", reinterpret_cast<void**>(&d.cuStreamGetCtx)},
      {"cuStreamIsCapturing", reinterpret_cast<void**>(&d.cuStreamIsCapturing)},
      {"cuModuleLoadData", reinterpret_cast<void**>(&d.cuModuleLoadData)},
      {"cuModuleGetFunction", reinterpret_cast<void**>(&d.cuModuleGetFunction)},
      {"cuFuncSetAttribute", reinterpret_cast<void**>(&d.cuFuncSetAttribute)},
      {"cuLaunchKernel", reinterpret_cast<void**>(&d.cuLaunchKernel)},
      {"cuMemcpy2DAsync_v2", reinterpret_cast<void**>(&d.cuMemcpy2DAsync)},
      {"cuMemsetD8Async", reinterpret_cast<void**>(&d.cuMemsetD8Async)},
      {"cuMemAllocAsync", reinterpret_cast<void**>(&d.cuMemAllocAsync)},
      {"cuMemAlloc_v2", reinterpret_cast<void**>(&d.cuMemAlloc)},
      {"cuMemFreeAsync", reinterpret_cast<void**>(&d.cuMemFreeAsync)},
  };
  for (const Entry& e : entries) {
    *e.slot = dlsym(lib, e.name);
    if (!*e.slot) {
      return Status::Error(std::string("the CUDA driver lacks ") + e.name +
                           "; update the NVIDIA driver");
    }
  }
  d.cuTensorMapEncodeTiled = reinterpret_cast<decltype(d.cuTensorMapEncodeTiled)>(
      dlsym(lib, "cuTensorMapEncodeTiled"));
  d.cuLaunchKernelEx = reinterpret_cast<decltype(d.cuLaunchKernelEx)>(dlsym(lib, "cuLaunchKernelEx"));
  return cuda_check(d.cuInit(0), "cuInit");
}

}  // namespace

Status cuda_driver(const CudaDriver** out) {
  std::call_once(g_once, [] { g_status = load(); });
  *out = g_status.ok() ? &g_driver : nullptr;
  return g_status;
}

Status cuda_check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return Status::Ok();
  const char* name = nullptr;
  const char* text = nullptr;
  if (g_driver.cuGetErrorName) g_driver.cuGetErrorName(r, &name);
  if (g_driver.cuGetErrorString) g_driver.cuGetErrorString(r, &text);
  return Status::Error(std::string(what) + " failed: " + (name ? name : "CUDA error") + " (" +
                       (text ? text : std::to_string(r)) + ")");
}

}  // namespace ort_flash
