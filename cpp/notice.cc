#include "notice.h"

#include <cstdio>
#include <mutex>
#include <set>

namespace ort_flash {

void notice_once(const std::string& message) {
  static std::mutex mutex;
  static auto* seen = new std::set<std::string>();  // never destroyed: notices may come during exit
  std::lock_guard<std::mutex> lock(mutex);
  if (!seen->insert(message).second) return;
  std::fprintf(stderr, "ort_flash: %s\n", message.c_str());
  std::fflush(stderr);
}

}  // namespace ort_flash
