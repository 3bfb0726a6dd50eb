#include "flash_attention_op.h"

#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "cpu_flash.h"
#include "cuda_launch.h"
#include "fp8_launch.h"
#include "kernel_registry.h"
#include "kv_cache.h"
#include "op_io.h"
#include "run_scratch.h"

namespace ort_flash {

class FlashAttentionKernel {
 public:
  FlashAttentionKernel(const OrtApi& api, bool cuda) : api_(api), cuda_(cuda) {}
  ~FlashAttentionKernel() {
    if (allocator_) api_.ReleaseAllocator(allocator_);
  }
  Status init(const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* ctx) {
    Status s = compute(ctx);
    if (s.ok()) return nullptr;
    return api_.CreateStatus(ORT_FAIL, s.message().c_str());
  }

 private:
  // One run of the node: validate (inputs read and checked, outputs allocated, the stream),
  // plan (the kernel's parameters; with a cache, where present is written), launch (the cache
  // append, then the attention), each once.
  struct Run {
    AttentionDims dims;
    const void* data[kNumInputs] = {};
    void* out[kNumOutputs] = {};
    CUstream stream = nullptr;
    FlashParams p;
    bool append = false;              // present = past ++ new before the attention
    void* present[2] = {};            // where the append writes K and V
    int64_t in_stride[2][3] = {};     // the new K and V inputs' (batch, head, token) strides
  };
  using ScratchFn = std::function<Status(size_t bytes, const char* what, void** ptr)>;

  Status compute(OrtKernelContext* ctx);
  Status validate_run(OrtKernelContext* ctx, Run* run) const;
  Status plan_run(const ScratchFn& scratch, Run* run) const;
  Status launch_run(OrtKernelContext* ctx, const ScratchFn& scratch, const Run& run) const;
  Status prefix(Status s) const {
    if (s.ok() || s.message().rfind("FlashAttention node", 0) == 0) return s;
    return Status::Error("FlashAttention node '" + node_ + "': " + s.message());
  }

  const OrtApi& api_;
  const bool cuda_;
  std::string node_;
  Attributes attrs_;
  bool has_output_[kNumOutputs] = {};
  OrtAllocator* allocator_ = nullptr;  // the EP's default allocator (device memory on CUDA)
};

Status FlashAttentionKernel::init(const OrtKernelInfo* info) {
  node_ = kernel_node_name(api_, info);
  ORT_FLASH_RETURN_IF_ERROR(read_attributes(api_, info, node_, &attrs_));
  InputDesc in[kNumInputs];
  ORT_FLASH_RETURN_IF_ERROR(describe_kernel_io(api_, info, in, has_output_));
  AttentionDims dims;
  ORT_FLASH_RETURN_IF_ERROR(validate(node_, attrs_, in, cuda_, &dims));
  if (!has_output_[kY]) return Status::Error("FlashAttention node '" + node_ + "': output 'Y' is required");
  if ((has_output_[kPresentKey] || has_output_[kPresentValue]) && !in[kPastKey].present &&
      in[kNonpad].present) {
    return Status::Error("FlashAttention node '" + node_ +
                         "': present_key/present_value cannot be combined with nonpad_kv_seqlen (ONNX Attention)");
  }
  if ((has_output_[kPresentKey] || has_output_[kPresentValue]) && (!in[kK].present || !in[kV].present)) {
    return Status::Error("FlashAttention node '" + node_ +
                         "': present_key/present_value need K and V inputs; with packed QKV (K and V omitted) "
                         "or packed KV (V omitted) only Y and softmax_lse can be produced");
  }
  if (OrtStatus* st = api_.KernelInfoGetAllocator(info, OrtMemTypeDefault, &allocator_)) {
    std::string msg = api_.GetErrorMessage(st);
    api_.ReleaseStatus(st);
    return Status::Error("FlashAttention node '" + node_ + "': no allocator from the execution provider: " + msg);
  }
  if (attrs_.fp8 && !cuda_) {
    notice_fp8_on_cpu(dims.dtype);
  }
  if (cuda_) {
    int device = 0;
    if (OrtStatus* st = api_.MemoryInfoGetId(allocator_->Info(allocator_), &device)) api_.ReleaseStatus(st);
    const DeviceKernels* dk = nullptr;
    return prefix(prepare_device(device, &dk));
  }
  return Status::Ok();
}

Status FlashAttentionKernel::compute(OrtKernelContext* ctx) {
  Run run;
  ORT_FLASH_RETURN_IF_ERROR(validate_run(ctx, &run));
  // Scratch of this run: the KV cache when there is no present output to hold it (the one host
  // allocation of a CPU run), and on CUDA the split-KV partials (RunScratch: on this run's stream).
  std::unique_ptr<RunScratch> device_scratch;
  std::unique_ptr<void, std::function<void(void*)>> host_scratch(nullptr, [this](void* ptr) {
    if (ptr) allocator_->Free(allocator_, ptr);
  });
  if (cuda_) device_scratch = std::make_unique<RunScratch>(api_, ctx, allocator_->Info(allocator_));
  auto scratch = [&](size_t bytes, const char* what, void** ptr) -> Status {
    if (device_scratch) return device_scratch->alloc(bytes, what, ptr);
    host_scratch.reset(allocator_->Alloc(allocator_, bytes));
    *ptr = host_scratch.get();
    if (!*ptr) return Status::Error("cannot allocate " + std::to_string(bytes) + " bytes for " + what);
    return Status::Ok();
  };
  ORT_FLASH_RETURN_IF_ERROR(prefix(plan_run(scratch, &run)));
  return prefix(launch_run(ctx, scratch, run));
}

Status FlashAttentionKernel::validate_run(OrtKernelContext* ctx, Run* run) const {
  InputDesc in[kNumInputs];
  ORT_FLASH_RETURN_IF_ERROR(describe_context_inputs(api_, ctx, in, run->data));
  ORT_FLASH_RETURN_IF_ERROR(validate(node_, attrs_, in, cuda_, &run->dims));
  ORT_FLASH_RETURN_IF_ERROR(allocate_outputs(api_, ctx, run->dims, has_output_, run->out));
  if (!cuda_) return Status::Ok();
  // ONNX Runtime's stream for this run, asked for once (the cache append and the attention both
  // run on it).
  void* s = nullptr;
  if (OrtStatus* st = api_.KernelContext_GetGPUComputeStream(ctx, &s)) {
    std::string msg = api_.GetErrorMessage(st);
    api_.ReleaseStatus(st);
    return prefix(Status::Error("no CUDA stream from ONNX Runtime: " + msg));
  }
  run->stream = static_cast<CUstream>(s);
  return Status::Ok();
}

Status FlashAttentionKernel::plan_run(const ScratchFn& scratch, Run* run) const {
  const AttentionDims& dims = run->dims;
  const void* const* data = run->data;
  const int es = dtype_size(dims.dtype);
  const int64_t total = dims.total();
  FlashParams& p = run->p;
  p.dtype = dims.dtype;
  p.q = data[kQ];
  p.y = run->out[kY];
  p.lse = static_cast<float*>(run->out[kLse]);
  p.batch = dims.batch; p.hq = dims.hq; p.hkv = dims.hkv;
  p.sq = dims.sq; p.skv = total; p.d = dims.d; p.dv = dims.dv;
  p.offset = dims.past;
  p.scale = std::isnan(attrs_.scale) ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(dims.d))) : attrs_.scale;
  p.softcap = attrs_.softcap;
  p.causal = attrs_.is_causal != 0;
  p.window_left = attrs_.left_window;
  p.window_right = attrs_.right_window;
  p.fp32_precision = attrs_.fp32_precision;
  p.fp8 = attrs_.fp8;
  p.seqlens_k = static_cast<const int64_t*>(data[kNonpad]);
  if (dims.packed) {
    packed_strides(dims, p.q_stride);
  } else {
    seq_strides(dims.rank, dims.hq, dims.sq, dims.d, p.q_stride);
  }
  seq_strides(dims.rank, dims.hq, dims.sq, dims.dv, p.y_stride);
  if (data[kMask]) {
    p.mask = data[kMask];
    p.mask_kind = dims.mask_kind;
    mask_strides(dims.mask_shape, p.mask_stride);
    p.mask_len = dims.mask_shape[3];
  }

  // K and V as attention reads them: the inputs, or present = past ++ new when a cache is given
  // (into the present outputs, or scratch where the node has none).
  seq_strides(dims.rank, dims.hkv, dims.skv_new, dims.d, run->in_stride[0]);
  seq_strides(dims.rank, dims.hkv, dims.skv_new, dims.dv, run->in_stride[1]);
  void** present = run->present;
  present[0] = run->out[kPresentKey];
  present[1] = run->out[kPresentValue];
  run->append = dims.has_past || present[0] || present[1];
  if (run->append) {
    const size_t kbytes = static_cast<size_t>(dims.batch * dims.hkv * total * dims.d) * es;
    const size_t vbytes = static_cast<size_t>(dims.batch * dims.hkv * total * dims.dv) * es;
    const size_t want = (dims.has_past && !present[0] ? kbytes : 0) + (dims.has_past && !present[1] ? vbytes : 0);
    if (want) {
      void* buf = nullptr;
      ORT_FLASH_RETURN_IF_ERROR(scratch(want, "the KV cache", &buf));
      char* s = static_cast<char*>(buf);
      if (!present[0]) { present[0] = s; s += kbytes; }
      if (!present[1]) present[1] = s;
    }
  }
  if (dims.has_past) {
    p.k = present[0];
    p.v = present[1];
    seq_strides(4, dims.hkv, total, dims.d, p.k_stride);
    seq_strides(4, dims.hkv, total, dims.dv, p.v_stride);
  } else if (dims.packed) {  // K and V are views into Q's rows, after its Hq (then Hq + Hkv) heads
    p.k = static_cast<const char*>(data[kQ]) + dims.hq * dims.d * es;
    p.v = static_cast<const char*>(data[kQ]) + (dims.hq + dims.hkv) * dims.d * es;
    packed_strides(dims, p.k_stride);
    packed_strides(dims, p.v_stride);
  } else if (dims.kv_packed) {  // V is a view into K's rows, after its Hkv key heads
    p.k = data[kK];
    p.v = static_cast<const char*>(data[kK]) + dims.hkv * dims.d * es;
    kv_packed_strides(dims, p.k_stride);
    kv_packed_strides(dims, p.v_stride);
  } else {
    p.k = data[kK];
    p.v = data[kV];
    std::memcpy(p.k_stride, run->in_stride[0], sizeof(run->in_stride[0]));
    std::memcpy(p.v_stride, run->in_stride[1], sizeof(run->in_stride[1]));
  }
  return Status::Ok();
}

Status FlashAttentionKernel::launch_run(OrtKernelContext* ctx, const ScratchFn& scratch, const Run& run) const {
  const AttentionDims& dims = run.dims;
  if (run.append) {
    const int es = dtype_size(dims.dtype);
    const void* src[2] = {run.data[kK], run.data[kV]};
    const void* past[2] = {run.data[kPastKey], run.data[kPastValue]};
    const int64_t width[2] = {dims.d, dims.dv};
    for (int i = 0; i < 2; ++i) {
      if (!run.present[i]) continue;
      if (cuda_) {
        ORT_FLASH_RETURN_IF_ERROR(append_kv_cuda(past[i], src[i], run.in_stride[i], run.present[i], dims.batch,
                                                 dims.hkv, dims.past, dims.skv_new, width[i], es, run.stream));
      } else {
        append_kv_cpu(past[i], src[i], run.in_stride[i], run.present[i], dims.batch, dims.hkv, dims.past,
                      dims.skv_new, width[i], es);
      }
    }
  }
  if (is_empty_call(run.p)) return Status::Ok();
  if (cuda_) {
    auto workspace = [&](size_t bytes, void** ptr) {
      return scratch(bytes, run.p.fp8 ? "the attention's scratch (split-KV partials or FP8 operands)" : "split-KV partials", ptr);
    };
    return launch_flash_cuda(run.p, run.stream, workspace);
  }
  try {
    run_flash_cpu(run.p, ort_parallel_for(api_, ctx));
  } catch (const std::exception& e) {
    return Status::Error(std::string("CPU kernel failed: ") + e.what());
  }
  return Status::Ok();
}

FlashAttentionOp::FlashAttentionOp(const char* provider, ONNXTensorElementDataType type)
    : provider_(provider), type_(type) {
  OrtCustomOp::InferOutputShapeFn = infer_output_shapes;
}

OrtStatusPtr FlashAttentionOp::CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
  auto k = std::make_unique<FlashAttentionKernel>(api, std::strcmp(provider_, "CUDAExecutionProvider") == 0);
  Status s = k->init(info);
  if (!s.ok()) return api.CreateStatus(ORT_INVALID_ARGUMENT, s.message().c_str());
  *kernel = k.release();
  return nullptr;
}

ONNXTensorElementDataType FlashAttentionOp::GetInputType(size_t index) const {
  if (index == kQ) return type_;
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // checked by validate() with a clear message
}

OrtCustomOpInputOutputCharacteristic FlashAttentionOp::GetInputCharacteristic(size_t index) const {
  // K and V may be omitted together (Q is then packed QKV) or V alone (K is then packed KV);
  // validate() checks the combinations.
  return index == kQ ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED
                     : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL;
}

ONNXTensorElementDataType FlashAttentionOp::GetOutputType(size_t index) const {
  return index == kLse ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : type_;
}

OrtCustomOpInputOutputCharacteristic FlashAttentionOp::GetOutputCharacteristic(size_t index) const {
  return index == kY ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED
                     : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL;
}

}  // namespace ort_flash
