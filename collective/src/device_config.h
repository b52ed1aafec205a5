// Which GPU a worker uses, and the device backend's settings.
//
// Device selection follows CUDA_VISIBLE_DEVICES semantics: device numbers are
// indices into the devices this process can see. ELASTICRUN_DEVICE wins when set: the
// daemon sets it per worker to slot % GPUs (daemon/device_hint.h), stable across epochs,
// unless the user set it or CUDA_VISIBLE_DEVICES. Without it the worker takes device
// `local_rank % device_count`. NCCL (since 2.5) refuses two ranks
// of one communicator on the same GPU ("Duplicate GPU detected", ncclInvalidUsage, which
// surfaces as Error), so a GPU job needs at most as many slots per host as GPUs.
// ELASTICRUN_DEVICE=N forces device N (an index among the visible ones).
#pragma once

#include "common/env.h"

#include <optional>
#include <string>

namespace elasticrun::collective {

inline constexpr const char* kDeviceEnv = env::kDevice;

// Parses an ELASTICRUN_DEVICE value: a non-negative integer. Null or empty means
// unset. Throws Error naming the variable otherwise.
std::optional<int> parse_device(const char* value);

// The device for `local_rank` among `device_count` visible ones, honouring `forced`
// (from parse_device). Throws Error when no device is visible or `forced` is out of range.
int select_device(int local_rank, int device_count, std::optional<int> forced);

// select_device with the forced device read from the environment.
int select_device_from_env(int local_rank, int device_count);

}  // namespace elasticrun::collective
