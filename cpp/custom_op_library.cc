// The library's one entry point: ONNX Runtime calls RegisterCustomOps when a session's options
// register this library (SessionOptions::RegisterCustomOpsLibrary). It registers
// ort_flash::FlashAttention and ort_flash::GroupQueryAttention for the CUDA and CPU execution
// providers.
#include "custom_op_library.h"

#include <mutex>
#include <string>

#include "flash_attention_op.h"
#include "gqa_op.h"

namespace {

constexpr const char* kDomain = "ort_flash";

// One op's registrations: per execution provider, per Q element type.
template <class Op>
struct PerProvider {
  Op ops[6] = {
      {"CUDAExecutionProvider", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16},
      {"CUDAExecutionProvider", ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16},
      {"CUDAExecutionProvider", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT},
      {"CPUExecutionProvider", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16},
      {"CPUExecutionProvider", ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16},
      {"CPUExecutionProvider", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT},
  };
  OrtStatus* add_to(const OrtApi* api, OrtCustomOpDomain* domain) {
    for (auto& op : ops) {
      if (OrtStatus* st = api->CustomOpDomain_Add(domain, &op)) return st;
    }
    return nullptr;
  }
};

// The ops and their domain live as long as the process: sessions keep pointers to them, and ORT
// may release sessions after this library's static destructors would have run.
struct Registry {
  PerProvider<ort_flash::FlashAttentionOp> flash;
  PerProvider<ort_flash::GqaOp> gqa;
  OrtCustomOpDomain* domain = nullptr;
};

Registry* g_registry = nullptr;
std::mutex g_mutex;

// An error status from a runtime whose API is older than the one this library was built on.
OrtStatus* too_old(const OrtApiBase* base) {
  const std::string msg = std::string("ort_flash needs ONNX Runtime API version ") +
                          std::to_string(ORT_API_VERSION) + " (onnxruntime 1." +
                          std::to_string(ORT_API_VERSION) + ") or newer; this runtime is " +
                          (base->GetVersionString ? base->GetVersionString() : "older") +
                          ": upgrade it (pip install -U onnxruntime-gpu, or onnxruntime for the CPU)";
  for (uint32_t v = ORT_API_VERSION - 1; v >= 1; --v) {
    if (const OrtApi* api = base->GetApi(v)) return api->CreateStatus(ORT_FAIL, msg.c_str());
  }
  return nullptr;  // no API at all to report through
}

}  // namespace

extern "C" OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  if (!api_base) return nullptr;
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (!api) return too_old(api_base);
  Ort::InitApi(api);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_registry) {
    auto* r = new Registry();
    if (OrtStatus* st = api->CreateCustomOpDomain(kDomain, &r->domain)) {
      delete r;
      return st;
    }
    if (OrtStatus* st = r->flash.add_to(api, r->domain)) return st;
    if (OrtStatus* st = r->gqa.add_to(api, r->domain)) return st;
    g_registry = r;
  }
  return api->AddCustomOpDomain(options, g_registry->domain);
}
