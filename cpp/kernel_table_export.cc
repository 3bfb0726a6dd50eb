// libort_flash.so's second export (custom_op_library.lds): the AOT kernel table, for the pybind11
// module, so that the cubins are embedded in the library only.
#include "kernel_table.h"

extern "C" __attribute__((visibility("default"))) const ort_flash::KernelEntry* OrtFlashKernelTable(
    size_t* count, size_t* entry_size, const char** triton_version) {
  *entry_size = sizeof(ort_flash::KernelEntry);
  *triton_version = ort_flash::kernel_table_triton_version();
  return ort_flash::kernel_table(count);
}
