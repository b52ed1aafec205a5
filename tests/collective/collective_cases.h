// What the collective tests share: a configuration by algorithm, the check of a result
// against the local reference (test_data.h), and one allreduce, allgather, broadcast or
// reduce-scatter checked end to end.
#pragma once

#include "rank_fixture.h"
#include "test_data.h"

#include <algorithm>
#include <chrono>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

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
    case Algorithm::hier: return "hier/";
    case Algorithm::rails: return "rails/";
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

// What an allgather(v) of i32s gives when rank q contributes counts[q] of its input.
inline Buf gathered(std::span<const std::size_t> counts) {
  Buf want;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    Buf part = input(DataType::i32, ReduceOp::sum, static_cast<int>(q), counts[q]);
    want.insert(want.end(), part.begin(), part.end());
  }
  return want;
}

// Every rank's `count` i32s gathered (in place: from this rank's own block of the output).
inline void allgather_case(Communicator& c, int r, std::size_t count, bool in_place) {
  const DataType t = DataType::i32;
  Buf want = gathered(std::vector<std::size_t>(c.size(), count));
  Buf in = input(t, ReduceOp::sum, r, count), out(want.size());
  const unsigned char* src = in.data();
  if (in_place) {
    std::copy(in.begin(), in.end(), out.begin() + r * in.size());
    src = out.data() + r * in.size();
  }
  c.allgather(src, out.data(), count, t);
  CHECK_SAME(out, want, 4, ctx("allgather", r, t, ReduceOp::sum, count, in_place));
}

// Rank q's counts[q] i32s gathered, out of place.
inline void allgatherv_case(Communicator& c, int r, std::span<const std::size_t> counts) {
  Buf want = gathered(counts);
  Buf in = input(DataType::i32, ReduceOp::sum, r, counts[r]), out(want.size());
  c.allgatherv(in.data(), out.data(), counts, DataType::i32);
  CHECK_SAME(out, want, 4, ctx("allgatherv", r, DataType::i32, ReduceOp::sum, counts[r], false));
}

// Rank root's `count` f32s broadcast (every other rank's buffer filled with other bytes first).
inline void broadcast_root_case(Communicator& c, int r, std::size_t count, int root) {
  Buf want = input(DataType::f32, ReduceOp::sum, root, count);
  Buf buf = r == root ? want : Buf(want.size(), 0x5A);
  c.broadcast(buf.data(), count, DataType::f32, root);
  CHECK_SAME(buf, want, 4, ctx("broadcast", r, DataType::f32, ReduceOp::sum, count, true) + " root " +
                               std::to_string(root));
}

// Block r of the ranks' size() x count inputs, reduced (in place: into this rank's own
// block of the input); out of place the input is left as it was.
inline void reduce_scatter_case(Communicator& c, int r, DataType t, ReduceOp op, std::size_t count, bool in_place) {
  const std::size_t n = static_cast<std::size_t>(c.size());
  Buf in = input(t, op, r, count * n), out(count * size_of(t));
  unsigned char* dst = in_place ? in.data() + count * r * size_of(t) : out.data();
  c.reduce_scatter(in.data(), dst, count, t, op);
  Buf got(dst, dst + out.size());
  CHECK_SAME(got, reduced(t, op, c.size(), count, count * r), size_of(t),
             ctx("reduce_scatter", r, t, op, count, in_place));
  if (!in_place)
    CHECK_SAME(in, input(t, op, r, count * n), size_of(t), ctx("reduce_scatter input clobbered", r, t, op, count, false));
}

}  // namespace elasticrun::collective::testing
