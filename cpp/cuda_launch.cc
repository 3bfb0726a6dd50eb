#include "cuda_launch.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernel_select.h"
#include "launch_plan.h"
#include "tma_desc.h"

namespace ort_flash {
namespace {

// The runtime arguments every kernel of the family shares, by value, in kernel order (the launch
// ABI, aot/build.py). Launch arrays point into it, so it must outlive the launch call.
struct KernelArgs {
  // The scalar slots, in order.
  enum Int { kHq, kGroup, kSq, kSkv, kD, kDv, kOffset, kCausal, kWindowLeft, kWindowRight, kMaskLen,
             kHasSeqlens, kStoreLse, kInts };
  // The stride slots: q, k, v, y (b, h, s), then the mask's (b, h, q); its key stride is 1.
  enum Stride { kYStrideB = 9, kStrides = 15 };
  CUdeviceptr q, k, v, y, lse, mask, seqlens;
  float scale, softcap;
  int32_t ints[kInts];
  int64_t strides[kStrides];
  CUdeviceptr global_scratch = 0, profile_scratch = 0;

  explicit KernelArgs(const FlashParams& p)
      : q(reinterpret_cast<CUdeviceptr>(p.q)), k(reinterpret_cast<CUdeviceptr>(p.k)),
        v(reinterpret_cast<CUdeviceptr>(p.v)), y(reinterpret_cast<CUdeviceptr>(p.y)),
        lse(reinterpret_cast<CUdeviceptr>(p.lse)), mask(reinterpret_cast<CUdeviceptr>(p.mask)),
        seqlens(reinterpret_cast<CUdeviceptr>(p.seqlens_k)), scale(p.scale), softcap(p.softcap),
        ints{static_cast<int32_t>(p.hq), static_cast<int32_t>(p.hq / p.hkv),
             static_cast<int32_t>(p.sq), static_cast<int32_t>(p.skv), static_cast<int32_t>(p.d),
             static_cast<int32_t>(p.dv), static_cast<int32_t>(p.offset), p.causal ? 1 : 0,
             static_cast<int32_t>(p.window_left), static_cast<int32_t>(p.window_right),
             static_cast<int32_t>(p.mask_kind == MaskKind::kNone ? p.skv : p.mask_len),
             p.seqlens_k != nullptr ? 1 : 0, p.lse != nullptr ? 1 : 0} {
    for (int i = 0; i < 3; ++i) {
      strides[i] = p.q_stride[i];
      strides[3 + i] = p.k_stride[i];
      strides[6 + i] = p.v_stride[i];
      strides[9 + i] = p.y_stride[i];
      strides[12 + i] = p.mask_stride[i];
    }
  }

  // The two slots some kernels read with another meaning: the ABI is fixed by the cubins, and
  // these kernels never take the slot's own input. A persistent forward kernel (it takes no
  // windows) reads B x Hq from window_right; a dynamic-tile one (it takes no key lengths) reads
  // its tile counter pair from the key-lengths pointer, has_seqlens saying whether there is one.
  void reuse_for(const KernelLaunch& l, CUdeviceptr tile_counters) {
    if (l.persistent_bh >= 0) ints[kWindowRight] = static_cast<int32_t>(l.persistent_bh);
    if (l.tile_counters) {
      seqlens = tile_counters;
      ints[kHasSeqlens] = tile_counters ? 1 : 0;
    }
  }

  void push_outputs_and_masks(std::vector<void*>& a) {
    for (void* x : {static_cast<void*>(&lse), static_cast<void*>(&mask), static_cast<void*>(&seqlens)}) a.push_back(x);
  }
  void push_scalars(std::vector<void*>& a) {
    a.push_back(&scale);
    a.push_back(&softcap);
    for (int32_t& i : ints) a.push_back(&i);
  }
  void push_strides_and_scratch(std::vector<void*>& a) {
    for (int64_t& s : strides) a.push_back(&s);
    a.push_back(&global_scratch);
    a.push_back(&profile_scratch);
  }
};

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

Status run_forward(const CudaDriver& d, const FlashParams& p, const DeviceKernels& dk, const LaunchPlan& plan,
                   CUstream stream) {
  const KernelLaunch& pointer = plan.described() ? plan.second : plan.main;
  TmaArg tma[kTmaDescriptors];
  const bool encoded = plan.described() && encode_tma_args(d, p, *plan.main.kernel->entry, tma);
  const KernelLaunch& run = encoded ? plan.main : pointer;
  // Runtime arguments in kernel order (the pointer kernel's Q/K/V/Y or the four descriptors),
  // then the two scratch pointers; the Gluon kernel takes exactly the TMA kernel's.
  KernelArgs a(p);
  std::vector<void*> args;
  args.reserve(kTmaLaunchArgCount + 2);
  if (encoded) {
    for (TmaArg& t : tma) t.push(args);
  } else {
    for (CUdeviceptr* x : {&a.q, &a.k, &a.v, &a.y}) args.push_back(x);
  }
  a.push_outputs_and_masks(args);
  a.push_scalars(args);
  a.push_strides_and_scratch(args);
  const int expected = !encoded ? kLaunchArgCount
                       : (plan.kind == KernelKind::kFwdGluon ? kGluonLaunchArgCount : kTmaLaunchArgCount);
  if (args.size() != static_cast<size_t>(expected + 2)) {
    return Status::Error("internal error: launch argument count mismatch");
  }
  if (!run.error.empty()) return Status::Error(run.error);
  CUdeviceptr counters = 0;
  if (run.tile_counters) ORT_FLASH_RETURN_IF_ERROR(stream_counters(d, dk, stream, 0, &counters));
  a.reuse_for(run, counters ? counters + kTileCounterOffset : 0);
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
  KernelArgs a(p);
  int32_t splits = plan.num_splits;
  int32_t fused = counters != 0 ? 1 : 0;
  std::vector<void*> args{&a.q, &a.k, &a.v, &a.y};
  a.push_outputs_and_masks(args);
  args.push_back(&opart);
  args.push_back(&lpart);
  args.push_back(&counters);
  a.push_scalars(args);
  args.push_back(&splits);
  args.push_back(&fused);
  a.push_strides_and_scratch(args);
  if (args.size() != kDecodeArgCount + 2) return Status::Error("internal error: decode argument count mismatch");
  ORT_FLASH_RETURN_IF_ERROR(launch_kernel(d, plan.main, stream, args.data()));
  if (splits == 1 || fused) return Status::Ok();
  if (!plan.second.error.empty()) return Status::Error(plan.second.error);
  using A = KernelArgs;
  const int y_b = A::kYStrideB;
  void* cargs[kCombineArgCount + 2] = {&opart, &lpart, &a.y, &a.lse, &a.ints[A::kHq], &a.ints[A::kSq],
                                       &a.ints[A::kDv], &splits, &a.ints[A::kStoreLse], &a.strides[y_b],
                                       &a.strides[y_b + 1], &a.strides[y_b + 2], &a.global_scratch,
                                       &a.profile_scratch};
  return launch_kernel(d, plan.second, stream, cargs);
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
  const LaunchPlan plan = plan_launch(p, key, *dk, launch_switches(), static_cast<bool>(workspace));
  if (plan.kind == KernelKind::kDecode) return run_decode(*d, p, *dk, plan, stream, workspace);
  if (!plan.error.empty()) return Status::Error(plan.error);
  return run_forward(*d, p, *dk, plan, stream);
}

}  // namespace

Status launch_flash_cuda(const FlashParams& p, CUstream stream, const WorkspaceFn& workspace) {
  return launch(p, nullptr, stream, workspace);
}

Status launch_flash_cuda_with(const FlashParams& p, const DeviceKernels& dk, CUstream stream,
                              const WorkspaceFn& workspace) {
  return launch(p, &dk, stream, workspace);
}

}  // namespace ort_flash
