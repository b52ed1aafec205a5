// Distributing one epoch's NCCL unique id through the rendezvous store.
//
// Rank 0 makes the id (ncclGetUniqueId: it opens the bootstrap socket, so it needs no
// GPU but does need NCCL) and publishes its bytes under `<scope>nccl/id`; every other
// rank fetches them, bounded by the deadline and interrupted by the epoch's abort
// (the Store's get() does both). Every communicator has a scope of its own: the epoch
// and how many device communicators this context created in it before (DeviceScopes).
// A key reused within an epoch would hand a fetcher the previous communicator's id,
// and ranks holding different ids wait in init until the timeout.
//
// Kept free of NCCL types so the exchange is testable without NCCL or a GPU.
#pragma once

#include "control/store.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace elasticrun::collective {

inline constexpr std::size_t kNcclIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES; checked in nccl_handle.cc

std::string nccl_id_key(const std::string& scope);

// The scopes of one context's device communicators: "e<epoch>/d<n>/", n counting the
// ones created earlier in the same epoch. Creating a communicator is collective, so the
// ranks of an epoch count alike; the count restarts with each epoch, so a rank that
// joined later counts like those that were there before.
class DeviceScopes {
 public:
  // `join`: the context's join of the epoch (msg::JoinOk::join_seq): a later one has
  // scopes of its own.
  std::string next(std::uint64_t epoch, std::uint32_t join = 1);

 private:
  std::uint64_t epoch_ = 0;
  std::uint32_t join_ = 1;
  std::uint64_t created_ = 0;
};

// Rank 0 calls `make_id` and publishes its result; the others fetch it. Returns the id
// bytes on every rank. Throws ProtocolError if the published value has the wrong size,
// TimeoutError / WorkersFailed from the store.
Bytes exchange_nccl_id(Store& store, const std::string& scope, int rank, const std::function<Bytes()>& make_id,
                       Clock::time_point deadline);

// Gives every rank rank 0's unique id: rank 0 calls make_id. Bounded by the deadline.
using IdExchange = std::function<Bytes(const std::function<Bytes()>& make_id, Clock::time_point deadline)>;

// exchange_nccl_id through `store` under `<scope>nccl/id`.
IdExchange store_id_exchange(std::shared_ptr<Store> store, std::string scope, int rank);

}  // namespace elasticrun::collective
