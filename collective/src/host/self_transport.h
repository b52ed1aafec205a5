// The transport of a world of one.
#pragma once

#include "host/transport.h"

#include <elasticrun/elasticrun.hpp>

#include <span>
#include <string>

namespace elasticrun::collective {

// A world of one has no peer: every collective is a local copy or nothing. It gets no
// UCX context (whose start-up is about 12 ms of a one-rank job's); an algorithm that
// tried to reach a peer would get an error, not a hang.
class SelfTransport final : public Transport {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Request isend(int peer, std::uint64_t, const void*, std::size_t) override { return none("send to", peer); }
  Request irecv(int peer, std::uint64_t, void*, std::size_t) override { return none("receive from", peer); }
  void wait(std::span<Request> reqs, Clock::time_point, const char*) override {
    if (!reqs.empty()) throw Error("self transport: nothing to wait for in a world of one");
  }
  void cancel_all() override {}

 private:
  static Request none(const char* what, int peer) {
    throw Error(std::string("self transport: ") + what + " rank " + std::to_string(peer) + " in a world of one");
  }
};

}  // namespace elasticrun::collective
