#include "device_config.h"

#include <elasticrun/types.hpp>

#include <cerrno>
#include <string>
#include <cstdlib>

namespace elasticrun::collective {

std::optional<int> parse_device(const char* value, const char* name) {
  if (!value || !*value) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  bool digit_first = *value >= '0' && *value <= '9';  // strtol would accept " 1" and "+1"
  long n = std::strtol(value, &end, 10);
  if (!digit_first || *end != '\0' || errno != 0 || n < 0 || n > 1 << 20)
    throw Error(std::string(name) + "='" + value + "' is not a device index (a non-negative integer)");
  return static_cast<int>(n);
}

int select_device(int local_rank, int device_count, std::optional<int> forced, std::optional<int> hint) {
  if (device_count <= 0) throw Error("no CUDA device is visible (check CUDA_VISIBLE_DEVICES)");
  if (forced) {
    if (*forced >= device_count)
      throw Error(std::string(kDeviceEnv) + "=" + std::to_string(*forced) + " but only " +
                  std::to_string(device_count) + " device(s) are visible");
    return *forced;
  }
  if (hint) return *hint % device_count;
  if (local_rank < 0) throw Error("select_device: negative local rank " + std::to_string(local_rank));
  return local_rank % device_count;
}

int select_device_from_env(int local_rank, int device_count) {
  return select_device(local_rank, device_count, parse_device(std::getenv(kDeviceEnv)),
                       parse_device(std::getenv(kDeviceHintEnv), kDeviceHintEnv));
}

}  // namespace elasticrun::collective
