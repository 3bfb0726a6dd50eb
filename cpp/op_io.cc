#include "op_io.h"

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <atomic>
#include <cmath>
#include <vector>

namespace ort_flash {
namespace {

// Takes ownership of an OrtStatus*; returns its message (empty if null).
std::string take_error(const OrtApi& api, OrtStatus* st) {
  if (!st) return std::string();
  std::string msg = api.GetErrorMessage(st);
  api.ReleaseStatus(st);
  return msg.empty() ? std::string("unknown ONNX Runtime error") : msg;
}

Status describe_tensor(const OrtApi& api, const OrtTensorTypeAndShapeInfo* info, InputDesc* d) {
  ONNXTensorElementDataType t = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  size_t rank = 0;
  std::string err = take_error(api, api.GetTensorElementType(info, &t));
  if (err.empty()) err = take_error(api, api.GetDimensionsCount(info, &rank));
  d->shape.assign(rank, -1);
  if (err.empty() && rank) err = take_error(api, api.GetDimensions(info, d->shape.data(), rank));
  if (!err.empty()) return Status::Error(err);
  d->present = true;
  d->elem_type = static_cast<int>(t);
  for (int64_t& v : d->shape) {
    if (v < 0) v = -1;
  }
  return Status::Ok();
}

std::string io_name(const OrtApi& api, const OrtKernelInfo* info, size_t i, bool input) {
  size_t size = 0;
  auto get = input ? api.KernelInfo_GetInputName : api.KernelInfo_GetOutputName;
  if (!take_error(api, get(info, i, nullptr, &size)).empty() || size == 0) return std::string();
  std::string s(size, '\0');
  if (!take_error(api, get(info, i, &s[0], &size)).empty()) return std::string();
  s.resize(size ? size - 1 : 0);
  return s;
}

}  // namespace

std::string kernel_node_name(const OrtApi& api, const OrtKernelInfo* info) {
  size_t size = 0;
  if (!take_error(api, api.KernelInfo_GetNodeName(info, nullptr, &size)).empty() || size <= 1) {
    return "(unnamed)";
  }
  std::string s(size, '\0');
  if (!take_error(api, api.KernelInfo_GetNodeName(info, &s[0], &size)).empty()) return "(unnamed)";
  s.resize(size - 1);
  return s;
}

int64_t int_attribute(const OrtApi& api, const OrtKernelInfo* info, const char* name, int64_t fallback) {
  int64_t v = fallback;
  return take_error(api, api.KernelInfoGetAttribute_int64(info, name, &v)).empty() ? v : fallback;
}

float float_attribute(const OrtApi& api, const OrtKernelInfo* info, const char* name, float fallback) {
  float v = fallback;
  return take_error(api, api.KernelInfoGetAttribute_float(info, name, &v)).empty() ? v : fallback;
}

std::string string_attribute(const OrtApi& api, const OrtKernelInfo* info, const char* name,
                             const std::string& fallback) {
  size_t size = 0;
  if (!take_error(api, api.KernelInfoGetAttribute_string(info, name, nullptr, &size)).empty() || size == 0) {
    return fallback;
  }
  std::string s(size, '\0');
  if (!take_error(api, api.KernelInfoGetAttribute_string(info, name, &s[0], &size)).empty()) return fallback;
  s.resize(size - 1);
  return s;
}

Status read_attributes(const OrtApi& api, const OrtKernelInfo* info, const std::string& node, Attributes* a) {
  a->scale = float_attribute(api, info, "scale", a->scale);
  a->softcap = float_attribute(api, info, "softcap", a->softcap);
  a->is_causal = int_attribute(api, info, "is_causal", a->is_causal);
  a->left_window = int_attribute(api, info, "left_window_size", a->left_window);
  a->right_window = int_attribute(api, info, "right_window_size", a->right_window);
  a->q_num_heads = int_attribute(api, info, "q_num_heads", a->q_num_heads);
  a->kv_num_heads = int_attribute(api, info, "kv_num_heads", a->kv_num_heads);
  if (int_attribute(api, info, "qk_matmul_output_mode", 0) != 0) {
    return Status::Error("FlashAttention node '" + node + "': qk_matmul_output_mode is not supported (the fused op never materializes QK^T)");
  }
  // Absent: 'ieee'; a value given must be one of the two (an empty string too is refused). No
  // kernel offers 'tf32x3' (its enum value stays for the table's codes), so it is refused here
  // rather than failing later on CUDA only.
  const std::string s = string_attribute(api, info, "fp32_precision", "ieee");
  if (s == "ieee") a->fp32_precision = Fp32Precision::kIeee;
  else if (s == "tf32") a->fp32_precision = Fp32Precision::kTf32;
  else return Status::Error("FlashAttention node '" + node + "': attribute fp32_precision is '" + s + "'; expected 'ieee' or 'tf32'");
  return read_attention_precision(api, info, "FlashAttention node '" + node + "'", &a->fp8);
}

Status read_attention_precision(const OrtApi& api, const OrtKernelInfo* info, const std::string& what, bool* fp8) {
  const std::string s = string_attribute(api, info, "attention_precision", "model");
  if (s != "model" && s != "fp8") {
    return Status::Error(what + ": attribute attention_precision is '" + s + "'; expected 'model' or 'fp8'");
  }
  *fp8 = s == "fp8";
  return Status::Ok();
}

Status describe_kernel_io(const OrtApi& api, const OrtKernelInfo* info, InputDesc* in, size_t n_in,
                          bool* has_output, size_t n_out) {
  size_t got_in = 0, got_out = 0;
  take_error(api, api.KernelInfo_GetInputCount(info, &got_in));
  take_error(api, api.KernelInfo_GetOutputCount(info, &got_out));
  for (size_t i = 0; i < got_in && i < n_in; ++i) {
    if (io_name(api, info, i, true).empty()) continue;
    OrtTypeInfo* ti = nullptr;
    if (!take_error(api, api.KernelInfo_GetInputTypeInfo(info, i, &ti)).empty() || !ti) continue;
    const OrtTensorTypeAndShapeInfo* tsi = nullptr;
    take_error(api, api.CastTypeInfoToTensorInfo(ti, &tsi));
    if (tsi) {
      Status s = describe_tensor(api, tsi, &in[i]);
      if (!s.ok()) in[i].present = true;  // present, details unknown until run time
    } else {
      in[i].present = true;
    }
    // Shapes recorded in the model may be absent; a rank of 0 then means "unknown".
    if (in[i].shape.empty()) in[i].rank_known = false;
    api.ReleaseTypeInfo(ti);
  }
  for (size_t i = 0; i < got_out && i < n_out; ++i) has_output[i] = !io_name(api, info, i, false).empty();
  return Status::Ok();
}

Status describe_kernel_io(const OrtApi& api, const OrtKernelInfo* info, InputDesc (&in)[kNumInputs],
                          bool (&has_output)[kNumOutputs]) {
  return describe_kernel_io(api, info, in, kNumInputs, has_output, kNumOutputs);
}

Status describe_context_inputs(const OrtApi& api, OrtKernelContext* ctx, InputDesc* in, const void** data,
                               size_t n_in, const char* const* names) {
  size_t n = 0;
  take_error(api, api.KernelContext_GetInputCount(ctx, &n));
  for (size_t i = 0; i < n && i < n_in; ++i) {
    const OrtValue* v = nullptr;
    std::string err = take_error(api, api.KernelContext_GetInput(ctx, i, &v));
    if (!err.empty()) return Status::Error(err);
    if (!v) continue;
    OrtTensorTypeAndShapeInfo* info = nullptr;
    err = take_error(api, api.GetTensorTypeAndShape(v, &info));
    if (!err.empty()) return Status::Error(std::string("input '") + names[i] + "': " + err);
    Status s = describe_tensor(api, info, &in[i]);
    api.ReleaseTensorTypeAndShapeInfo(info);
    ORT_FLASH_RETURN_IF_ERROR(s);
    void* p = nullptr;
    err = take_error(api, api.GetTensorMutableData(const_cast<OrtValue*>(v), &p));
    if (!err.empty()) return Status::Error(err);
    data[i] = p;
  }
  return Status::Ok();
}

Status describe_context_inputs(const OrtApi& api, OrtKernelContext* ctx, InputDesc (&in)[kNumInputs],
                               const void* (&data)[kNumInputs]) {
  return describe_context_inputs(api, ctx, in, data, kNumInputs, kInputNames);
}

Status allocate_output(const OrtApi& api, OrtKernelContext* ctx, size_t index, const std::vector<int64_t>& shape,
                       const char* name, void** out) {
  OrtValue* v = nullptr;
  std::string err = take_error(api, api.KernelContext_GetOutput(ctx, index, shape.data(), shape.size(), &v));
  if (!err.empty() || !v) return Status::Error(std::string("cannot allocate output '") + name + "': " + err);
  err = take_error(api, api.GetTensorMutableData(v, out));
  return err.empty() ? Status::Ok() : Status::Error(err);
}

Status allocate_outputs(const OrtApi& api, OrtKernelContext* ctx, const AttentionDims& dims,
                        const bool (&has_output)[kNumOutputs], void* (&out)[kNumOutputs]) {
  const std::vector<int64_t> shapes[kNumOutputs] = {dims.y_shape(), dims.present_shape(false),
                                                   dims.present_shape(true), dims.lse_shape()};
  for (int i = 0; i < kNumOutputs; ++i) {
    if (has_output[i]) ORT_FLASH_RETURN_IF_ERROR(allocate_output(api, ctx, i, shapes[i], kOutputNames[i], &out[i]));
  }
  return Status::Ok();
}

ParallelFor ort_parallel_for(const OrtApi& api, OrtKernelContext* ctx) {
  return [&api, ctx](size_t n, const std::function<void(size_t, size_t)>& fn) {
    if (n == 0) return;
    auto trampoline = [](void* user, size_t i) {
      (*static_cast<const std::function<void(size_t, size_t)>*>(user))(i, i + 1);
    };
    if (OrtStatus* st = api.KernelContext_ParallelFor(ctx, trampoline, n, 0,
                                                      const_cast<std::function<void(size_t, size_t)>*>(&fn))) {
      api.ReleaseStatus(st);
      fn(0, n);  // no thread pool: run inline
    }
  };
}

OrtStatusPtr infer_output_shapes(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  // ONNX Runtime ignores a status returned from here, so invalid inputs simply leave the outputs
  // untyped here; kernel creation reports them with a clear message.
  const OrtApi& api = Ort::GetApi();
  size_t n = 0;
  take_error(api, api.ShapeInferContext_GetInputCount(ctx, &n));
  InputDesc in[kNumInputs];
  std::vector<std::string> sym[kNumInputs];
  for (size_t i = 0; i < n && i < kNumInputs; ++i) {
    OrtTensorTypeAndShapeInfo* info = nullptr;
    if (!take_error(api, api.ShapeInferContext_GetInputTypeShape(ctx, i, &info)).empty() || !info) continue;
    if (!describe_tensor(api, info, &in[i]).ok()) continue;
    // An omitted optional input (K and V of packed QKV, V of packed KV, before a mask) comes without a type.
    if (in[i].elem_type == 0) {
      in[i] = InputDesc();
      continue;
    }
    std::vector<const char*> names(in[i].shape.size(), nullptr);
    if (!names.empty()) take_error(api, api.GetSymbolicDimensions(info, names.data(), names.size()));
    for (const char* s : names) sym[i].push_back(s ? s : "");
    if (in[i].shape.empty()) in[i].rank_known = false;
  }
  Attributes attrs;
  auto read_int = [&](const char* name, int64_t* v) {
    const OrtOpAttr* a = nullptr;
    if (!take_error(api, api.ShapeInferContext_GetAttribute(ctx, name, &a)).empty() || !a) return;
    size_t got = 0;
    take_error(api, api.ReadOpAttr(a, ORT_OP_ATTR_INT, v, sizeof(int64_t), &got));
  };
  read_int("q_num_heads", &attrs.q_num_heads);
  read_int("kv_num_heads", &attrs.kv_num_heads);
  AttentionDims dims;
  if (!in[kQ].rank_known || !validate("", attrs, in, false, &dims).ok()) return nullptr;

  static std::atomic<int> fresh{0};
  // A dim of an output: a known value, the symbol of the input dim it copies, or a new symbol.
  auto dim = [&](int64_t value, int input, int axis) -> std::string {
    if (value >= 0) return std::string();
    if (input >= 0 && axis < static_cast<int>(sym[input].size()) && !sym[input][axis].empty()) return sym[input][axis];
    return "ort_flash_dim_" + std::to_string(fresh++);
  };
  const bool r4 = dims.rank == 4;
  struct Out { std::vector<int64_t> shape; std::vector<std::string> syms; int type; };
  const int qtype = in[kQ].elem_type;
  std::vector<Out> outs = {
      {dims.y_shape(), {dim(dims.batch, kQ, 0), dim(r4 ? dims.hq : dims.sq, kQ, 1),
                        dim(r4 ? dims.sq : dims.y_shape()[2], r4 ? kQ : -1, 2),
                        r4 ? dim(dims.dv, kV, 3) : std::string()}, qtype},
      {dims.present_shape(false), {dim(dims.batch, kQ, 0), dim(dims.hkv, r4 ? kK : -1, 1),
                                   dim(dims.total(), dims.has_past ? -1 : (r4 ? kK : -1), r4 ? 2 : 1),
                                   dim(dims.d, -1, 3)}, qtype},
      {dims.present_shape(true), {}, qtype},
      {dims.lse_shape(), {dim(dims.batch, kQ, 0), dim(dims.hq, r4 ? kQ : -1, 1), dim(dims.sq, kQ, r4 ? 2 : 1)}, 1},
  };
  outs[2].syms = outs[1].syms;
  outs[2].syms[3] = dim(dims.dv, -1, 3);
  if (!r4) outs[0].syms.resize(3);
  for (size_t i = 0; i < outs.size(); ++i) {
    Out& o = outs[i];
    OrtTensorTypeAndShapeInfo* info = nullptr;
    if (!take_error(api, api.CreateTensorTypeAndShapeInfo(&info)).empty()) return nullptr;
    std::vector<const char*> names;
    for (const std::string& s : o.syms) names.push_back(s.c_str());
    std::vector<int64_t> dims_v = o.shape;
    for (int64_t& v : dims_v) v = v < 0 ? -1 : v;
    take_error(api, api.SetTensorElementType(info, static_cast<ONNXTensorElementDataType>(o.type)));
    take_error(api, api.SetDimensions(info, dims_v.data(), dims_v.size()));
    take_error(api, api.SetSymbolicDimensions(info, names.data(), names.size()));
    take_error(api, api.ShapeInferContext_SetOutputTypeShape(ctx, i, info));
    api.ReleaseTensorTypeAndShapeInfo(info);
  }
  return nullptr;
}

}  // namespace ort_flash
