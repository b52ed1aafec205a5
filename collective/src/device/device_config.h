// Which GPU a worker uses.
//
// Device selection follows CUDA_VISIBLE_DEVICES semantics: device numbers are
// indices into the devices this process can see. In order:
//   - ELASTICRUN_DEVICE=N, the user's choice, forces device N; out of range is an error.
//   - ELASTICRUN_DEVICE_HINT, the daemon's slot % GPUs (daemon/device_hint.h), stable
//     across epochs, taken modulo the device count: the daemon counts the host's GPUs,
//     the worker may see fewer, and a guess is no reason to fail.
//   - otherwise `local_rank % device_count`.
// NCCL (since 2.5) refuses two ranks of one communicator on the same GPU ("Duplicate GPU
// detected", ncclInvalidUsage, which surfaces as Error), so a GPU job needs at most as
// many slots per host as GPUs.
#pragma once

#include "control/settings.h"

#include <optional>

namespace elasticrun::collective {

// The device for `local_rank` among `device_count` visible ones, honouring `forced`
// and then `hint` (settings::device and settings::device_hint). Throws Error when no
// device is visible or `forced` is out of range.
int select_device(int local_rank, int device_count, std::optional<int> forced, std::optional<int> hint = {});

// select_device with the forced device and the hint from the settings.
int select_device_from_env(int local_rank, int device_count);

}  // namespace elasticrun::collective
