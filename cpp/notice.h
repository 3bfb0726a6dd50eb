// One-line notices to the user about what the library does in place of what a model asked for
// (a node's attention_precision="fp8" on a call the FP8 kernels do not take): each distinct
// message at most once per process, on standard error, beside ONNX Runtime's own warnings.
#pragma once

#include <string>

namespace ort_flash {

// Writes "ort_flash: <message>" and a newline to standard error the first time `message` is
// given; later calls with the same message write nothing. Thread-safe.
void notice_once(const std::string& message);

}  // namespace ort_flash
