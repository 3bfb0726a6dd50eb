// The pybind11 module's kernel table: the one in libort_flash.so (linked, found beside the module),
// where the cubins are. pybind_module.cc checks at import that the entry layouts agree.
#include "kernel_table.h"

namespace ort_flash {

const KernelEntry* kernel_table(size_t* count) {
  size_t entry_size = 0;
  const char* version = nullptr;
  return OrtFlashKernelTable(count, &entry_size, &version);
}

const char* kernel_table_triton_version() {
  size_t count = 0, entry_size = 0;
  const char* version = nullptr;
  OrtFlashKernelTable(&count, &entry_size, &version);
  return version;
}

}  // namespace ort_flash
