// The ranks of one host sharing a memory segment: data slots plus one flag per rank.
//
// When every rank of a communicator runs on one host, an allreduce through shared
// memory needs no messages at all: each rank copies its input into its own slot,
// the ranks reduce disjoint parts of the vector reading every slot, and each copies
// the result back. Synchronisation is a per-rank sequence number in its own cache
// line: arrive() publishes ours, wait_all() waits until every peer's reached ours.
// That is two cache-line handoffs where a message costs a protocol round trip, and
// there is no kernel in the data path (UCX's large messages go through
// process_vm_readv and page pinning).
//
// Waiting watches the abort signal and a deadline like every other wait in the
// library. Busy mode spins; blocking mode (more ranks than cores) spins briefly and
// then sleeps on the flag as a futex, and the arriving rank wakes sleepers only when
// the flag's waiter count says there are any.
//
// The segment lives in a file that rank 0 creates (in the worker's shared-memory
// directory, which the daemon removes if the worker dies) and unlinks as soon as
// every rank has mapped it, so nothing outlives the mappings.
#pragma once

#include "control/abort_signal.h"
#include "control/store.h"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace elasticrun::collective {

class ShmGroup {
 public:
  struct Options {
    int rank = 0, size = 1;
    int first_rank = 0;  // the job rank of group rank 0 (members are consecutive): what errors name
    std::size_t slot_bytes = 256 * 1024;  // one slot; rounded up to whole pages
    // Allreduce: vectors up to this many bytes take the one-barrier path. Part of
    // the group, not of each rank's settings: ranks that chose differently would
    // take different paths and read each other's slots at the wrong time.
    std::size_t small_max = 8 * 1024;
    bool blocking = false;                // sleep on a futex after a short spin
    std::string dir;                      // where rank 0 creates the file; empty: /dev/shm
    // A sleeping waiter looks at the abort signal and the deadline this often
    // (an arriving rank wakes it at once).
    std::chrono::nanoseconds sleep_slice = std::chrono::milliseconds(5);
    // Called while waiting (before each yield or sleep, and every 1024 spins): the
    // network transport's progress (Transport::progress), so that a rank waiting here
    // still sends what it owes a peer that waits for it over the network.
    std::function<void()> progress;
  };

  // Rank 0: creates the segment; `path()` and `token()` are what the others attach with.
  static std::unique_ptr<ShmGroup> create(const Options& o);
  // Other ranks: maps the segment made by create(), with rank 0's slot_bytes and
  // small_max in `o`. Throws Error if the file is not there, is not the size `o`
  // implies, or carries a different token or settings.
  static std::unique_ptr<ShmGroup> attach(const Options& o, const std::string& path, std::uint64_t token);

  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  int rank() const { return opts_.rank; }
  int size() const { return opts_.size; }
  std::size_t slot_bytes() const { return slot_; }
  std::size_t small_max() const { return opts_.small_max; }
  const std::string& path() const { return path_; }
  std::uint64_t token() const { return token_; }
  // Rank 0, once every rank has attached.
  void unlink();

  // Two sets of slots, used alternately by consecutive rounds: `input(set, q)` is
  // rank q's contribution, `result(set)` the reduced vector.
  std::byte* input(int set, int q) const;
  std::byte* result(int set) const;
  // Rank q's slot for inputs of at most kTinyBytes, in the cache line of its flag.
  static constexpr std::size_t kTinyBytes = 24;
  std::byte* tiny(int set, int q) const;

  // Barrier halves. arrive() publishes this rank's next sequence number; wait_all()
  // returns once every rank has arrived at it. Throws the abort signal's error
  // or TimeoutError (naming `what` and the rank waited for) past `deadline`.
  void arrive();
  void wait_all(Clock::time_point deadline, const AbortSignal& abort, const char* what);
  void barrier(Clock::time_point deadline, const AbortSignal& abort, const char* what) {
    arrive();
    wait_all(deadline, abort, what);
  }

  // The round counter, kept here so that consecutive collectives alternate sets.
  int next_set() { return static_cast<int>(round_++ & 1); }

 private:
  struct Flag;
  ShmGroup(const Options& o, std::size_t slot, std::byte* base, std::size_t bytes, std::string path,
           std::uint64_t token);
  Flag& flag(int q) const;
  void wait_for(int q, std::uint32_t target, Clock::time_point deadline, const AbortSignal& abort,
                const char* what);

  Options opts_;
  std::size_t slot_;
  std::byte* base_;
  std::size_t bytes_;
  std::string path_;
  std::uint64_t token_;
  std::uint32_t seq_ = 0;
  std::uint64_t round_ = 0;
};

}  // namespace elasticrun::collective
