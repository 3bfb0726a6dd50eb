// ort_flash_run: load an ONNX model that uses ort_flash::FlashAttention, run it with the
// ONNX Runtime C++ API and print its outputs. No Python is involved at run time.
//
//   ort_flash_run MODEL.onnx LIBORT_FLASH.so [--cuda] [--seq N] [--batch B]
//   ort_flash_run MODEL.onnx [...]   (built with find_package(ort_flash): that package's library)
//
// Inputs are made up for every graph input (dynamic dims: axis 0 = B, other axes = N), and
// are deterministic so that another runtime can reproduce them:
//   int64/int32 named like *ids*:  token ids (i * 7 + 3) % 100, i = flat element index
//   other int64/int32 (masks ...): 1
//   bool:                          true
//   float32/float16/bfloat16:      standard normal, mt19937 seeded 0 + Box-Muller
// For each output it prints its name, dtype, shape, the first 8 values and the sum.
#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Args {
  std::string model, library;
  bool cuda = false;
  int64_t seq = 8, batch = 1;
};

Args ParseArgs(int argc, char** argv) {
  Args a;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "--cuda") {
      a.cuda = true;
    } else if ((s == "--seq" || s == "--batch") && i + 1 < argc) {
      int64_t v = std::atoll(argv[++i]);
      if (v <= 0) throw std::invalid_argument(s + " needs a positive integer");
      (s == "--seq" ? a.seq : a.batch) = v;
    } else if (!s.empty() && s[0] == '-') {
      throw std::invalid_argument("unknown or incomplete option " + s);
    } else {
      positional.push_back(s);
    }
  }
#ifdef ORT_FLASH_DEFAULT_LIBRARY  // the library find_package(ort_flash) gave at build time
  if (positional.size() == 1) positional.push_back(ORT_FLASH_DEFAULT_LIBRARY);
#endif
  if (positional.size() != 2) throw std::invalid_argument("expected MODEL.onnx and LIBORT_FLASH.so");
  a.model = positional[0];
  a.library = positional[1];
  return a;
}

// Ask for ONNX Runtime's CUDA execution provider (needs an onnxruntime-gpu build of the library,
// its libonnxruntime_providers_*.so beside it, and the CUDA/cuDNN libraries on the loader path).
void AppendCuda(Ort::SessionOptions& so) {
  const OrtApi& api = Ort::GetApi();
  OrtCUDAProviderOptionsV2* cuda = nullptr;
  OrtStatus* status = api.CreateCUDAProviderOptions(&cuda);  // fails in CPU-only builds
  if (status == nullptr) {
    status = api.SessionOptionsAppendExecutionProvider_CUDA_V2(so, cuda);  // device 0, defaults
    api.ReleaseCUDAProviderOptions(cuda);
  }
  if (status != nullptr) {
    std::string msg = api.GetErrorMessage(status);
    api.ReleaseStatus(status);
    throw std::runtime_error("CUDA execution provider unavailable: " + msg +
                             "\n(use an onnxruntime-gpu library and put the CUDA 13 / cuDNN "
                             "libraries on LD_LIBRARY_PATH, or run without --cuda)");
  }
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

const char* TypeName(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "float64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "bool";
    default: return "unsupported";
  }
}

// One input tensor for graph input `index`, allocated (and owned) by ONNX Runtime's CPU allocator.
Ort::Value MakeInput(Ort::Session& session, size_t index, const Args& args, std::mt19937& rng) {
  Ort::AllocatorWithDefaultOptions alloc;
  std::string name = session.GetInputNameAllocated(index, alloc).get();
  Ort::TypeInfo type_info = session.GetInputTypeInfo(index);
  if (type_info.GetONNXType() != ONNX_TYPE_TENSOR)
    throw std::runtime_error("input '" + name + "' is not a tensor");
  auto info = type_info.GetTensorTypeAndShapeInfo();
  ONNXTensorElementDataType type = info.GetElementType();
  std::vector<int64_t> shape = info.GetShape();
  for (size_t axis = 0; axis < shape.size(); ++axis)
    if (shape[axis] < 0) shape[axis] = axis == 0 ? args.batch : args.seq;  // dynamic dim

  Ort::Value value = Ort::Value::CreateTensor(alloc, shape.data(), shape.size(), type);
  const size_t n = value.GetTensorTypeAndShapeInfo().GetElementCount();
  const bool ids = Lower(name).find("ids") != std::string::npos;
  auto integer = [&](size_t i) { return ids ? static_cast<int64_t>((i * 7 + 3) % 100) : 1; };
  auto normal = [&] {  // Box-Muller on raw mt19937 draws: the same numbers with any C++ library
    double u1 = (rng() + 1.0) / 4294967296.0, u2 = rng() / 4294967296.0;  // u1 in (0, 1]
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  };
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: {
      auto* p = value.GetTensorMutableData<int64_t>();
      for (size_t i = 0; i < n; ++i) p[i] = integer(i);
      break;
    }
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: {
      auto* p = value.GetTensorMutableData<int32_t>();
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(integer(i));
      break;
    }
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: {
      auto* p = value.GetTensorMutableData<bool>();
      std::fill(p, p + n, true);
      break;
    }
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: {
      auto* p = value.GetTensorMutableData<float>();
      for (size_t i = 0; i < n; ++i) p[i] = normal();
      break;
    }
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: {
      auto* p = value.GetTensorMutableData<Ort::Float16_t>();
      for (size_t i = 0; i < n; ++i) p[i] = Ort::Float16_t(normal());
      break;
    }
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: {
      auto* p = value.GetTensorMutableData<Ort::BFloat16_t>();
      for (size_t i = 0; i < n; ++i) p[i] = Ort::BFloat16_t(normal());
      break;
    }
    default:
      throw std::runtime_error("input '" + name + "' has an element type this example does not fill");
  }
  std::printf("input %s %s %s\n", name.c_str(), TypeName(type), ShapeString(shape).c_str());
  return value;
}

// Element i of a CPU tensor as a double, for printing and the checksum.
double At(const Ort::Value& v, ONNXTensorElementDataType type, size_t i) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return v.GetTensorData<float>()[i];
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return v.GetTensorData<Ort::Float16_t>()[i].ToFloat();
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return v.GetTensorData<Ort::BFloat16_t>()[i].ToFloat();
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return v.GetTensorData<double>()[i];
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return static_cast<double>(v.GetTensorData<int64_t>()[i]);
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return v.GetTensorData<int32_t>()[i];
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return v.GetTensorData<bool>()[i] ? 1.0 : 0.0;
    default: throw std::runtime_error("output element type not printable by this example");
  }
}

int Run(const Args& args) {
  Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "ort_flash_run");
  Ort::SessionOptions so;
  // The two calls that matter: register ort_flash's custom ops, then (optionally) ask for CUDA.
  so.RegisterCustomOpsLibrary(args.library.c_str());
  if (args.cuda) AppendCuda(so);
  Ort::Session session(env, args.model.c_str(), so);

  std::mt19937 rng(0);
  Ort::AllocatorWithDefaultOptions alloc;
  std::vector<Ort::Value> inputs;
  std::vector<Ort::AllocatedStringPtr> name_owners;
  std::vector<const char*> input_names, output_names;
  for (size_t i = 0; i < session.GetInputCount(); ++i) {
    inputs.push_back(MakeInput(session, i, args, rng));
    name_owners.push_back(session.GetInputNameAllocated(i, alloc));
    input_names.push_back(name_owners.back().get());
  }
  for (size_t i = 0; i < session.GetOutputCount(); ++i) {
    name_owners.push_back(session.GetOutputNameAllocated(i, alloc));
    output_names.push_back(name_owners.back().get());
  }

  // Outputs come back in CPU memory (ONNX Runtime copies them off the GPU with --cuda).
  std::vector<Ort::Value> outputs = session.Run(Ort::RunOptions{nullptr}, input_names.data(),
                                                inputs.data(), inputs.size(),
                                                output_names.data(), output_names.size());
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].IsTensor()) {
      std::printf("output %s (not a tensor)\n", output_names[k]);
      continue;
    }
    auto info = outputs[k].GetTensorTypeAndShapeInfo();
    const size_t n = info.GetElementCount();
    std::printf("output %s %s %s\n", output_names[k], TypeName(info.GetElementType()),
                ShapeString(info.GetShape()).c_str());
    double sum = 0.0;
    std::printf("  first:");
    for (size_t i = 0; i < n; ++i) {
      double x = At(outputs[k], info.GetElementType(), i);
      if (i < 8) std::printf(" %.9g", x);
      sum += x;
    }
    std::printf("\n  sum: %.17g\n", sum);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(ParseArgs(argc, argv));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "error: %s\nusage: %s MODEL.onnx LIBORT_FLASH.so [--cuda] [--seq N] [--batch B]\n",
                 e.what(), argc > 0 ? argv[0] : "ort_flash_run");
    return 2;
  } catch (const Ort::Exception& e) {  // every ONNX Runtime failure: bad model, missing op, ...
    std::fprintf(stderr, "onnxruntime error (code %d): %s\n", static_cast<int>(e.GetOrtErrorCode()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
