// Distributing one epoch's NCCL unique id through the rendezvous store.
//
// Rank 0 makes the id (ncclGetUniqueId: it opens the bootstrap socket, so it needs no
// GPU but does need NCCL) and publishes its bytes under `<scope>nccl/id`; every other
// rank fetches them, bounded by the deadline and interrupted by the epoch's abort
// (the Store's get() does both). A new epoch has a new scope, hence a new id: a
// communicator that grows always starts from a fresh id.
//
// Kept free of NCCL types so the exchange is testable without NCCL or a GPU.
#pragma once

#include "store.h"

#include <cstddef>
#include <functional>
#include <string>

namespace elasticrun::collective {

inline constexpr std::size_t kNcclIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES; checked in nccl_comm.cc

std::string nccl_id_key(const std::string& scope);

// Rank 0 calls `make_id` and publishes its result; the others fetch it. Returns the id
// bytes on every rank. Throws ProtocolError if the published value has the wrong size,
// TimeoutError / WorkersFailed from the store.
Bytes exchange_nccl_id(Store& store, const std::string& scope, int rank, const std::function<Bytes()>& make_id,
                       Clock::time_point deadline);

}  // namespace elasticrun::collective
