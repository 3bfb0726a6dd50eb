#include "launch_switches.h"

#include <cstdlib>
#include <cstring>

namespace ort_flash {
namespace {

// -1 unless the variable is exactly "0" or "1".
int tristate(const char* e) {
  if (e && std::strcmp(e, "0") == 0) return 0;
  if (e && std::strcmp(e, "1") == 0) return 1;
  return -1;
}

// A count >= 0, or -1 when unset, empty or not a whole count.
int64_t count_or_unset(const char* e) {
  if (!e || !*e) return -1;
  char* end = nullptr;
  const long long n = std::strtoll(e, &end, 10);
  return (end && *end == 0 && n >= 0) ? static_cast<int64_t>(n) : -1;
}

LaunchSwitches read_switches() {
  LaunchSwitches s;
  s.decode_splits = count_or_unset(std::getenv("ORT_FLASH_DECODE_SPLITS"));
  s.fused_combine = tristate(std::getenv("ORT_FLASH_FUSED_COMBINE"));
  s.pdl = tristate(std::getenv("ORT_FLASH_PDL")) != 0;
  s.tma = tristate(std::getenv("ORT_FLASH_TMA")) != 0;
  s.gluon = tristate(std::getenv("ORT_FLASH_GLUON"));
  s.key_bound = tristate(std::getenv("ORT_FLASH_KEY_BOUND")) != 0;
  s.rotary_on_load = tristate(std::getenv("ORT_FLASH_ROTARY_ON_LOAD")) != 0;
  s.window_shift = tristate(std::getenv("ORT_FLASH_WINDOW_SHIFT")) != 0;
  return s;
}

}  // namespace

const LaunchSwitches& launch_switches() {
  static const LaunchSwitches s = read_switches();
  return s;
}

}  // namespace ort_flash
