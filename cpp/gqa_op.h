// The ort_flash::GroupQueryAttention custom op (domain "ort_flash", version 1): ONNX Runtime's
// com.microsoft.GroupQueryAttention interface (inputs, outputs, attributes, the KV buffer that
// past and present share, total_sequence_length in host memory), run by ort_flash's kernels. One
// registration per (execution provider, element type); see cpp/gqa_shapes.h for what it refuses.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include "gqa_shapes.h"

namespace ort_flash {

class GqaKernel;

struct GqaOp : Ort::CustomOpBase<GqaOp, GqaKernel, true> {
  GqaOp(const char* provider, ONNXTensorElementDataType type);

  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const;
  const char* GetName() const { return "GroupQueryAttention"; }
  const char* GetExecutionProviderType() const { return provider_; }

  size_t GetInputTypeCount() const { return kGqaNumInputs; }
  ONNXTensorElementDataType GetInputType(size_t index) const;
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const;
  OrtMemType GetInputMemoryType(size_t index) const;
  size_t GetOutputTypeCount() const { return kGqaNumOutputs; }
  ONNXTensorElementDataType GetOutputType(size_t index) const;
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t index) const;

 private:
  const char* provider_;
  ONNXTensorElementDataType type_;
};

}  // namespace ort_flash
