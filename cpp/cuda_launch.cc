#include "cuda_launch.h"

#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "fp8_launch.h"
#include "kernel_select.h"
#include "launch_plan.h"
#include "notice.h"
#include "tma_desc.h"

namespace ort_flash {
namespace {

// The arguments the forward and the split-KV kernels share, by name (contract.gen.h's FwdArgs,
// FwdGluonArgs and DecodeArgs: their fields are the kernels' parameters, their order the launch's).
template <class Args>
Args attention_args(const FlashParams& p) {
  Args a;
  a.Q = dev(p.q);
  a.K = dev(p.k);
  a.V = dev(p.v);
  a.Y = dev(p.y);
  a.Lse = dev(p.lse);
  a.Mask = dev(p.mask);
  // Key lengths (bottom-right, per row), or a key bound with positions kept (the Gluon kernels'
  // has_seqlens: FlashParams::key_bound); never both (plan_flash_cuda).
  a.SeqlensK = dev(p.key_bound != nullptr ? p.key_bound : p.seqlens_k);
  a.scale = p.scale;
  a.softcap = p.softcap;
  a.Hq = static_cast<int32_t>(p.hq);
  a.group = static_cast<int32_t>(p.hq / p.hkv);
  a.Sq = static_cast<int32_t>(p.sq);
  a.Skv = static_cast<int32_t>(p.skv);
  a.D = static_cast<int32_t>(p.d);
  a.Dv = static_cast<int32_t>(p.dv);
  a.offset = static_cast<int32_t>(p.offset);
  a.causal = p.causal ? 1 : 0;
  a.window_left = static_cast<int32_t>(p.window_left);
  a.window_right = static_cast<int32_t>(p.window_right);
  a.mask_len = static_cast<int32_t>(p.mask_kind == MaskKind::kNone ? p.skv : p.mask_len);
  a.has_seqlens = p.key_bound != nullptr ? 2 : (p.seqlens_k != nullptr ? 1 : 0);
  a.store_lse = p.lse != nullptr ? 1 : 0;
  a.stride_qb = p.q_stride[0], a.stride_qh = p.q_stride[1], a.stride_qm = p.q_stride[2];
  a.stride_kb = p.k_stride[0], a.stride_kh = p.k_stride[1], a.stride_kn = p.k_stride[2];
  a.stride_vb = p.v_stride[0], a.stride_vh = p.v_stride[1], a.stride_vn = p.v_stride[2];
  a.stride_yb = p.y_stride[0], a.stride_yh = p.y_stride[1], a.stride_ym = p.y_stride[2];
  a.stride_mb = p.mask_stride[0], a.stride_mh = p.mask_stride[1], a.stride_mm = p.mask_stride[2];
  return a;
}

// cuLaunchKernel, or cuLaunchKernelEx with programmatic stream serialization where the plan says
// so (it does only where the driver has it).
Status launch_kernel(const CudaDriver& d, const KernelLaunch& l, CUstream stream, void** args) {
  const unsigned gx = static_cast<unsigned>(l.grid[0]), gy = static_cast<unsigned>(l.grid[1]),
                 gz = static_cast<unsigned>(l.grid[2]);
  const CUfunction f = l.kernel->function;
  const std::string what =
      std::string(l.pdl ? "cuLaunchKernelEx(" : "cuLaunchKernel(") + l.kernel->entry->variant_name + ")";
  if (!l.pdl || !d.cuLaunchKernelEx) {
    return cuda_check(d.cuLaunchKernel(f, gx, gy, gz, l.block, 1, 1, l.shared, stream, args, nullptr), what.c_str());
  }
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.value = 1;
  CUlaunchConfig cfg{gx, gy, gz, l.block, 1, 1, l.shared, stream, &attr, 1};
  return cuda_check(d.cuLaunchKernelEx(&cfg, f, args, nullptr), what.c_str());
}

// The counter set of `stream` (DeviceKernels::decode_counters: its arrival counters, then the tile
// counter pair at kTileCounterOffset), or 0: the split kernel's fused merge then runs as the
// combine kernel, a dynamic-tile kernel takes its tiles round robin. The counters must be zero at
// launch, and no two launches may use one set at once. One set per (context, stream): launches on
// one stream run one after another, the last CTA of each row block resets its counter (of a
// dynamic launch, the pair), and a set is zeroed on the stream before its first use. Concurrent
// runs of ONNX Runtime use different streams, so different sets; a CUDA graph replays its
// launches on the stream it was captured on or one serialized with it. A stream first seen while
// capturing gets none (zeroing it then would land in the graph only), nor do streams past the
// 64th or launches needing more than a set's counters (those fill the GPU unsplit anyway).
Status stream_counters(const CudaDriver& d, const DeviceKernels& dk, CUstream stream, int64_t needed,
                       CUdeviceptr* out) {
  *out = 0;
  if (!dk.decode_counters || needed > kDecodeCountersPerSlot) return Status::Ok();
  static std::mutex mutex;
  static auto* slots = new std::map<std::pair<CUcontext, CUstream>, int>();
  static auto* used = new std::map<CUcontext, int>();
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(dk.context, stream);
  auto it = slots->find(key);
  if (it == slots->end()) {
    int capturing = CU_STREAM_CAPTURE_STATUS_NONE;
    ORT_FLASH_RETURN_IF_ERROR(cuda_check(d.cuStreamIsCapturing(stream, &capturing), "cuStreamIsCapturing"));
    int& n = (*used)[dk.context];
    if (capturing != CU_STREAM_CAPTURE_STATUS_NONE || n >= kDecodeCounterSlots) return Status::Ok();
    ORT_FLASH_RETURN_IF_ERROR(cuda_check(
        d.cuMemsetD8Async(dk.decode_counters + n * kCounterSlotBytes, 0, kCounterSlotBytes, stream),
        "cuMemsetD8Async (split-KV counters)"));
    it = slots->emplace(key, n++).first;
  }
  *out = dk.decode_counters + static_cast<size_t>(it->second) * kCounterSlotBytes;
  return Status::Ok();
}

// A call with Q's rotary (FlashParams::rotary_half) planned on a kernel that cannot apply it: the
// caller asked gluon_takes_rotary first, so this is a launcher bug, never a silent unrotated Q.
std::string rotary_elsewhere(const KernelEntry& e) {
  return std::string("internal error: Q's rotary was planned on the Gluon kernels but the call runs ") +
         e.variant_name + ", which cannot apply it";
}

// `launched` (bounded plans only): false where the Gluon kernel's tensor maps could not be encoded
// and nothing ran (the unmasked twin's pointer kernel would ignore the key bound; the caller runs
// the masked call instead).
Status run_forward(const CudaDriver& d, const FlashParams& p, const DeviceKernels& dk, const LaunchPlan& plan,
                   CUstream stream, bool* launched = nullptr) {
  const KernelLaunch& pointer = plan.described() ? plan.second : plan.main;
  TmaArg tma[kTmaDescriptors];
  const bool encoded = plan.described() && encode_tma_args(d, p, *plan.main.kernel->entry, tma);
  if (launched) *launched = encoded || !plan.bounded;
  if (plan.bounded && !encoded) return Status::Ok();
  const KernelLaunch& run = encoded ? plan.main : pointer;
  if (!run.error.empty()) return Status::Error(run.error);
  if (run.kernel->entry->key.kind != KernelKind::kFwdGluon) {
    if (p.rotary_half != 0) return Status::Error(rotary_elsewhere(*run.kernel->entry));
    FwdArgs a = attention_args<FwdArgs>(p);
    std::vector<void*> args = a.pointers(encoded ? tma : static_cast<TmaArg*>(nullptr));
    return launch_kernel(d, run, stream, args.data());
  }
  // The Gluon kernels take the TMA kernel's arguments (the four descriptors in place of the
  // pointers) and the tile counter pair, which a dynamic-tile kernel takes from its stream's set.
  FwdGluonArgs a = attention_args<FwdGluonArgs>(p);
  a.Cos = dev(p.rotary_cos);
  a.Sin = dev(p.rotary_sin);
  a.rotary_half = static_cast<int32_t>(p.rotary_half);
  a.max_position = static_cast<int32_t>(p.max_position);
  if (run.tile_counters) {
    CUdeviceptr counters = 0;
    ORT_FLASH_RETURN_IF_ERROR(stream_counters(d, dk, stream, 0, &counters));
    a.TileCounter = counters ? counters + kTileCounterOffset : 0;
  }
  std::vector<void*> args = a.pointers(tma);
  return launch_kernel(d, run, stream, args.data());
}

Status run_decode(const CudaDriver& d, const FlashParams& p, const DeviceKernels& dk, const LaunchPlan& plan,
                  CUstream stream, const WorkspaceFn& workspace) {
  CUdeviceptr opart = 0, lpart = 0;
  if (plan.num_splits > 1) {
    void* ws = nullptr;
    ORT_FLASH_RETURN_IF_ERROR(workspace(plan.workspace_bytes, &ws));
    if (!ws) return Status::Error("no workspace for the split-KV partials");
    opart = reinterpret_cast<CUdeviceptr>(ws);
    lpart = opart + plan.lse_offset;
  }
  CUdeviceptr counters = 0;
  if (plan.fused_merge) ORT_FLASH_RETURN_IF_ERROR(stream_counters(d, dk, stream, plan.merge_counters, &counters));
  DecodeArgs a = attention_args<DecodeArgs>(p);
  a.OPart = opart;
  a.LsePart = lpart;
  a.Counter = counters;
  a.num_splits = plan.num_splits;
  a.fused = counters != 0 ? 1 : 0;
  std::vector<void*> args = a.pointers();
  ORT_FLASH_RETURN_IF_ERROR(launch_kernel(d, plan.main, stream, args.data()));
  if (a.num_splits == 1 || a.fused) return Status::Ok();
  if (!plan.second.error.empty()) return Status::Error(plan.second.error);
  CombineArgs c;
  c.OPart = opart;
  c.LsePart = lpart;
  c.Y = a.Y;
  c.Lse = a.Lse;
  c.Hq = a.Hq;
  c.Sq = a.Sq;
  c.Dv = a.Dv;
  c.num_splits = a.num_splits;
  c.store_lse = a.store_lse;
  c.stride_yb = a.stride_yb, c.stride_yh = a.stride_yh, c.stride_ym = a.stride_ym;
  std::vector<void*> cargs = c.pointers();
  return launch_kernel(d, plan.second, stream, cargs.data());
}

// `dk` null: the kernels of the stream's context, loaded after the call is known to have a variant.
Status launch(const FlashParams& p, const DeviceKernels* dk, CUstream stream, const WorkspaceFn& workspace) {
  if (is_empty_call(p)) return Status::Ok();
  VariantKey key{};
  ORT_FLASH_RETURN_IF_ERROR(select_variant(p, &key));
  if (!dk) ORT_FLASH_RETURN_IF_ERROR(kernels_for_stream(stream, &dk));
  const CudaDriver* d = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(cuda_driver(&d));
  if (p.sq > INT32_MAX || p.skv > INT32_MAX) {
    return Status::Error("sequence lengths above 2^31 - 1 are not supported");
  }
  if (p.fp8) {
    const std::string why = workspace ? fp8_declines(p, *dk) : std::string("calls without scratch memory");
    if (why.empty()) return launch_fp8(p, *dk, stream, workspace);
    notice_once(std::string("attention_precision=fp8: attention runs in ") + dtype_name(p.dtype) +
                " here, not FP8: " + why);
  }
  LaunchPlan plan;
  ORT_FLASH_RETURN_IF_ERROR(plan_flash_cuda(p, *dk, static_cast<bool>(workspace), &plan));
  // The key bound runs on the Gluon kernel (the unmasked twin) or not at all: elsewhere the mask.
  FlashParams masked = p;
  masked.key_bound = nullptr;
  if (plan.bounded) {
    bool launched = false;
    ORT_FLASH_RETURN_IF_ERROR(run_forward(*d, unmasked_twin(p), *dk, plan, stream, &launched));
    if (launched) return Status::Ok();
    ORT_FLASH_RETURN_IF_ERROR(plan_flash_cuda(masked, *dk, static_cast<bool>(workspace), &plan));
  }
  if (plan.kind == KernelKind::kDecode) {
    if (p.rotary_half != 0) return Status::Error(rotary_elsewhere(*plan.first()));
    return run_decode(*d, masked, *dk, plan, stream, workspace);
  }
  if (!plan.error.empty()) return Status::Error(plan.error);
  return run_forward(*d, masked, *dk, plan, stream);
}

}  // namespace

Status gluon_takes_rotary(const FlashParams& p, CUstream stream, bool can_split, bool* takes) {
  *takes = false;
  if (is_empty_call(p) || p.fp8 || p.rotary_half == 0) return Status::Ok();
  const DeviceKernels* dk = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(kernels_for_stream(stream, &dk));
  const CudaDriver* d = nullptr;
  ORT_FLASH_RETURN_IF_ERROR(cuda_driver(&d));
  LaunchPlan plan;  // plan_flash_cuda fails where no variant takes the call
  if (!plan_flash_cuda(p, *dk, can_split, &plan).ok() || plan.kind != KernelKind::kFwdGluon ||
      !plan.error.empty() || !plan.main.error.empty() || !plan.main.kernel) {
    return Status::Ok();
  }
  TmaArg tma[kTmaDescriptors];
  *takes = encode_tma_args(*d, plan.bounded ? unmasked_twin(p) : p, *plan.main.kernel->entry, tma);
  return Status::Ok();
}

Status launch_grid(const CudaDriver& drv, const LoadedKernel& k, int64_t gx, int64_t gy, int64_t gz, void** args,
                   CUstream stream) {
  if (gx <= 0 || gy <= 0 || gz <= 0) return Status::Ok();
  const KernelEntry& e = *k.entry;
  if (gx > std::numeric_limits<int32_t>::max() || gy > 65535 || gz > 65535) {
    return Status::Error(std::string(e.variant_name) + ": grid (" + std::to_string(gx) + ", " + std::to_string(gy) +
                         ", " + std::to_string(gz) + ") exceeds the GPU's limits");
  }
  return cuda_check(drv.cuLaunchKernel(k.function, static_cast<unsigned>(gx), static_cast<unsigned>(gy),
                                       static_cast<unsigned>(gz), 32 * e.num_warps, 1, 1, e.shared, stream, args,
                                       nullptr),
                    (std::string("cuLaunchKernel(") + e.variant_name + ")").c_str());
}

Status launch_flash_cuda(const FlashParams& p, CUstream stream, const WorkspaceFn& workspace) {
  return launch(p, nullptr, stream, workspace);
}

Status launch_flash_cuda_with(const FlashParams& p, const DeviceKernels& dk, CUstream stream,
                              const WorkspaceFn& workspace) {
  return launch(p, &dk, stream, workspace);
}

}  // namespace ort_flash
