// The narrow point-to-point interface the collective algorithms are written against.
//
// Algorithms post tagged sends and receives and wait on them; they never see a
// backend type. Matching is by (source rank, tag): the backend folds the sender's
// rank into the wire tag, so a tag only has to be unique among one pair's messages
// that can be in flight at the same time. Every wait has a deadline and returns
// early, with the control plane's typed error, when the epoch is aborted.
#pragma once

#include "control/store.h"

#include <cstddef>
#include <cstdint>
#include <span>

namespace elasticrun::collective {

class Transport {
 public:
  // A posted operation. `handle` is the backend's; null means complete.
  struct Request {
    void* handle = nullptr;
    int peer = -1;
    bool recv = false;
    bool done() const { return handle == nullptr; }
  };

  // Tags carry the collective's sequence number and a step within it, and above them
  // the space of a subset communicator (a process set: SubTransport adds it), so that
  // the collectives of two sets sharing a pair of ranks never match each other's
  // messages. A backend keeps kTagBits of a tag. Sequence numbers wrap: a pair's
  // messages of one tag match in the order they were sent, and no rank runs 2^14
  // collectives ahead of a peer it exchanges with.
  static constexpr int kStepBits = 24;
  static constexpr int kSeqBits = 14;
  static constexpr int kSpaceBits = 6;
  static constexpr int kTagBits = kSpaceBits + kSeqBits + kStepBits;
  static constexpr int kMaxSpace = (1 << kSpaceBits) - 1;
  static std::uint64_t make_tag(std::uint64_t seq, std::uint64_t step) {
    return ((seq & ((1ull << kSeqBits) - 1)) << kStepBits) | (step & ((1ull << kStepBits) - 1));
  }
  static std::uint64_t in_space(std::uint64_t tag, int space) {
    return tag | (static_cast<std::uint64_t>(space) << (kSeqBits + kStepBits));
  }

  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // The buffer must stay valid (and, for sends, unchanged) until the request completes.
  virtual Request isend(int peer, std::uint64_t tag, const void* buf, std::size_t bytes) = 0;
  virtual Request irecv(int peer, std::uint64_t tag, void* buf, std::size_t bytes) = 0;

  // Waits until every request completes and marks them done. On a deadline
  // (TimeoutError naming `what` and the first peer still pending) or an abort
  // (WorkersFailed / HostsUpdated) it cancels every outstanding request of this
  // transport before throwing. A receive longer than its buffer is a ProtocolError.
  virtual void wait(std::span<Request> reqs, Clock::time_point deadline, const char* what) = 0;
  void wait(Request& r, Clock::time_point deadline, const char* what) { wait(std::span(&r, 1), deadline, what); }

  // Cancels every outstanding request (used when a collective fails midway).
  virtual void cancel_all() = 0;
  // Whether a wait with nothing to do ends up asleep (blocking progress: more ranks than
  // cores), and, for the waits from here on, whether it sleeps at once instead of first
  // yielding the core for a while (UcxTransport::Options::yield_window). Yielding hands
  // the core to the rank a wait is for when both share it; where the wait is for a
  // network's latency it only burns the cores the data needs. The tuner measures both.
  virtual bool sleeps() const { return false; }
  virtual void sleep_at_once(bool) {}
  // Moves what is in flight along without waiting: a request can complete on one side
  // while the transport still owes its peer a message (UCX's rendezvous acknowledgement
  // after a large receive), which only progress sends. Waits that are not the
  // transport's own (the shared-memory ones) call it, so that a peer waiting for that
  // message is not left waiting on a rank that waits for the peer in shared memory.
  virtual void progress() {}
};

}  // namespace elasticrun::collective
