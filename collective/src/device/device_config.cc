#include "device/device_config.h"

#include "common/env.h"

#include <elasticrun/types.hpp>

#include <string>

namespace elasticrun::collective {

int select_device(int local_rank, int device_count, std::optional<int> forced, std::optional<int> hint) {
  if (device_count <= 0) throw Error("no CUDA device is visible (check CUDA_VISIBLE_DEVICES)");
  if (forced) {
    if (*forced >= device_count)
      throw Error(std::string(env::kDevice) + "=" + std::to_string(*forced) + " but only " +
                  std::to_string(device_count) + " device(s) are visible");
    return *forced;
  }
  if (hint) return *hint % device_count;
  if (local_rank < 0) throw Error("select_device: negative local rank " + std::to_string(local_rank));
  return local_rank % device_count;
}

int select_device_from_env(int local_rank, int device_count) {
  return select_device(local_rank, device_count, settings::device(), settings::device_hint());
}

}  // namespace elasticrun::collective
