// The key-value exchange a communicator uses to find its peers.
//
// In a job it is the rendezvous server (rendezvous_client.h); in unit tests an
// in-memory map shared by N threads (memory_store.h). Keys are scoped by the caller
// (the communicator prefixes them with its epoch), values are opaque bytes.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace elasticrun::collective {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::uint8_t>;

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Blocks until `key` is set. Throws TimeoutError past `deadline`, WorkersFailed
  // if the epoch is aborted meanwhile.
  virtual Bytes get(const std::string& key, Clock::time_point deadline) = 0;
};

}  // namespace elasticrun::collective
