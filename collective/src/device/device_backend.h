// The device backend: what the library needs from the code that runs collectives on
// device memory, and the one seam between the rest of the library and NCCL.
//
// Meson compiles exactly one implementation (option `nccl`): with NCCL, device/nccl/
// (nccl_device_communicator.cc the communicators, cuda_device.cc the device queries,
// cuda_memory_ops.cc the State's copies); without it, device/no_backend.cc, whose
// communicator calls throw Error and whose memory is all host memory. No other file
// knows which one was built.
#pragma once

#include "control/abort_signal.h"
#include "control/settings.h"
#include "device/nccl_id_exchange.h"

#include <elasticrun/device.hpp>
#include <elasticrun/elastic.hpp>

#include <chrono>
#include <memory>
#include <span>
#include <string>

namespace elasticrun::collective {

struct DeviceCommConfig {
  int rank = 0, size = 1;
  int local_rank = 0;
  std::chrono::milliseconds timeout = settings::kDefaultCollectiveTimeout;  // per-operation deadline (init included)
  int device = -1;  // the CUDA device; -1: choose from ELASTICRUN_DEVICE / local_rank (device_config.h)
};

// Construction picks the device (device_config.h), exchanges the epoch's unique id (rank
// 0 makes it; `exchange` carries it) and runs a bounded init, interrupted by `abort`.
std::unique_ptr<device::Communicator> make_device_communicator(const DeviceCommConfig& cfg, const IdExchange& exchange,
                                                               std::shared_ptr<AbortSignal> abort);
// True if `c` is this backend's communicator and alive (not aborted), so it can shrink.
bool device_can_shrink(device::Communicator& c);
// Ends `c` at once (ncclCommAbort) rather than with a clean finalize.
void discard_device_communicator(device::Communicator& c);
// The survivors' communicator when an epoch only removed the ranks `excluded` (ranks of
// `old`, for which device_can_shrink holds); `old` is spent after. Every survivor calls
// it. Ranks keep their relative order, as the launcher assigns them.
std::unique_ptr<device::Communicator> shrink_device_communicator(device::Communicator& old,
                                                                 std::span<const int> excluded);
device::Memory device_memory_of(const void* p);
// Selects (device_config.h) and sets the current device for `local_rank`; its index.
int use_device(int local_rank);
// Whether a device can be used; if not, `why` says why.
bool device_available(std::string* why);
// NCCL_VERSION_CODE of the NCCL the backend was built with; 0 without the backend.
int device_backend_version();
// The elastic State's memory seam: CUDA copies with the backend, memcpy without.
std::shared_ptr<MemoryOps> device_memory_ops();

}  // namespace elasticrun::collective
