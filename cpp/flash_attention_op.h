// The ort_flash::FlashAttention custom op (domain "ort_flash", version 1), one registration per
// (execution provider, Q element type). Inputs, outputs and attributes follow ONNX Attention
// (opset 25); see docs/op-and-rewriter.md ("The op: ort_flash::FlashAttention") and
// cpp/flash_params.h.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <string>

#include "attention_shapes.h"

namespace ort_flash {

class FlashAttentionKernel;

struct FlashAttentionOp : Ort::CustomOpBase<FlashAttentionOp, FlashAttentionKernel, true> {
  FlashAttentionOp(const char* provider, ONNXTensorElementDataType type);

  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const;
  const char* GetName() const { return "FlashAttention"; }
  const char* GetExecutionProviderType() const { return provider_; }

  size_t GetInputTypeCount() const { return kNumInputs; }
  ONNXTensorElementDataType GetInputType(size_t index) const;
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const;
  size_t GetOutputTypeCount() const { return kNumOutputs; }
  ONNXTensorElementDataType GetOutputType(size_t index) const;
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t index) const;

 private:
  const char* provider_;
  ONNXTensorElementDataType type_;
};

}  // namespace ort_flash
