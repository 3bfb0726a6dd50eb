#include "fp8_launch.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "contract.gen.h"
#include "kernel_select.h"
#include "notice.h"

namespace ort_flash {
namespace {

// The kernel of `kind` for the call's dtype and head dim (and, for the attention, causal flag).
const LoadedKernel* fp8_kernel(const DeviceKernels& dk, KernelKind kind, const FlashParams& p) {
  for (const LoadedKernel& k : dk.kernels) {
    const KernelEntry& e = *k.entry;
    if (e.key.kind == kind && e.key.dtype == p.dtype && e.key.head_dim == p.d &&
        (kind != KernelKind::kFwdFp8 || e.tile_causal == (p.causal ? 1 : 0))) {
      return &k;
    }
  }
  return nullptr;
}

// 16-element strides (kernel_select.h) and 16-byte-aligned tensors: the FP8 kernels' alignment.
bool fp8_aligned(const FlashParams& p) {
  if (!strides_aligned(p)) return false;
  for (const void* ptr : {p.q, p.k, p.v, static_cast<const void*>(p.y)}) {
    if (dev(ptr) % 16 != 0) return false;
  }
  return true;
}

// Stats programs per key head: about two programs per SM in all, at most one per key block
// (aot/fp8_prepare.py stats_splits).
int64_t stats_splits(int64_t heads, int64_t n, int64_t block_n, int64_t sms) {
  const int64_t blocks = (n + block_n - 1) / block_n;
  return std::max<int64_t>(1, std::min(blocks, (2 * sms + heads - 1) / heads));
}

}  // namespace

std::string fp8_declines(const FlashParams& p, const DeviceKernels& dk) {
  if (p.dtype == DType::kFloat32) return "float32 attention (the FP8 path takes float16 and bfloat16)";
  if (dk.table_arch != 90) {
    return "this GPU is sm_" + std::to_string(dk.arch) + "; the FP8 kernels run on sm_90 (H100, H200)";
  }
  if (p.d != p.dv || (p.d != 64 && p.d != 128)) return "head sizes other than 64 and 128";
  if (!fp8_kernel(dk, KernelKind::kFp8Stats, p) || !fp8_kernel(dk, KernelKind::kFp8Quantize, p) ||
      !fp8_kernel(dk, KernelKind::kFwdFp8, p)) {
    return std::string("this build has no FP8 kernels for ") + dtype_name(p.dtype) + " at head size " +
           std::to_string(p.d);
  }
  if (p.sq != p.skv || p.offset != 0) {
    return "calls with a KV cache (decode, continued prompts): the FP8 path is for prefill";
  }
  if (p.mask_kind != MaskKind::kNone || p.seqlens_k != nullptr) return "calls with a mask or key lengths";
  if (p.window_left >= 0 || p.window_right >= 0 || p.softcap > 0.0f || p.sink != nullptr) {
    return "calls with a window, softcap or attention sinks";
  }
  if (p.hkv <= 0 || p.hq % p.hkv != 0) return "query heads that are not a multiple of the key heads";
  if (!fp8_aligned(p)) return "tensors whose strides or addresses are not 16-element aligned";
  if (p.sq > std::numeric_limits<int32_t>::max() / 2) return "sequences of 2^30 tokens or more";
  return "";
}

Status launch_fp8(const FlashParams& p, const DeviceKernels& dk, CUstream stream, const WorkspaceFn& workspace) {
  if (!workspace) return Status::Error("the FP8 path needs scratch memory and none was given");
  const LoadedKernel* stats = fp8_kernel(dk, KernelKind::kFp8Stats, p);
  const LoadedKernel* quant = fp8_kernel(dk, KernelKind::kFp8Quantize, p);
  const LoadedKernel* attn = fp8_kernel(dk, KernelKind::kFwdFp8, p);
  if (!stats || !quant || !attn) return Status::Error("this build has no FP8 kernels for the call");
  const CudaDriver* drv = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(cuda_driver(&drv));

  // aot/fp8_prepare.py's buffers (buffer_specs): Np = N padded to both tiles.
  const int64_t bm = attn->entry->block_m, bn = attn->entry->block_n;
  const int64_t b = p.batch, hq = p.hq, hkv = p.hkv, n = p.sq, d = p.d;
  const int64_t pad = std::max(bm, bn);
  const int64_t np = (n + pad - 1) / pad * pad;
  const int64_t splits = stats_splits(b * hkv, n, bn, dk.sm_count > 0 ? dk.sm_count : 132);
  const size_t sizes[] = {
      static_cast<size_t>(b * hkv * splits * 2 * d) * 4,  // Part
      static_cast<size_t>(b * hq * np * d),               // Q8
      static_cast<size_t>(b * hkv * np * d),              // K8
      static_cast<size_t>(b * hkv * d * np),              // V8t
      static_cast<size_t>(b * hq * (np / bm)) * 4,        // ScaleQ
      static_cast<size_t>(b * hkv * (np / bn)) * 4,       // ScaleK
      static_cast<size_t>(b * hkv * d) * 4,               // ScaleV
      static_cast<size_t>(b * hq * np) * 4,               // QBias
  };
  size_t total = 0;
  for (size_t s : sizes) total += aligned(s);
  void* ws = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(workspace(total, &ws));
  if (!ws) return Status::Error("no scratch memory for the FP8 operands");
  uint64_t buf[8];
  uint64_t at = dev(ws);
  for (int i = 0; i < 8; ++i) {
    buf[i] = at;
    at += aligned(sizes[i]);
  }

  Fp8StatsArgs s;
  s.K = dev(p.k);
  s.V = dev(p.v);
  s.Part = buf[0];
  s.H = static_cast<int32_t>(hkv);
  s.N = static_cast<int32_t>(n);
  s.splits = static_cast<int32_t>(splits);
  s.stride_kb = p.k_stride[0], s.stride_kh = p.k_stride[1], s.stride_kn = p.k_stride[2];
  s.stride_vb = p.v_stride[0], s.stride_vh = p.v_stride[1], s.stride_vn = p.v_stride[2];
  std::vector<void*> sargs = s.pointers();
  ORT_FLASH_RETURN_IF_ERROR(launch_grid(*drv, *stats, splits, b * hkv, 1, sargs.data(), stream));

  Fp8QuantizeArgs q;
  q.Q = dev(p.q);
  q.K = s.K;
  q.V = s.V;
  q.Part = buf[0];
  q.Q8 = buf[1], q.K8 = buf[2], q.V8t = buf[3];
  q.ScaleQ = buf[4], q.ScaleK = buf[5], q.ScaleV = buf[6], q.QBias = buf[7];
  q.Hq = static_cast<int32_t>(hq);
  q.group = static_cast<int32_t>(hq / hkv);
  q.N = s.N;
  q.splits = s.splits;
  q.stride_qb = p.q_stride[0], q.stride_qh = p.q_stride[1], q.stride_qm = p.q_stride[2];
  q.stride_kb = s.stride_kb, q.stride_kh = s.stride_kh, q.stride_kn = s.stride_kn;
  q.stride_vb = s.stride_vb, q.stride_vh = s.stride_vh, q.stride_vn = s.stride_vn;
  std::vector<void*> qargs = q.pointers();
  ORT_FLASH_RETURN_IF_ERROR(launch_grid(*drv, *quant, np / std::min(bm, bn), b * hq, 2, qargs.data(), stream));

  FwdFp8Args a;
  a.Q8 = q.Q8, a.K8 = q.K8, a.V8t = q.V8t;
  a.ScaleQ = q.ScaleQ, a.ScaleK = q.ScaleK, a.ScaleV = q.ScaleV, a.QBias = q.QBias;
  a.Y = dev(p.y);
  a.Lse = dev(p.lse);
  a.softmax_scale = p.scale;
  a.Hq = q.Hq;
  a.group = q.group;
  a.N = q.N;
  a.store_lse = p.lse != nullptr ? 1 : 0;
  a.stride_yb = p.y_stride[0], a.stride_yh = p.y_stride[1], a.stride_ym = p.y_stride[2];
  std::vector<void*> aargs = a.pointers();
  return launch_grid(*drv, *attn, (n + bm - 1) / bm, b * hq, 1, aargs.data(), stream);
}

void notice_fp8_on_cpu(DType dtype) {
  notice_once(std::string("attention_precision=fp8: attention runs in ") + dtype_name(dtype) +
              " on the CPU execution provider, not FP8: the FP8 path runs on sm_90 GPUs (H100, H200)");
}

}  // namespace ort_flash
