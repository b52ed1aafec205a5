// Making device communicators: the one seam between the library and the NCCL backend.
//
// device_backend.cc is the only file that knows whether NCCL was built in
// (ELASTICRUN_HAVE_NCCL); everything else calls these functions.
#pragma once

#include "control/abort_signal.h"
#include "control/settings.h"
#include "control/store.h"

#include <elasticrun/device.hpp>
#include <elasticrun/elastic.hpp>

#include <chrono>
#include <functional>
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

// Gives every rank rank 0's unique id: rank 0 calls make_id. Bounded by the deadline.
using IdExchange = std::function<Bytes(const std::function<Bytes()>& make_id, Clock::time_point deadline)>;

// The exchange through a Store under `<scope>nccl/id` (nccl_id_exchange.h).
IdExchange store_id_exchange(std::shared_ptr<Store> store, std::string scope, int rank);

// Throws Error when the build has no NCCL backend.
std::unique_ptr<device::Communicator> make_device_communicator(const DeviceCommConfig& cfg, const IdExchange& exchange,
                                                               std::shared_ptr<AbortSignal> abort);
// ncclCommShrink seam (nccl_device_communicator.h); without NCCL can_shrink is false and
// shrink throws Error.
bool device_can_shrink(device::Communicator& c);
// Ends `c` at once (ncclCommAbort) rather than with a clean finalize; no-op without NCCL.
void discard_device_communicator(device::Communicator& c);
std::unique_ptr<device::Communicator> shrink_device_communicator(device::Communicator& old,
                                                                 std::span<const int> excluded);
device::Memory device_memory_of(const void* p);
// Selects (device_config.h) and sets the current device for `local_rank`; its index.
int use_device(int local_rank);
bool device_available(std::string* why);
// The elastic State's memory seam: CUDA copies with the backend, memcpy without.
std::shared_ptr<MemoryOps> device_memory_ops();
// memcpy only, every pointer host memory (what device_memory_ops() is without NCCL).
std::shared_ptr<MemoryOps> host_memory_ops();

}  // namespace elasticrun::collective
