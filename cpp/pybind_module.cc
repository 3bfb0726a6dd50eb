// ort_flash._C: what Python needs from the C++ side without going through ONNX Runtime: the AOT
// kernel table (for `ort-flash info`), and raw entries to the CPU kernel and the CUDA launcher
// over FlashParams (pointers as integers) for direct kernel tests and benchmarks.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cpu_flash.h"
#include "cuda_launch.h"
#include "gqa_launch.h"
#include "kernel_registry.h"
#include "kernel_select.h"
#include "kernel_table.h"
#include "launch_plan.h"

namespace py = pybind11;
using namespace ort_flash;

namespace {

py::list kernels() {
  size_t n = 0;
  const KernelEntry* t = kernel_table(&n);
  py::list out;
  for (size_t i = 0; i < n; ++i) {
    const KernelEntry& e = t[i];
    py::dict d;
    d["variant"] = e.variant_name;
    d["arch"] = e.arch;
    d["dtype"] = dtype_name(e.key.dtype);
    d["head_dim"] = e.key.head_dim;
    d["even_d"] = e.key.even_d;
    d["precision"] = code_name(e.key.precision);
    d["mask"] = code_name(e.key.mask);
    d["extras"] = e.key.extras;
    d["kind"] = code_name(e.key.kind);
    d["mask_keys"] = e.key.mask_keys;
    d["num_warps"] = e.num_warps;
    d["shared"] = e.shared;
    d["block_m"] = e.block_m;
    d["block_n"] = e.block_n;
    d["tile_causal"] = e.tile_causal;
    d["tile_min_len"] = e.tile_min_len;
    d["tile_max_len"] = e.tile_max_len;
    d["persistent"] = e.persistent;
    d["dynamic"] = e.dynamic;
    d["pdl"] = e.pdl;
    d["cubin_bytes"] = static_cast<size_t>(e.cubin_end - e.cubin);
    if (e.key.kind == KernelKind::kFwdTma || e.key.kind == KernelKind::kFwdGluon) {
      // (swizzle, box rows, box cols) of Q, K, V, Y
      py::list boxes;
      for (const TmaBox& b : e.tma) boxes.append(py::make_tuple(b.swizzle, b.rows, b.cols));
      d["tma"] = boxes;
    }
    out.append(d);
  }
  return out;
}

void threads_parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn) {
  const size_t workers = std::max<size_t>(1, std::min<size_t>(n, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      for (size_t i = w; i < n; i += workers) fn(i, i + 1);
    });
  }
  for (auto& t : pool) t.join();
}

template <typename T>
uintptr_t ptr_get(const T* p) { return reinterpret_cast<uintptr_t>(p); }

void check(const Status& s) {
  if (!s.ok()) throw std::runtime_error(s.message());
}

// A table entry from a row of aot/variants.py's codes and tiles (plan_with_table, launch_with_table).
// `name` must outlive the entry.
KernelEntry entry_from_row(const py::dict& r, int arch, const std::string& name) {
  KernelEntry e{};
  e.key.dtype = static_cast<DType>(r["dtype"].cast<int>());
  e.key.head_dim = r["head_dim"].cast<int>();
  e.key.even_d = r["even_d"].cast<bool>();
  e.key.mask = static_cast<MaskKind>(r["mask"].cast<int>());
  e.key.extras = r["extras"].cast<bool>();
  e.key.precision = static_cast<Fp32Precision>(r["precision"].cast<int>());
  e.key.kind = static_cast<KernelKind>(r["kind"].cast<int>());
  e.key.mask_keys = r["mask_keys"].cast<bool>();
  e.arch = arch;
  e.variant_name = name.c_str();
  e.kernel_name = "";
  e.num_warps = r["num_warps"].cast<int>();
  e.block_m = r["block_m"].cast<int>();
  e.block_n = r["block_n"].cast<int>();
  e.tile_causal = r["tile_causal"].cast<int>();
  e.tile_min_len = r["tile_min_len"].cast<int>();
  e.pdl = r.contains("pdl") && r["pdl"].cast<bool>();
  e.tile_max_len = r.contains("tile_max_len") ? r["tile_max_len"].cast<int>() : 0;
  e.persistent = r.contains("persistent") ? r["persistent"].cast<int>() : 0;
  e.dynamic = r.contains("dynamic") && r["dynamic"].cast<bool>();
  return e;
}

// The dispatcher over a table given as rows (aot/variants.py's codes and tiles) rather than the
// compiled one: the launch plan for any build and GPU, checked where there is neither. `read` takes
// what it needs from the plan while the entries it points into live.
template <class Read>
py::tuple with_table_plan(const FlashParams& p, const std::vector<py::dict>& rows, int arch, int sm_count,
                          bool tensor_maps, const Read& read) {
  std::vector<std::string> names;
  names.reserve(rows.size());
  std::vector<KernelEntry> entries;
  entries.reserve(rows.size());
  for (const py::dict& r : rows) {
    names.push_back(r["variant"].cast<std::string>());
    entries.push_back(entry_from_row(r, arch, names.back()));
  }
  DeviceKernels dk{};
  dk.device = -1;
  dk.arch = dk.table_arch = arch;
  dk.sm_count = sm_count;
  dk.tensor_maps = tensor_maps;
  for (const KernelEntry& e : entries) dk.kernels.push_back({&e, nullptr});
  LaunchPlan plan;
  check(plan_flash_cuda(p, dk, true, &plan));
  return read(plan);
}

std::string variant_of(const KernelLaunch& l) { return l.kernel ? l.kernel->entry->variant_name : ""; }

py::tuple plan_with_table(const FlashParams& p, const std::vector<py::dict>& rows, int arch, int sm_count,
                          bool tensor_maps) {
  return with_table_plan(p, rows, arch, sm_count, tensor_maps, [](const LaunchPlan& plan) {
    return py::make_tuple(code_name(plan.kind), variant_of(plan.main), variant_of(plan.second), plan.num_splits);
  });
}

// How the dispatcher splits and merges a call over a table of rows (the decode plan's choices).
py::tuple merge_with_table(const FlashParams& p, const std::vector<py::dict>& rows, int arch, int sm_count) {
  return with_table_plan(p, rows, arch, sm_count, false, [](const LaunchPlan& plan) {
    return py::make_tuple(code_name(plan.kind), variant_of(plan.main), plan.num_splits, plan.fused_merge);
  });
}

// Runs `launch` on `stream` with stream-ordered workspace (the split-KV partials, GQA's scratch),
// each block freed on the stream after the kernels.
void run_on_stream(uintptr_t stream, const std::function<Status(CUstream, const WorkspaceFn&)>& launch) {
  const CudaDriver* d = nullptr;
  check(cuda_driver(&d));
  const CUstream s = reinterpret_cast<CUstream>(stream);
  std::vector<CUdeviceptr> blocks;
  Status st = launch(s, [&](size_t bytes, void** ptr) {
    CUdeviceptr ws = 0;
    ORT_FLASH_RETURN_IF_ERROR(cuda_check(d->cuMemAllocAsync(&ws, bytes, s), "cuMemAllocAsync"));
    blocks.push_back(ws);
    *ptr = reinterpret_cast<void*>(ws);
    return Status::Ok();
  });
  for (CUdeviceptr ws : blocks) {
    Status f = cuda_check(d->cuMemFreeAsync(ws, s), "cuMemFreeAsync");
    if (st.ok()) st = f;
  }
  check(st);
}

// run_cuda over a table of `rows` instead of the build's: each row as plan_with_table takes it,
// plus "cubin_of", the variant of this build whose loaded cubin it launches (its function, block,
// shared memory, TMA boxes). A table the build could make (aot/variants.py's candidate grids), launched
// with cubins of the same launch ABI it has: the launcher's handling of entries the shipped table
// lacks, checked over tests/fake_cuda's driver.
void launch_with_table(const FlashParams& p, const std::vector<py::dict>& rows, uintptr_t stream) {
  const DeviceKernels* loaded = nullptr;
  check(kernels_for_stream(reinterpret_cast<CUstream>(stream), &loaded));
  std::vector<std::string> names;
  names.reserve(rows.size());
  std::vector<KernelEntry> entries;
  entries.reserve(rows.size());
  DeviceKernels dk = *loaded;  // the context, SMs and counters
  dk.kernels.clear();
  for (const py::dict& r : rows) {
    names.push_back(r["variant"].cast<std::string>());
    entries.push_back(entry_from_row(r, loaded->table_arch, names.back()));
    const std::string of = r["cubin_of"].cast<std::string>();
    auto src = std::find_if(loaded->kernels.begin(), loaded->kernels.end(),
                            [&](const LoadedKernel& k) { return of == k.entry->variant_name; });
    if (src == loaded->kernels.end()) throw std::invalid_argument("cubin_of: no variant " + of + " in this build");
    KernelEntry& e = entries.back();
    e.kernel_name = src->entry->kernel_name;
    e.num_warps = src->entry->num_warps;  // the cubin's block (a row may give the tile's config warps)
    e.shared = src->entry->shared;
    e.cubin = src->entry->cubin;
    e.cubin_end = src->entry->cubin_end;
    std::copy(std::begin(src->entry->tma), std::end(src->entry->tma), std::begin(e.tma));
    dk.kernels.push_back({&e, src->function});
  }
  run_on_stream(stream, [&](CUstream s, const WorkspaceFn& ws) { return launch_flash_cuda_with(p, dk, s, ws); });
}

// A GroupQueryAttention call from a dict: its dims (dtype by name), attributes, total_sequence_length,
// present_len and device pointers as integers (absent: null).
GqaCall gqa_call_from(const py::dict& c) {
  auto i64 = [&](const char* k, int64_t fallback) { return c.contains(k) ? c[k].cast<int64_t>() : fallback; };
  auto ptr = [&](const char* k) { return reinterpret_cast<void*>(static_cast<uintptr_t>(i64(k, 0))); };
  GqaCall g;
  const std::string dt = c["dtype"].cast<std::string>();
  g.dims.dtype = dt == "float32" ? DType::kFloat32 : (dt == "float16" ? DType::kFloat16 : DType::kBFloat16);
  g.dims.batch = i64("batch", 1); g.dims.sq = i64("sq", 1); g.dims.hq = i64("hq", 1); g.dims.hkv = i64("hkv", 1);
  g.dims.d = i64("d", 64);
  g.dims.packed = i64("packed", 0) != 0;
  g.dims.past_len = i64("past_len", 0);
  g.dims.has_past = i64("past_key", 0) != 0;
  g.dims.rotary_dim = i64("rotary_dim", 0);
  g.dims.max_position = i64("max_position", 0);
  g.dims.has_position_ids = i64("position_ids", 0) != 0;
  g.attrs.num_heads = g.dims.hq; g.attrs.kv_num_heads = g.dims.hkv;
  g.attrs.scale = c.contains("scale") ? c["scale"].cast<float>() : 0.0f;
  g.attrs.softcap = c.contains("softcap") ? c["softcap"].cast<float>() : 0.0f;
  g.attrs.local_window_size = i64("local_window_size", -1);
  g.attrs.do_rotary = g.dims.rotary_dim > 0;
  g.attrs.rotary_interleaved = i64("rotary_interleaved", 0);
  g.attrs.causal = i64("causal", 1);
  g.attrs.smooth_softmax = i64("smooth_softmax", -1);
  g.attrs.sliding_window_cache = i64("sliding_window_cache", 0);
  g.dims.windowed = g.attrs.sliding_window_cache != 0;
  g.query = ptr("query"); g.key = ptr("key"); g.value = ptr("value");
  g.past_key = ptr("past_key"); g.past_value = ptr("past_value");
  g.seqlens_k = static_cast<const int32_t*>(ptr("seqlens_k"));
  g.total_sequence_length = static_cast<int32_t>(i64("total_sequence_length", 1));
  g.cos_cache = ptr("cos_cache"); g.sin_cache = ptr("sin_cache");
  g.position_ids = static_cast<const int64_t*>(ptr("position_ids"));
  g.output = ptr("output"); g.present_key = ptr("present_key"); g.present_value = ptr("present_value");
  g.present_len = i64("present_len", 0);
  g.head_sink = ptr("head_sink");
  g.q_norm = ptr("q_norm_weight"); g.k_norm = ptr("k_norm_weight");
  g.dims.qk_norm = g.q_norm != nullptr;
  g.attrs.qk_norm_epsilon = c.contains("qk_norm_epsilon") ? c["qk_norm_epsilon"].cast<float>() : 1e-6f;
  return g;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "ort_flash native helpers (kernel table, direct kernel entries)";
  {  // the table (and cubins) come from libort_flash.so: one from this build, or none
    size_t count = 0, entry_size = 0;
    const char* version = nullptr;
    OrtFlashKernelTable(&count, &entry_size, &version);
    if (entry_size != sizeof(KernelEntry)) {
      throw py::import_error("ort_flash._C found a libort_flash.so from another build (kernel table entries of " +
                             std::to_string(entry_size) + " bytes, not " + std::to_string(sizeof(KernelEntry)) +
                             "): reinstall ort_flash");
    }
  }
  m.def("kernels", &kernels, "The AOT-compiled kernels in this build, one dict per (variant, arch).");
  m.def("triton_version", [] { return std::string(kernel_table_triton_version()); });

  // Every value of the contract's enums (contract.gen.h): dtypes by their ONNX names, the others by
  // aot/'s codes.
  auto dtypes = py::enum_<DType>(m, "DType");
  for (int i = 0; code_name(static_cast<DType>(i)); ++i) dtypes.value(dtype_name(static_cast<DType>(i)), static_cast<DType>(i));
  auto masks = py::enum_<MaskKind>(m, "MaskKind");
  for (int i = 0; code_name(static_cast<MaskKind>(i)); ++i) masks.value(code_name(static_cast<MaskKind>(i)), static_cast<MaskKind>(i));
  auto precisions = py::enum_<Fp32Precision>(m, "Fp32Precision");
  for (int i = 0; code_name(static_cast<Fp32Precision>(i)); ++i) {
    precisions.value(code_name(static_cast<Fp32Precision>(i)), static_cast<Fp32Precision>(i));
  }

  py::class_<FlashParams>(m, "FlashParams")
      .def(py::init<>())
      .def_readwrite("dtype", &FlashParams::dtype)
      .def_property("q", [](const FlashParams& p) { return ptr_get(p.q); }, [](FlashParams& p, uintptr_t v) { p.q = reinterpret_cast<const void*>(v); })
      .def_property("k", [](const FlashParams& p) { return ptr_get(p.k); }, [](FlashParams& p, uintptr_t v) { p.k = reinterpret_cast<const void*>(v); })
      .def_property("v", [](const FlashParams& p) { return ptr_get(p.v); }, [](FlashParams& p, uintptr_t v) { p.v = reinterpret_cast<const void*>(v); })
      .def_property("y", [](const FlashParams& p) { return ptr_get(p.y); }, [](FlashParams& p, uintptr_t v) { p.y = reinterpret_cast<void*>(v); })
      .def_property("lse", [](const FlashParams& p) { return ptr_get(p.lse); }, [](FlashParams& p, uintptr_t v) { p.lse = reinterpret_cast<float*>(v); })
      .def_property("mask", [](const FlashParams& p) { return ptr_get(p.mask); }, [](FlashParams& p, uintptr_t v) { p.mask = reinterpret_cast<const void*>(v); })
      .def_property("seqlens_k", [](const FlashParams& p) { return ptr_get(p.seqlens_k); }, [](FlashParams& p, uintptr_t v) { p.seqlens_k = reinterpret_cast<const int64_t*>(v); })
      .def_property("key_bound", [](const FlashParams& p) { return ptr_get(p.key_bound); }, [](FlashParams& p, uintptr_t v) { p.key_bound = reinterpret_cast<const int64_t*>(v); })
      .def_property("rotary_cos", [](const FlashParams& p) { return ptr_get(p.rotary_cos); }, [](FlashParams& p, uintptr_t v) { p.rotary_cos = reinterpret_cast<const void*>(v); })
      .def_property("rotary_sin", [](const FlashParams& p) { return ptr_get(p.rotary_sin); }, [](FlashParams& p, uintptr_t v) { p.rotary_sin = reinterpret_cast<const void*>(v); })
      .def_readwrite("rotary_half", &FlashParams::rotary_half).def_readwrite("max_position", &FlashParams::max_position)
      .def_readwrite("batch", &FlashParams::batch).def_readwrite("hq", &FlashParams::hq)
      .def_readwrite("hkv", &FlashParams::hkv).def_readwrite("sq", &FlashParams::sq)
      .def_readwrite("skv", &FlashParams::skv).def_readwrite("d", &FlashParams::d)
      .def_readwrite("dv", &FlashParams::dv)
      .def_property("q_stride", [](const FlashParams& p) { return std::vector<int64_t>(p.q_stride, p.q_stride + 3); }, [](FlashParams& p, const std::vector<int64_t>& v) { std::copy_n(v.begin(), 3, p.q_stride); })
      .def_property("k_stride", [](const FlashParams& p) { return std::vector<int64_t>(p.k_stride, p.k_stride + 3); }, [](FlashParams& p, const std::vector<int64_t>& v) { std::copy_n(v.begin(), 3, p.k_stride); })
      .def_property("v_stride", [](const FlashParams& p) { return std::vector<int64_t>(p.v_stride, p.v_stride + 3); }, [](FlashParams& p, const std::vector<int64_t>& v) { std::copy_n(v.begin(), 3, p.v_stride); })
      .def_property("y_stride", [](const FlashParams& p) { return std::vector<int64_t>(p.y_stride, p.y_stride + 3); }, [](FlashParams& p, const std::vector<int64_t>& v) { std::copy_n(v.begin(), 3, p.y_stride); })
      .def_readwrite("mask_kind", &FlashParams::mask_kind)
      .def_property("mask_stride", [](const FlashParams& p) { return std::vector<int64_t>(p.mask_stride, p.mask_stride + 4); }, [](FlashParams& p, const std::vector<int64_t>& v) { std::copy_n(v.begin(), 4, p.mask_stride); })
      .def_readwrite("mask_len", &FlashParams::mask_len)
      .def_readwrite("scale", &FlashParams::scale).def_readwrite("softcap", &FlashParams::softcap)
      .def_readwrite("causal", &FlashParams::causal)
      .def_readwrite("window_left", &FlashParams::window_left).def_readwrite("window_right", &FlashParams::window_right)
      .def_readwrite("offset", &FlashParams::offset)
      .def_readwrite("fp32_precision", &FlashParams::fp32_precision)
      .def_readwrite("fp8", &FlashParams::fp8);

  m.def("run_cpu", [](const FlashParams& p) {
    py::gil_scoped_release release;
    run_flash_cpu(p, threads_parallel_for);
  }, "Runs the CPU kernel on host pointers.");
  m.def("cpu_isa", [] { return std::string(cpu_flash_isa()); },
        "The CPU kernel build in use: baseline, avx2 or avx512 (ORT_FLASH_CPU_ISA forces one).");
  m.def("prepare_device", [](int device) {
    const DeviceKernels* dk = nullptr;
    check(prepare_device(device, &dk));
    return py::make_tuple(dk->arch, dk->table_arch, dk->sm_count, dk->kernels.size());
  }, "Loads the kernels into the device's primary context: (arch, compiled arch, SMs, kernels).");
  m.def("variant_for", [](const FlashParams& p) {
    VariantKey k{};
    check(select_variant(p, &k));
    return py::make_tuple(dtype_name(k.dtype), k.head_dim, k.even_d, code_name(k.mask), k.extras,
                          k.mask_keys);
  });
  m.def("launch_plan", [](const FlashParams& p, int device) {
    const DeviceKernels* dk = nullptr;
    check(prepare_device(device, &dk));
    LaunchPlan plan;
    check(plan_flash_cuda(p, *dk, true, &plan));
    return py::make_tuple(code_name(plan.kind), plan.num_splits, plan.workspace_bytes, plan.fused_merge);
  }, py::arg("p"), py::arg("device") = 0,
     "How run_cuda / the op would run `p`: (\"fwd\", \"fwd_tma\" or \"decode\", KV splits, "
     "workspace bytes, whether the split kernel merges the splits itself rather than the combine "
     "kernel).");
  m.def("launch_variant", [](const FlashParams& p, int device) {
    const DeviceKernels* dk = nullptr;
    check(prepare_device(device, &dk));
    LaunchPlan plan;
    check(plan_flash_cuda(p, *dk, true, &plan));
    return plan.first() ? std::string(plan.first()->variant_name) : std::string();
  }, py::arg("p"), py::arg("device") = 0,
     "The compiled variant run_cuda / the op would launch first for `p` (\"\" if none is built).");
  m.def("launch_pdl", [](const FlashParams& p, int device) {
    const DeviceKernels* dk = nullptr;
    check(prepare_device(device, &dk));
    LaunchPlan plan;
    check(plan_flash_cuda(p, *dk, true, &plan));
    return plan.main.pdl;
  }, py::arg("p"), py::arg("device") = 0,
     "Whether run_cuda / the op would launch `p`'s first kernel with programmatic dependent launch "
     "(the decode kernel on sm_90+, unless ORT_FLASH_PDL=0).");
  m.def("plan_with_table", &plan_with_table, py::arg("p"), py::arg("rows"), py::arg("arch") = 90,
        py::arg("sm_count") = 132, py::arg("tensor_maps") = true,
        "How the dispatcher would run `p` on a GPU of `arch` with `sm_count` SMs whose table holds "
        "`rows` (dicts: variant, dtype, head_dim, even_d, mask, extras, precision, kind, mask_keys "
        "as aot/variants.py codes; num_warps, block_m, block_n, tile_causal, tile_min_len, pdl, "
        "tile_max_len): "
        "(kind, the variant it launches, its fallback or second kernel, KV splits). Needs no GPU.");
  m.def("merge_with_table", &merge_with_table, py::arg("p"), py::arg("rows"), py::arg("arch") = 90,
        py::arg("sm_count") = 132,
        "plan_with_table's (kind, the variant it launches, KV splits) and whether the split kernel "
        "merges the splits itself rather than the combine kernel (launch_plan's fused merge). Needs no GPU.");
  m.def("fwd_grid", [](const FlashParams& p, int block_m, int persistent, int sm_count) {
    KernelEntry e{};
    e.block_m = block_m;
    e.persistent = persistent;
    const FwdGrid g = fwd_grid(e, p, sm_count);
    return py::make_tuple(g.x, g.y, g.tiles);
  }, py::arg("p"), py::arg("block_m"), py::arg("persistent") = 0, py::arg("sm_count") = 132,
     "The grid a forward kernel of tile block_m (persistent: CTAs per SM of a persistent kernel, "
     "0 none) is launched with for `p` on `sm_count` SMs, and the query tiles of the call: "
     "(grid x, grid y, tiles). Needs no GPU.");
  m.def("run_cuda", [](const FlashParams& p, uintptr_t stream) {
    run_on_stream(stream, [&](CUstream s, const WorkspaceFn& ws) { return launch_flash_cuda(p, s, ws); });
  }, "Launches the CUDA kernels on device pointers, on `stream` (a CUstream as int; 0 = legacy default).");
  m.def("run_gqa_cuda", [](const py::dict& call, uintptr_t stream) {
    const GqaCall c = gqa_call_from(call);
    run_on_stream(stream, [&](CUstream s, const WorkspaceFn& ws) { return run_gqa_cuda("test", c, s, ws); });
  }, py::arg("call"), py::arg("stream"),
     "GroupQueryAttention's CUDA path (cpp/gqa_launch.h) on device pointers, as the op on the CUDA EP "
     "runs it: `call` a dict of GqaCall's dims, attributes and pointers (tests, over tests/fake_cuda).");
  m.def("gqa_cuda_ready", [](int device, const std::string& dtype, bool sinks, bool windowed) {
    check(gqa_cuda_ready(device, dtype == "float32" ? DType::kFloat32
                                                    : (dtype == "float16" ? DType::kFloat16 : DType::kBFloat16),
                         sinks, windowed));
  }, py::arg("device"), py::arg("dtype"), py::arg("sinks") = false, py::arg("windowed") = false,
     "What the op's CUDA kernel creation checks: the device's kernels load and the GQA prepare kernels exist "
     "(with `sinks`, the attention-sink rescale kernel too; with `windowed`, the windowed cache's compaction and shift).");
  m.def("launch_with_table", &launch_with_table, py::arg("p"), py::arg("rows"), py::arg("stream"),
        "run_cuda over a table of `rows` (plan_with_table's, each with \"cubin_of\": the variant of "
        "this build whose cubin it launches) instead of the build's (tests, over tests/fake_cuda).");
}
