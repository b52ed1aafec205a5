// A Transport over a subset of another's ranks: sub-rank i is parent rank members[i].
// The hierarchical allreduce runs the UCX algorithms among the hosts' leaders with
// it, unchanged. Messages keep the parent's tags, so the caller gives the subset's
// collectives sequence numbers of their own.
#pragma once

#include "host/transport.h"

#include <vector>

namespace elasticrun::collective {

class SubTransport final : public Transport {
 public:
  // `members` in sub-rank order; must contain the parent's own rank.
  SubTransport(Transport& parent, std::vector<int> members) : parent_(parent), members_(std::move(members)) {
    for (int i = 0; i < static_cast<int>(members_.size()); ++i)
      if (members_[i] == parent_.rank()) rank_ = i;
  }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  bool member() const { return rank_ >= 0; }
  Request isend(int peer, std::uint64_t tag, const void* buf, std::size_t bytes) override {
    return parent_.isend(members_[peer], tag, buf, bytes);
  }
  Request irecv(int peer, std::uint64_t tag, void* buf, std::size_t bytes) override {
    return parent_.irecv(members_[peer], tag, buf, bytes);
  }
  void wait(std::span<Request> reqs, Clock::time_point deadline, const char* what) override {
    parent_.wait(reqs, deadline, what);
  }
  void cancel_all() override { parent_.cancel_all(); }

 private:
  Transport& parent_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace elasticrun::collective
