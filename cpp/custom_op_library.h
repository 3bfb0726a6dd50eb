// Public entry point of libort_flash.so, the ONNX Runtime custom-op library.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_c_api.h>
#undef ORT_API_MANUAL_INIT

#ifdef __cplusplus
extern "C" {
#endif

__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                   const OrtApiBase* api_base);

#ifdef __cplusplus
}
#endif
