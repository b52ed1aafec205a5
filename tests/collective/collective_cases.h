// What the collective tests share: a configuration by algorithm, the check of a result
// against the local reference (test_data.h), and one allreduce checked end to end.
#pragma once

#include "rank_fixture.h"
#include "test_data.h"

#include <chrono>
#include <stdexcept>
#include <string>

namespace elasticrun::collective::testing {

inline HostCommConfig config(Algorithm a) {
  HostCommConfig c;
  c.algorithm = a;
  c.timeout = std::chrono::seconds(60);
  return c;
}

#define CHECK_SAME(got, want, elem, ctx)                                 \
  do {                                                                   \
    std::string d = diff(got, want, elem);                               \
    if (!d.empty()) throw std::runtime_error(std::string(ctx) + ": " + d); \
  } while (0)

inline const char* name_of(Algorithm a) {
  switch (a) {
    case Algorithm::ring: return "ring/";
    case Algorithm::rd: return "rd/";
    case Algorithm::rhd: return "rhd/";
    case Algorithm::shm: return "shm/";
    case Algorithm::direct: return "direct/";
    case Algorithm::twoshot: return "twoshot/";
    default: return "auto/";
  }
}

inline std::string ctx(const char* what, int rank, DataType t, ReduceOp op, std::size_t count, bool in_place) {
  return std::string(what) + " rank " + std::to_string(rank) + " " + name_of(t) + " " + name_of(op) + " count " +
         std::to_string(count) + (in_place ? " in place" : " out of place");
}

inline void allreduce_case(Communicator& c, int r, DataType t, ReduceOp op, std::size_t count, bool in_place) {
  Buf in = input(t, op, r, count), out(in.size());
  if (in_place) {
    c.allreduce(in.data(), in.data(), count, t, op);
    out = in;
  } else {
    c.allreduce(in.data(), out.data(), count, t, op);
    CHECK_SAME(in, input(t, op, r, count), size_of(t), ctx("allreduce input clobbered", r, t, op, count, false));
  }
  CHECK_SAME(out, reduced(t, op, c.size(), count), size_of(t), ctx("allreduce", r, t, op, count, in_place));
}

}  // namespace elasticrun::collective::testing
