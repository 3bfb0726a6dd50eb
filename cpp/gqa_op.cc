#include "gqa_op.h"

#include <cstring>
#include <memory>
#include <string>

#include "fp8_launch.h"
#include "gqa_call.h"
#include "gqa_launch.h"
#include "op_io.h"
#include "run_scratch.h"

namespace ort_flash {

class GqaKernel {
 public:
  GqaKernel(const OrtApi& api, bool cuda) : api_(api), cuda_(cuda) {}
  ~GqaKernel() {
    if (allocator_) api_.ReleaseAllocator(allocator_);
  }
  Status init(const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* ctx) {
    Status s = compute(ctx);
    return s.ok() ? nullptr : api_.CreateStatus(ORT_FAIL, s.message().c_str());
  }

 private:
  Status compute(OrtKernelContext* ctx);

  const OrtApi& api_;
  const bool cuda_;
  std::string node_;
  GqaAttributes attrs_;
  bool has_output_[kGqaNumOutputs] = {};
  OrtAllocator* allocator_ = nullptr;  // CUDA: the EP's device allocator (its memory info for scratch)
};

Status GqaKernel::init(const OrtKernelInfo* info) {
  node_ = kernel_node_name(api_, info);
  GqaAttributes& a = attrs_;
  a.num_heads = int_attribute(api_, info, "num_heads", 0);
  a.kv_num_heads = int_attribute(api_, info, "kv_num_heads", 0);
  a.scale = float_attribute(api_, info, "scale", 0.0f);
  a.softcap = float_attribute(api_, info, "softcap", 0.0f);
  a.local_window_size = int_attribute(api_, info, "local_window_size", -1);
  a.do_rotary = int_attribute(api_, info, "do_rotary", 0);
  a.rotary_interleaved = int_attribute(api_, info, "rotary_interleaved", 0);
  a.causal = int_attribute(api_, info, "causal", 1);
  a.smooth_softmax = int_attribute(api_, info, "smooth_softmax", -1);
  a.qk_output = int_attribute(api_, info, "qk_output", 0);
  a.sliding_window_cache = int_attribute(api_, info, "sliding_window_cache", 0);
  a.k_quant_type = string_attribute(api_, info, "k_quant_type", "NONE");
  a.v_quant_type = string_attribute(api_, info, "v_quant_type", "NONE");
  a.qk_norm_epsilon = float_attribute(api_, info, "qk_norm_epsilon", 1e-6f);
  ORT_FLASH_RETURN_IF_ERROR(read_attention_precision(api_, info, "GroupQueryAttention node '" + node_ + "'", &a.fp8));
  InputDesc in[kGqaNumInputs];
  ORT_FLASH_RETURN_IF_ERROR(describe_kernel_io(api_, info, in, kGqaNumInputs, has_output_, kGqaNumOutputs));
  GqaDims dims;
  ORT_FLASH_RETURN_IF_ERROR(validate_gqa(node_, attrs_, in, has_output_, cuda_, &dims));
  if (!has_output_[kGqaPresentKey] || !has_output_[kGqaPresentValue]) {
    return Status::Error("GroupQueryAttention node '" + node_ + "': outputs 'present_key' and 'present_value' are required");
  }
  if (a.fp8 && !cuda_) {
    notice_fp8_on_cpu(dims.dtype);
  }
  if (!cuda_) return Status::Ok();
  auto prefix = [&](Status s) {
    return s.ok() ? s : Status::Error("GroupQueryAttention node '" + node_ + "': " + s.message());
  };
  if (OrtStatus* st = api_.KernelInfoGetAllocator(info, OrtMemTypeDefault, &allocator_)) {
    std::string msg = api_.GetErrorMessage(st);
    api_.ReleaseStatus(st);
    return prefix(Status::Error("no allocator from the execution provider: " + msg));
  }
  int device = 0;
  if (OrtStatus* st = api_.MemoryInfoGetId(allocator_->Info(allocator_), &device)) api_.ReleaseStatus(st);
  // The kernels load here, never inside a run that a CUDA graph might be capturing.
  return prefix(gqa_cuda_ready(device, dims.dtype, gqa_has_sinks(a, in[kGqaHeadSink].present), dims.windowed));
}

Status GqaKernel::compute(OrtKernelContext* ctx) {
  InputDesc in[kGqaNumInputs];
  const void* data[kGqaNumInputs] = {};
  ORT_FLASH_RETURN_IF_ERROR(describe_context_inputs(api_, ctx, in, data, kGqaNumInputs, kGqaInputNames));
  GqaCall c;
  ORT_FLASH_RETURN_IF_ERROR(validate_gqa(node_, attrs_, in, has_output_, cuda_, &c.dims));
  c.attrs = attrs_;
  c.query = data[kGqaQuery];
  c.key = data[kGqaKey];
  c.value = data[kGqaValue];
  c.past_key = data[kGqaPastKey];
  c.past_value = data[kGqaPastValue];
  c.seqlens_k = static_cast<const int32_t*>(data[kGqaSeqlensK]);
  c.total_sequence_length = *static_cast<const int32_t*>(data[kGqaTotalSeqLen]);
  c.cos_cache = data[kGqaCos];
  c.sin_cache = data[kGqaSin];
  c.position_ids = c.dims.has_position_ids ? static_cast<const int64_t*>(data[kGqaPositionIds]) : nullptr;
  c.head_sink = data[kGqaHeadSink];
  c.q_norm = c.dims.qk_norm ? data[kGqaQNorm] : nullptr;
  c.k_norm = c.dims.qk_norm ? data[kGqaKNorm] : nullptr;
  const std::vector<int64_t> present = c.dims.present_shape(c.total_sequence_length);
  c.present_len = present[2];
  ORT_FLASH_RETURN_IF_ERROR(allocate_output(api_, ctx, kGqaOutput, c.dims.output_shape(), kGqaOutputNames[kGqaOutput], &c.output));
  ORT_FLASH_RETURN_IF_ERROR(allocate_output(api_, ctx, kGqaPresentKey, present, kGqaOutputNames[kGqaPresentKey], &c.present_key));
  ORT_FLASH_RETURN_IF_ERROR(allocate_output(api_, ctx, kGqaPresentValue, present, kGqaOutputNames[kGqaPresentValue], &c.present_value));
  if (c.dims.batch == 0 || c.dims.sq == 0) return Status::Ok();
  if (!cuda_) return run_gqa_cpu(node_, c, ort_parallel_for(api_, ctx));
  // seqlens_k and position_ids are device memory here; total_sequence_length is a CPU input.
  void* stream = nullptr;
  if (OrtStatus* st = api_.KernelContext_GetGPUComputeStream(ctx, &stream)) api_.ReleaseStatus(st);
  RunScratch scratch(api_, ctx, allocator_->Info(allocator_));
  Status s = run_gqa_cuda(node_, c, static_cast<CUstream>(stream), [&](size_t bytes, void** ptr) {
    return scratch.alloc(bytes, "GroupQueryAttention scratch", ptr);
  });
  if (s.ok() || s.message().rfind("GroupQueryAttention node", 0) == 0) return s;
  return Status::Error("GroupQueryAttention node '" + node_ + "': " + s.message());
}

namespace {

// past_key may share present_key's buffer, past_value present_value's (ONNX Runtime's own op
// declares the same); ORT_API's arrays are released by release_pairs.
size_t inplace_pairs(int** inputs, int** outputs) {
  *inputs = new int[2]{kGqaPastKey, kGqaPastValue};
  *outputs = new int[2]{kGqaPresentKey, kGqaPresentValue};
  return 2;
}

void release_pairs(int* inputs, int* outputs) {
  delete[] inputs;
  delete[] outputs;
}

}  // namespace

GqaOp::GqaOp(const char* provider, ONNXTensorElementDataType type) : provider_(provider), type_(type) {
  OrtCustomOp::GetMayInplace = inplace_pairs;
  OrtCustomOp::ReleaseMayInplace = release_pairs;
}

OrtStatusPtr GqaOp::CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
  auto k = std::make_unique<GqaKernel>(api, std::strcmp(provider_, "CUDAExecutionProvider") == 0);
  Status s = k->init(info);
  if (!s.ok()) return api.CreateStatus(ORT_INVALID_ARGUMENT, s.message().c_str());
  *kernel = k.release();
  return nullptr;
}

ONNXTensorElementDataType GqaOp::GetInputType(size_t index) const {
  switch (index) {
    case kGqaQuery: return type_;
    case kGqaSeqlensK:
    case kGqaTotalSeqLen: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    default: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // checked by validate_gqa with a clear message
  }
}

OrtCustomOpInputOutputCharacteristic GqaOp::GetInputCharacteristic(size_t index) const {
  const bool required = index == kGqaQuery || index == kGqaSeqlensK || index == kGqaTotalSeqLen;
  return required ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED
                  : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL;
}

OrtMemType GqaOp::GetInputMemoryType(size_t index) const {
  // The host reads it to size present (ONNX Runtime's op keeps it in CPU memory too).
  return index == kGqaTotalSeqLen ? OrtMemTypeCPUInput : OrtMemTypeDefault;
}

ONNXTensorElementDataType GqaOp::GetOutputType(size_t) const { return type_; }

OrtCustomOpInputOutputCharacteristic GqaOp::GetOutputCharacteristic(size_t index) const {
  return index == kGqaOutput ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED
                             : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL;
}

}  // namespace ort_flash
