/* A stand-in for the CUDA driver (libcuda.so.1) for the launch tests on machines with no GPU
 * (tests/test_launch_abi.py, built and put on LD_LIBRARY_PATH by tests/_fake_cuda.py).
 *
 * It runs no kernel. It does what the real driver does with what ort_flash hands it, and writes
 * each call as one JSON line to $FAKE_CUDA_LOG:
 *   - cuModuleLoadData reads the image as an ELF cubin (magic, machine EM_CUDA, the SM version
 *     in e_flags) and refuses a cubin for another major version or a later minor;
 *   - cuModuleGetFunction finds the kernel's .nv.info.<name> section (CUDA_ERROR_NOT_FOUND
 *     without one) and reads its parameter table (EIATTR_KPARAM_INFO: ordinal, offset and size
 *     of each parameter) and its required block (EIATTR_REQNTID);
 *   - cuLaunchKernel / cuLaunchKernelEx copy each parameter into a parameter buffer at its
 *     offset, taking exactly the cubin's size from kernelParams[ordinal], as the driver does,
 *     and log the buffer; they refuse a block other than the required one, a grid over the
 *     driver's limits and more dynamic shared memory than 48 KiB or the function's
 *     MAX_DYNAMIC_SHARED_SIZE_BYTES attribute allow;
 *   - cuTensorMapEncodeTiled refuses what the driver's rules for a tiled map refuse (alignment,
 *     strides, box and swizzle span), logs its arguments and writes a map that names that log
 *     entry (opaque[0] = FAKE_MAP_MAGIC, opaque[1] = the entry's index);
 *   - allocations return distinct fake addresses; memsets and frees are logged.
 * The device: $FAKE_CUDA_ARCH (default 90), $FAKE_CUDA_SMS (132), $FAKE_CUDA_SMEM (232448, the
 * opt-in shared memory per block). $FAKE_CUDA_CAPTURING: a comma-separated list of stream
 * handles (decimal) that report capturing. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum {
  OK = 0,
  ERR_INVALID_VALUE = 1,
  ERR_NOT_INITIALIZED = 3,
  ERR_INVALID_IMAGE = 200,
  ERR_NO_BINARY_FOR_GPU = 209,
  ERR_INVALID_HANDLE = 400,
  ERR_NOT_FOUND = 500,
};

#define FAKE_MAP_MAGIC 0x70616d656b6166ULL /* "fakemap" */
#define MAX_MODULES 4096
#define MAX_PARAMS 256
#define MAX_LOG_LINE (1 << 16)

static FILE* g_log;
static int g_init;
static int g_arch = 90, g_sms = 132, g_smem = 232448;
static char g_capturing[4096];
static unsigned long long g_next_ptr = 0x7f0000000000ULL;
static int g_encodes;

struct Module {
  const unsigned char* image;
  size_t size;
  int arch;
};
struct Function {
  int module;
  char name[256];
  int nparams;
  int offset[MAX_PARAMS], size[MAX_PARAMS];
  int param_bytes;
  int reqntid[3];
  int max_dynamic_shared;
};
static struct Module g_modules[MAX_MODULES];
static int g_nmodules;
static struct Function g_functions[MAX_MODULES];
static int g_nfunctions;

static void logf_(const char* fmt, ...) {
  if (!g_log) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(g_log, fmt, ap);
  va_end(ap);
  fputc('\n', g_log);
  fflush(g_log);
}

static CUresult fail(const char* call, CUresult r, const char* why) {
  logf_("{\"ev\": \"error\", \"call\": \"%s\", \"code\": %d, \"why\": \"%s\"}", call, r, why);
  return r;
}

CUresult cuInit(unsigned int flags) {
  (void)flags;
  const char* s;
  if ((s = getenv("FAKE_CUDA_ARCH"))) g_arch = atoi(s);
  if ((s = getenv("FAKE_CUDA_SMS"))) g_sms = atoi(s);
  if ((s = getenv("FAKE_CUDA_SMEM"))) g_smem = atoi(s);
  if ((s = getenv("FAKE_CUDA_CAPTURING"))) snprintf(g_capturing, sizeof g_capturing, ",%s,", s);
  if (!g_log && (s = getenv("FAKE_CUDA_LOG"))) g_log = fopen(s, "a");
  g_init = 1;
  logf_("{\"ev\": \"init\", \"arch\": %d, \"sms\": %d, \"smem\": %d}", g_arch, g_sms, g_smem);
  return OK;
}

CUresult cuDriverGetVersion(int* v) { *v = 12080; return OK; }

CUresult cuGetErrorName(CUresult r, const char** s) {
  switch (r) {
    case ERR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
    case ERR_INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; return OK;
    case ERR_NO_BINARY_FOR_GPU: *s = "CUDA_ERROR_NO_BINARY_FOR_GPU"; return OK;
    case ERR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; return OK;
    default: *s = "CUDA_ERROR_UNKNOWN"; return OK;
  }
}

CUresult cuGetErrorString(CUresult r, const char** s) {
  (void)r;
  *s = "fake CUDA driver (tests/fake_cuda)";
  return OK;
}

CUresult cuDeviceGet(int* dev, int ordinal) {
  if (!g_init) return ERR_NOT_INITIALIZED;
  if (ordinal != 0) return fail("cuDeviceGet", ERR_INVALID_VALUE, "one device");
  *dev = 0;
  return OK;
}

CUresult cuDeviceGetCount(int* n) { *n = 1; return OK; }

CUresult cuDeviceGetName(char* name, int len, int dev) {
  (void)dev;
  snprintf(name, (size_t)len, "fake sm_%d", g_arch);
  return OK;
}

CUresult cuDeviceGetAttribute(int* v, int attr, int dev) {
  (void)dev;
  switch (attr) {
    case 16: *v = g_sms; return OK;         /* MULTIPROCESSOR_COUNT */
    case 75: *v = g_arch / 10; return OK;   /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *v = g_arch % 10; return OK;   /* COMPUTE_CAPABILITY_MINOR */
    case 97: *v = g_smem; return OK;        /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    default: return fail("cuDeviceGetAttribute", ERR_INVALID_VALUE, "attribute the fake lacks");
  }
}

/* One context (the primary one), one device. */
#define FAKE_CONTEXT ((void*)0x10)
CUresult cuDevicePrimaryCtxRetain(void** ctx, int dev) { (void)dev; *ctx = FAKE_CONTEXT; return OK; }
CUresult cuCtxPushCurrent_v2(void* ctx) { return ctx == FAKE_CONTEXT ? OK : ERR_INVALID_HANDLE; }
CUresult cuCtxPopCurrent_v2(void** ctx) { if (ctx) *ctx = FAKE_CONTEXT; return OK; }
CUresult cuCtxGetDevice(int* dev) { *dev = 0; return OK; }
CUresult cuStreamGetCtx(void* stream, void** ctx) { (void)stream; *ctx = FAKE_CONTEXT; return OK; }

CUresult cuStreamIsCapturing(void* stream, int* status) {
  char key[32];
  snprintf(key, sizeof key, ",%llu,", (unsigned long long)(uintptr_t)stream);
  *status = strstr(g_capturing, key) ? 1 : 0;
  return OK;
}

/* ELF64 little-endian readers over the image. */
static uint16_t u16(const unsigned char* p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t u32(const unsigned char* p) { return (uint32_t)u16(p) | (uint32_t)u16(p + 2) << 16; }
static uint64_t u64(const unsigned char* p) { return (uint64_t)u32(p) | (uint64_t)u32(p + 4) << 32; }

CUresult cuModuleLoadData(void** module, const void* image) {
  const unsigned char* e = (const unsigned char*)image;
  if (!e || memcmp(e, "\x7f" "ELF", 4) != 0 || e[4] != 2 || e[5] != 1) {
    return fail("cuModuleLoadData", ERR_INVALID_IMAGE, "not an ELF64 little-endian image");
  }
  if (u16(e + 0x12) != 190) return fail("cuModuleLoadData", ERR_INVALID_IMAGE, "not a CUDA ELF (EM_CUDA)");
  const int arch = (int)(u32(e + 0x30) & 0xff);
  if (arch / 10 != g_arch / 10 || arch > g_arch) {
    return fail("cuModuleLoadData", ERR_NO_BINARY_FOR_GPU, "a cubin for another SM version");
  }
  if (g_nmodules == MAX_MODULES) return fail("cuModuleLoadData", ERR_INVALID_VALUE, "too many modules");
  const uint64_t shoff = u64(e + 0x28);
  const size_t size = (size_t)(shoff + (uint64_t)u16(e + 0x3a) * u16(e + 0x3c));
  g_modules[g_nmodules] = (struct Module){e, size, arch};
  *module = (void*)(uintptr_t)(g_nmodules + 1);
  logf_("{\"ev\": \"load\", \"module\": %d, \"bytes\": %zu, \"arch\": %d}", g_nmodules + 1, size, arch);
  ++g_nmodules;
  return OK;
}

/* The section called `name`, or null. */
static const unsigned char* section(const struct Module* m, const char* name, size_t* size) {
  const unsigned char* e = m->image;
  const uint64_t shoff = u64(e + 0x28);
  const unsigned shentsize = u16(e + 0x3a), shnum = u16(e + 0x3c), shstrndx = u16(e + 0x3e);
  const unsigned char* strtab = e + u64(e + shoff + (uint64_t)shstrndx * shentsize + 0x18);
  for (unsigned i = 0; i < shnum; ++i) {
    const unsigned char* sh = e + shoff + (uint64_t)i * shentsize;
    if (strcmp((const char*)strtab + u32(sh), name) == 0) {
      *size = (size_t)u64(sh + 0x20);
      return e + u64(sh + 0x18);
    }
  }
  return NULL;
}

CUresult cuModuleGetFunction(void** fn, void* module, const char* name) {
  const int mi = (int)(uintptr_t)module - 1;
  if (mi < 0 || mi >= g_nmodules) return fail("cuModuleGetFunction", ERR_INVALID_HANDLE, "no such module");
  char sec[300];
  snprintf(sec, sizeof sec, ".nv.info.%s", name);
  size_t size = 0;
  const unsigned char* info = section(&g_modules[mi], sec, &size);
  if (!info) return fail("cuModuleGetFunction", ERR_NOT_FOUND, "no kernel of that name in the module");
  struct Function* f = &g_functions[g_nfunctions];
  memset(f, 0, sizeof *f);
  f->module = mi + 1;
  snprintf(f->name, sizeof f->name, "%s", name);
  f->nparams = 0;
  /* Records: format (1 byte), attribute (1 byte), then a 2-byte value, or for EIFMT_SVAL (4) a
   * 2-byte size and that many bytes. */
  for (size_t p = 0; p + 4 <= size;) {
    const int fmt = info[p], attr = info[p + 1];
    size_t len = 0;
    const unsigned char* val = info + p + 4;
    if (fmt == 4) len = u16(info + p + 2);
    if (fmt == 4 && attr == 0x17 && len >= 12) { /* EIATTR_KPARAM_INFO */
      const int ordinal = u16(val + 4), offset = u16(val + 6), psize = (int)((u32(val + 8) >> 18) & 0x3fff);
      if (ordinal >= MAX_PARAMS) return fail("cuModuleGetFunction", ERR_INVALID_VALUE, "too many parameters");
      f->offset[ordinal] = offset;
      f->size[ordinal] = psize;
      if (ordinal + 1 > f->nparams) f->nparams = ordinal + 1;
      if (offset + psize > f->param_bytes) f->param_bytes = offset + psize;
    } else if (fmt == 4 && attr == 0x10 && len >= 12) { /* EIATTR_REQNTID */
      for (int i = 0; i < 3; ++i) f->reqntid[i] = (int)u32(val + 4 * i);
    }
    p += 4 + len;
  }
  *fn = (void*)(uintptr_t)(g_nfunctions + 1);
  char params[MAX_PARAMS * 24] = "";
  size_t n = 0;
  for (int i = 0; i < f->nparams; ++i) {
    n += (size_t)snprintf(params + n, sizeof params - n, "%s[%d, %d]", i ? ", " : "", f->offset[i], f->size[i]);
  }
  logf_("{\"ev\": \"function\", \"function\": %d, \"module\": %d, \"name\": \"%s\", \"params\": [%s], "
        "\"reqntid\": [%d, %d, %d]}", g_nfunctions + 1, f->module, f->name, params, f->reqntid[0],
        f->reqntid[1], f->reqntid[2]);
  ++g_nfunctions;
  return OK;
}

CUresult cuFuncSetAttribute(void* fn, int attr, int value) {
  const int fi = (int)(uintptr_t)fn - 1;
  if (fi < 0 || fi >= g_nfunctions) return fail("cuFuncSetAttribute", ERR_INVALID_HANDLE, "no such function");
  if (attr == 8) { /* MAX_DYNAMIC_SHARED_SIZE_BYTES */
    if (value > g_smem) return fail("cuFuncSetAttribute", ERR_INVALID_VALUE, "more shared memory than the device has");
    g_functions[fi].max_dynamic_shared = value;
  }
  logf_("{\"ev\": \"attr\", \"function\": %d, \"attr\": %d, \"value\": %d}", fi + 1, attr, value);
  return OK;
}

static CUresult launch(const char* call, void* fn, const unsigned grid[3], const unsigned block[3],
                       unsigned shared, void* stream, void** params, void** extra, int pdl) {
  const int fi = (int)(uintptr_t)fn - 1;
  if (fi < 0 || fi >= g_nfunctions) return fail(call, ERR_INVALID_HANDLE, "no such function");
  const struct Function* f = &g_functions[fi];
  if (extra) return fail(call, ERR_INVALID_VALUE, "extra is not used by ort_flash");
  if (!params && f->nparams) return fail(call, ERR_INVALID_VALUE, "no kernelParams");
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0 || grid[1] > 65535 || grid[2] > 65535 ||
      grid[0] > 2147483647u) {
    return fail(call, ERR_INVALID_VALUE, "grid outside the driver's limits");
  }
  if (f->reqntid[0] && (block[0] != (unsigned)f->reqntid[0] || block[1] != (unsigned)f->reqntid[1] ||
                        block[2] != (unsigned)f->reqntid[2])) {
    return fail(call, ERR_INVALID_VALUE, "block other than the kernel's required one (REQNTID)");
  }
  if (block[0] * block[1] * block[2] > 1024) return fail(call, ERR_INVALID_VALUE, "block over 1024 threads");
  if (shared > 48 * 1024 && (int)shared > f->max_dynamic_shared) {
    return fail(call, ERR_INVALID_VALUE, "dynamic shared memory over the function's limit");
  }
  static unsigned char buf[8192];
  static char hex[2 * sizeof buf + 1];
  if (f->param_bytes > (int)sizeof buf) return fail(call, ERR_INVALID_VALUE, "parameter buffer too large");
  memset(buf, 0xee, (size_t)f->param_bytes);
  for (int i = 0; i < f->nparams; ++i) {
    if (!params[i]) return fail(call, ERR_INVALID_VALUE, "a null kernelParams entry");
    memcpy(buf + f->offset[i], params[i], (size_t)f->size[i]);
  }
  for (int i = 0; i < f->param_bytes; ++i) snprintf(hex + 2 * i, 3, "%02x", buf[i]);
  hex[2 * f->param_bytes] = 0;
  logf_("{\"ev\": \"launch\", \"call\": \"%s\", \"function\": %d, \"grid\": [%u, %u, %u], "
        "\"block\": [%u, %u, %u], \"shared\": %u, \"stream\": %llu, \"pdl\": %d, \"params\": \"%s\"}",
        call, fi + 1, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared,
        (unsigned long long)(uintptr_t)stream, pdl, hex);
  return OK;
}

CUresult cuLaunchKernel(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void* stream, void** params, void** extra) {
  const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  return launch("cuLaunchKernel", fn, grid, block, shared, stream, params, extra, 0);
}

/* cuLaunchKernelEx's config, as cpp/cuda_driver.h lays it out. */
struct LaunchAttr {
  int id;
  char pad[4];
  union {
    char bytes[64];
    int value;
  } value;
};
struct LaunchConfig {
  unsigned grid[3], block[3], shared;
  void* stream;
  struct LaunchAttr* attrs;
  unsigned nattrs;
};

CUresult cuLaunchKernelEx(const struct LaunchConfig* cfg, void* fn, void** params, void** extra) {
  int pdl = 0;
  for (unsigned i = 0; i < cfg->nattrs; ++i) {
    if (cfg->attrs[i].id == 6) pdl = cfg->attrs[i].value.value; /* PROGRAMMATIC_STREAM_SERIALIZATION */
  }
  return launch("cuLaunchKernelEx", fn, cfg->grid, cfg->block, cfg->shared, cfg->stream, params, extra, pdl);
}

/* ort_flash copies the KV cache with it (cpp/kv_cache.cc append_kv_cuda), which the launch
 * tests do not reach: it need only exist. */
CUresult cuMemcpy2DAsync_v2(const void* copy, void* stream) {
  (void)copy;
  logf_("{\"ev\": \"memcpy2d\", \"stream\": %llu}", (unsigned long long)(uintptr_t)stream);
  return OK;
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, void* stream) {
  logf_("{\"ev\": \"memset\", \"dst\": %llu, \"value\": %u, \"bytes\": %zu, \"stream\": %llu}", dst,
        value, n, (unsigned long long)(uintptr_t)stream);
  return OK;
}

static CUdeviceptr fake_alloc(size_t bytes) {
  const CUdeviceptr p = g_next_ptr;
  g_next_ptr += (bytes + 0xffffULL) & ~0xffffULL;
  return p;
}

CUresult cuMemAllocAsync(CUdeviceptr* p, size_t bytes, void* stream) {
  *p = fake_alloc(bytes);
  logf_("{\"ev\": \"alloc\", \"ptr\": %llu, \"bytes\": %zu, \"stream\": %llu}", *p, bytes,
        (unsigned long long)(uintptr_t)stream);
  return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
  *p = fake_alloc(bytes);
  logf_("{\"ev\": \"alloc\", \"ptr\": %llu, \"bytes\": %zu, \"stream\": null}", *p, bytes);
  return OK;
}

CUresult cuMemFreeAsync(CUdeviceptr p, void* stream) {
  logf_("{\"ev\": \"free\", \"ptr\": %llu, \"stream\": %llu}", p, (unsigned long long)(uintptr_t)stream);
  return OK;
}

typedef struct { uint64_t opaque[16]; } TensorMap;

CUresult cuTensorMapEncodeTiled(TensorMap* map, int dtype, uint32_t rank, void* address,
                                const uint64_t* dims, const uint64_t* strides, const uint32_t* box,
                                const uint32_t* elem_strides, int interleave, int swizzle, int l2,
                                int oob) {
  if (rank < 1 || rank > 5) return fail("cuTensorMapEncodeTiled", ERR_INVALID_VALUE, "rank outside 1..5");
  if ((uintptr_t)map % 64 != 0) return fail("cuTensorMapEncodeTiled", ERR_INVALID_VALUE, "map not 64-byte aligned");
  /* The driver's rules for a tiled map (cuTensorMapEncodeTiled's documentation). */
  const int elem = dtype == 6 || dtype == 9 ? 2 : 0; /* FLOAT16, BFLOAT16: the types ort_flash uses */
  if (!elem) return fail("cuTensorMapEncodeTiled", ERR_INVALID_VALUE, "a data type ort_flash does not use");
  if ((uintptr_t)address % 16 != 0) return fail("cuTensorMapEncodeTiled", ERR_INVALID_VALUE, "address not 16-byte aligned");
  for (uint32_t i = 0; i < rank; ++i) {
    if (dims[i] == 0 || dims[i] > (1ULL << 32)) return fail("cuTensorMapEncodeTiled", ERR_INVALID_VALUE, "a dim outside 1..2^32");
    if (box[i] == 0 || box[i] > 256) return fail("cuTensorMapEncodeTiled", ERR_INVALID_VALUE, "a box dim outside 1..256");
    if (elem_strides[i] == 0 || elem_strides[i] > 8) return fail("cuTensorMapEncodeTiled", ERR_INVALID_VALUE, "an element stride outside 1..8");
    if (i + 1 < rank && (strides[i] % 16 != 0 || strides[i] >= (1ULL << 40))) {
      return fail("cuTensorMapEncodeTiled", ERR_INVALID_VALUE, "a stride not a multiple of 16 below 2^40");
    }
  }
  if (interleave != 0) return fail("cuTensorMapEncodeTiled", ERR_INVALID_VALUE, "interleaved layouts are not used");
  if ((box[0] * (uint32_t)elem) % 16 != 0) return fail("cuTensorMapEncodeTiled", ERR_INVALID_VALUE, "inner box not a multiple of 16 bytes");
  const uint32_t span[4] = {0, 32, 64, 128}; /* NONE, 32B, 64B, 128B */
  if (swizzle < 0 || swizzle > 3) return fail("cuTensorMapEncodeTiled", ERR_INVALID_VALUE, "unknown swizzle");
  if (swizzle && box[0] * (uint32_t)elem > span[swizzle]) {
    return fail("cuTensorMapEncodeTiled", ERR_INVALID_VALUE, "inner box wider than the swizzle span");
  }
  char d[128] = "", s[128] = "", b[128] = "", es[128] = "";
  size_t nd = 0, ns = 0, nb = 0, ne = 0;
  for (uint32_t i = 0; i < rank; ++i) {
    nd += (size_t)snprintf(d + nd, sizeof d - nd, "%s%llu", i ? ", " : "", (unsigned long long)dims[i]);
    nb += (size_t)snprintf(b + nb, sizeof b - nb, "%s%u", i ? ", " : "", box[i]);
    ne += (size_t)snprintf(es + ne, sizeof es - ne, "%s%u", i ? ", " : "", elem_strides[i]);
    if (i + 1 < rank) {
      ns += (size_t)snprintf(s + ns, sizeof s - ns, "%s%llu", i ? ", " : "", (unsigned long long)strides[i]);
    }
  }
  memset(map, 0, sizeof *map);
  map->opaque[0] = FAKE_MAP_MAGIC;
  map->opaque[1] = (uint64_t)g_encodes;
  logf_("{\"ev\": \"encode\", \"index\": %d, \"dtype\": %d, \"rank\": %u, \"address\": %llu, "
        "\"dims\": [%s], \"strides\": [%s], \"box\": [%s], \"elem_strides\": [%s], \"interleave\": %d, "
        "\"swizzle\": %d, \"l2\": %d, \"oob\": %d}", g_encodes, dtype, rank,
        (unsigned long long)(uintptr_t)address, d, s, b, es, interleave, swizzle, l2, oob);
  ++g_encodes;
  return OK;
}
