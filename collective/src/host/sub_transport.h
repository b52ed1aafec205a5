// A Transport over a subset of another's ranks: sub-rank i is parent rank members[i].
// The hierarchical allreduce runs the UCX algorithms among the hosts' leaders with
// it (space 0: its collectives take sequence numbers of the parent's); a process set's
// communicator runs every collective with it, in a space of its own (Transport's tag
// layout), with sequence numbers of its own.
#pragma once

#include "host/transport.h"

#include <vector>

namespace elasticrun::collective {

class SubTransport final : public Transport {
 public:
  // `members` in sub-rank order; must contain the parent's own rank. `space` in
  // 0..kMaxSpace.
  SubTransport(Transport& parent, std::vector<int> members, int space = 0)
      : parent_(parent), members_(std::move(members)), space_(space) {
    for (int i = 0; i < static_cast<int>(members_.size()); ++i)
      if (members_[i] == parent_.rank()) rank_ = i;
  }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  bool member() const { return rank_ >= 0; }
  Request isend(int peer, std::uint64_t tag, const void* buf, std::size_t bytes) override {
    return parent_.isend(members_[peer], in_space(tag, space_), buf, bytes);
  }
  Request irecv(int peer, std::uint64_t tag, void* buf, std::size_t bytes) override {
    return parent_.irecv(members_[peer], in_space(tag, space_), buf, bytes);
  }
  void wait(std::span<Request> reqs, Clock::time_point deadline, const char* what) override {
    parent_.wait(reqs, deadline, what);
  }
  void cancel_all() override { parent_.cancel_all(); }
  bool sleeps() const override { return parent_.sleeps(); }
  void sleep_at_once(bool yes) override { parent_.sleep_at_once(yes); }

 private:
  Transport& parent_;
  std::vector<int> members_;
  int space_ = 0;
  int rank_ = -1;
};

}  // namespace elasticrun::collective
