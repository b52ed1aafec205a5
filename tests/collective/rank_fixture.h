// In-process N-rank fixture: N threads, each with its own UCX communicator, all
// finding each other through one MemoryStore.
#pragma once

#include "control/abort_signal.h"
#include "control/memory_store.h"
#include "host/host_communicator.h"

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace elasticrun::collective::testing {

struct World {
  explicit World(int n) : size(n), store(std::make_shared<MemoryStore>()) {
    for (int r = 0; r < n; ++r) aborts.push_back(std::make_shared<AbortSignal>());
  }
  int size;
  std::shared_ptr<MemoryStore> store;
  std::vector<std::shared_ptr<AbortSignal>> aborts;
};

// Runs fn(rank, comm) on world.size threads; rethrows the first exception after
// all threads have joined. cfg_of(rank) supplies everything but rank, size and scope.
inline void run_ranks(World& world, const std::function<HostCommConfig(int)>& cfg_of, const std::string& scope,
                      const std::function<void(int, elasticrun::Communicator&)>& fn) {
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < world.size; ++r) {
    threads.emplace_back([&, r] {
      try {
        HostCommConfig cfg = cfg_of(r);
        cfg.rank = r;
        cfg.size = world.size;
        cfg.scope = scope;
        auto comm = make_host_communicator(cfg, world.store, world.aborts[r]);
        fn(r, *comm);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// The same configuration for every rank.
inline void run_ranks(World& world, const HostCommConfig& base, const std::string& scope,
                      const std::function<void(int, elasticrun::Communicator&)>& fn) {
  run_ranks(world, [&](int) { return base; }, scope, fn);
}

}  // namespace elasticrun::collective::testing
