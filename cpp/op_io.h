// The op's traffic with ONNX Runtime's C API: node name, attributes, input descriptions at kernel
// creation and at run time, output allocation, shape inference and the thread pool.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_c_api.h>
#undef ORT_API_MANUAL_INIT

#include <string>
#include <vector>

#include "attention_shapes.h"
#include "cpu_flash.h"

namespace ort_flash {

std::string kernel_node_name(const OrtApi& api, const OrtKernelInfo* info);

// An attribute of the node, or `fallback` where the node has none.
int64_t int_attribute(const OrtApi& api, const OrtKernelInfo* info, const char* name, int64_t fallback);
float float_attribute(const OrtApi& api, const OrtKernelInfo* info, const char* name, float fallback);
std::string string_attribute(const OrtApi& api, const OrtKernelInfo* info, const char* name,
                             const std::string& fallback);

// Reads the node's attributes; unknown values (e.g. fp32_precision="fast") fail clearly.
Status read_attributes(const OrtApi& api, const OrtKernelInfo* info, const std::string& node, Attributes* out);

// The node's attention_precision: absent or "model" (false), "fp8" (true); anything else fails,
// naming `what` (e.g. "FlashAttention node 'x'").
Status read_attention_precision(const OrtApi& api, const OrtKernelInfo* info, const std::string& what, bool* fp8);

// Input types and static shapes (-1 for symbolic dims) and which outputs the node has.
Status describe_kernel_io(const OrtApi& api, const OrtKernelInfo* info, InputDesc (&in)[kNumInputs],
                          bool (&has_output)[kNumOutputs]);

// The same for an op of `n_in` inputs and `n_out` outputs.
Status describe_kernel_io(const OrtApi& api, const OrtKernelInfo* info, InputDesc* in, size_t n_in,
                          bool* has_output, size_t n_out);

// Concrete input types, shapes and data pointers of one run.
Status describe_context_inputs(const OrtApi& api, OrtKernelContext* ctx, InputDesc (&in)[kNumInputs],
                               const void* (&data)[kNumInputs]);

// The same for an op of `n_in` inputs named `names` (for messages).
Status describe_context_inputs(const OrtApi& api, OrtKernelContext* ctx, InputDesc* in, const void** data,
                               size_t n_in, const char* const* names);

// Output `index` (`name` for messages) of `shape`, and its data.
Status allocate_output(const OrtApi& api, OrtKernelContext* ctx, size_t index, const std::vector<int64_t>& shape,
                       const char* name, void** out);

// Allocates the node's outputs; entries of absent outputs stay null.
Status allocate_outputs(const OrtApi& api, OrtKernelContext* ctx, const AttentionDims& dims,
                        const bool (&has_output)[kNumOutputs], void* (&out)[kNumOutputs]);

// ParallelFor over ONNX Runtime's intra-op thread pool.
ParallelFor ort_parallel_for(const OrtApi& api, OrtKernelContext* ctx);

// OrtCustomOp::InferOutputShapeFn: output types and shapes, symbolic dims carried through.
OrtStatusPtr infer_output_shapes(const OrtCustomOp* op, OrtShapeInferContext* ctx);

}  // namespace ort_flash
