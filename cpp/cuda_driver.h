// The CUDA driver API, loaded at run time from libcuda.so.1 (no CUDA toolkit at build time).
// Only the handful of entry points ort_flash uses, with the driver's own types and enums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "status.h"

namespace ort_flash {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
constexpr int CU_STREAM_CAPTURE_STATUS_NONE = 0;
constexpr int CU_MEMORYTYPE_DEVICE = 2;

struct CUDA_MEMCPY2D {
  size_t srcXInBytes, srcY;
  int srcMemoryType;
  const void* srcHost;
  CUdeviceptr srcDevice;
  void* srcArray;
  size_t srcPitch;
  size_t dstXInBytes, dstY;
  int dstMemoryType;
  void* dstHost;
  CUdeviceptr dstDevice;
  void* dstArray;
  size_t dstPitch;
  size_t WidthInBytes, Height;
};

// A TMA tensor map (CUDA 12+): 128 opaque bytes, 64-byte aligned; passed to kernels by value.
struct alignas(64) CUtensorMap {
  uint64_t opaque[16];
};
constexpr int CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6;
constexpr int CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9;
constexpr int CU_TENSOR_MAP_INTERLEAVE_NONE = 0;
constexpr int CU_TENSOR_MAP_L2_PROMOTION_L2_128B = 2;
constexpr int CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0;  // out-of-bounds elements read as zero

// cuLaunchKernelEx's configuration (CUDA 12+), as the driver lays it out: an attribute is an id,
// padding to 8 bytes and a 64-byte value union (only the int member is used here).
constexpr int CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;
struct CUlaunchAttribute {
  int id;
  char pad[8 - sizeof(int)];
  union {
    char bytes[64];
    int value;  // programmaticStreamSerializationAllowed
  } value;
};
struct CUlaunchConfig {
  unsigned int gridDimX, gridDimY, gridDimZ;
  unsigned int blockDimX, blockDimY, blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned int numAttrs;
};
static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute layout");

struct CudaDriver {
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*);
  CUresult (*cuStreamIsCapturing)(CUstream, int*);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void**, void**);
  CUresult (*cuMemcpy2DAsync)(const CUDA_MEMCPY2D*, CUstream);
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*cuMemAllocAsync)(CUdeviceptr*, size_t, CUstream);  // stream-ordered (CUDA 11.2+)
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
  // Optional (null on drivers before CUDA 12): then the TMA kernels are not used.
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap*, int data_type, uint32_t rank, void* address,
                                     const uint64_t* dims, const uint64_t* strides_bytes,
                                     const uint32_t* box, const uint32_t* element_strides,
                                     int interleave, int swizzle, int l2_promotion, int oob_fill);
  // Optional (null before CUDA 12): then kernels that could use programmatic dependent launch
  // are launched plainly (their griddepcontrol.wait returns at once).
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**);
};

// Loads libcuda.so.1 and cuInit(0)s once (thread-safe). Fails with a clear message when no
// driver is present; never aborts.
Status cuda_driver(const CudaDriver** out);

// "cuModuleLoadData failed: CUDA_ERROR_NO_BINARY_FOR_GPU (no kernel image is available...)".
Status cuda_check(CUresult r, const char* what);

}  // namespace ort_flash
