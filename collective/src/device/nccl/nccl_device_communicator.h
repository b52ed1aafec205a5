// The device Communicator over NCCL: one ncclComm_t per epoch.
//
// Construction picks the device (device_config.h), exchanges the epoch's unique id
// (rank 0 makes it; IdExchange carries it) and runs a non-blocking init polled under
// the deadline and the abort signal (nccl_handle.h). Each collective validates its
// arguments, launches on the caller's stream, then waits for that stream.
#pragma once

#include "device/device_backend.h"

#include <span>

namespace elasticrun::collective {

std::unique_ptr<device::Communicator> make_nccl_communicator(const DeviceCommConfig& cfg, const IdExchange& exchange,
                                                             std::shared_ptr<AbortSignal> abort);
// The survivors' communicator when an epoch only removed the ranks `excluded` (ranks of
// `old`, which must be an NCCL communicator that was not aborted); `old` is spent after.
// Every survivor calls it. Ranks keep their relative order, as the launcher assigns them.
std::unique_ptr<device::Communicator> shrink_nccl_communicator(device::Communicator& old,
                                                               std::span<const int> excluded);
// Aborts `c`'s NCCL communicator (ncclCommAbort) if it is one.
void nccl_discard(device::Communicator& c);
// True if `c` is an NCCL communicator whose handle is alive (not aborted), so it can shrink.
bool nccl_can_shrink(device::Communicator& c);
device::Memory nccl_memory_of(const void* p);
bool nccl_available(std::string* why);
// Selects this worker's device (device_config.h) and makes it current; its index.
int nccl_use_device(int local_rank);
// cudaGetDeviceCount, throwing Error("no CUDA device: <error>") when it fails or finds none.
int nccl_device_count();

}  // namespace elasticrun::collective
