// Process sets: Communicator::subset, over the UCX transport of an in-process world.
// Every collective within sets, interleaved with the whole world's; sets that share
// ranks; and the refusals.
#include "rank_fixture.h"
#include "test_data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace elasticrun::collective::testing {
namespace {

HostCommConfig config() {
  HostCommConfig c;
  c.timeout = std::chrono::seconds(60);
  return c;
}

void expect_same(const Buf& got, const Buf& want, std::size_t elem, const std::string& what) {
  std::string d = diff(got, want, elem);
  if (!d.empty()) throw std::runtime_error(what + ": " + d);
}

// Every collective of `s` (whose rank is the input's rank), checked against the local
// references; `tag` names the set in failures.
void every_collective(Communicator& s, const std::string& tag) {
  const int n = s.size(), r = s.rank();
  for (DataType t : {DataType::f32, DataType::i64, DataType::f16})
    for (ReduceOp op : kAllOps)
      for (std::size_t count : {1u, 1000u, 70001u}) {
        Buf in = input(t, op, r, count), out(in.size());
        s.allreduce(in.data(), out.data(), count, t, op);
        expect_same(out, reduced(t, op, n, count), size_of(t), tag + " allreduce " + name_of(t));
      }
  for (int root = 0; root < n; ++root) {
    std::vector<std::int64_t> b(300, r == root ? 7 + root : -1);
    s.broadcast(b.data(), b.size(), DataType::i64, root);
    if (std::count(b.begin(), b.end(), 7 + root) != 300) throw std::runtime_error(tag + " broadcast");
  }
  std::vector<std::int32_t> mine(5, r), all(5 * n);
  s.allgather(mine.data(), all.data(), 5, DataType::i32);
  for (int q = 0; q < n; ++q)
    if (all[5 * q] != q || all[5 * q + 4] != q) throw std::runtime_error(tag + " allgather");
  Buf rs = input(DataType::i32, ReduceOp::sum, r, 4 * n), part(4 * sizeof(std::int32_t));
  s.reduce_scatter(rs.data(), part.data(), 4, DataType::i32, ReduceOp::sum);
  Buf whole = reduced(DataType::i32, ReduceOp::sum, n, 4 * n);
  expect_same(part, Buf(whole.begin() + 16 * r, whole.begin() + 16 * (r + 1)), 4, tag + " reduce_scatter");
  std::vector<std::int32_t> to(2 * n), from(2 * n);
  for (int q = 0; q < n; ++q) to[2 * q] = to[2 * q + 1] = 100 * r + q;  // block q goes to q
  s.alltoall(to.data(), from.data(), 2, DataType::i32);
  for (int q = 0; q < n; ++q)
    if (from[2 * q] != 100 * q + r) throw std::runtime_error(tag + " alltoall");
  s.barrier();
}

// Two sets that split a world of five, each running every collective at the same time,
// with the whole world's collectives between; then a set in the reverse order of ranks.
TEST(Subsets, EveryCollectiveInSetsThatSplitTheWorld) {
  World w(5);
  run_ranks(w, config(), "split/", [](int r, Communicator& c) {
    const std::vector<int> even{0, 2, 4}, odd{1, 3}, reversed{4, 3, 2, 1, 0};
    Communicator& mine = r % 2 ? c.subset(2, odd) : c.subset(1, even);
    EXPECT_EQ(mine.size(), r % 2 ? 2 : 3);
    EXPECT_EQ(mine.rank(), r / 2);
    every_collective(mine, r % 2 ? "odd" : "even");
    std::int64_t x = r;
    c.allreduce(&x, &x, 1, DataType::i64, ReduceOp::sum);  // the world's, between
    EXPECT_EQ(x, 10);
    every_collective(mine, r % 2 ? "odd again" : "even again");
    Communicator& back = c.subset(3, reversed);
    EXPECT_EQ(back.rank(), 4 - r);
    every_collective(back, "reversed");
    EXPECT_EQ(&c.subset(1 + r % 2, r % 2 ? odd : even), &mine);  // the same call gives the same set
    every_collective(c, "world");
  });
}

// Sets of one: every collective is local.
TEST(Subsets, ASetOfOne) {
  World w(2);
  run_ranks(w, config(), "one/", [](int r, Communicator& c) {
    every_collective(c.subset(5 + r, std::vector<int>{r}), "alone");
  });
}

// Two sets that share a pair of ranks keep their messages apart even when the pair
// issues their collectives in different orders: rank 0, the root of both broadcasts,
// sends both at once (eagerly), and rank 1 receives the second set's first. Without
// the space in the tag, both messages would carry the same tag (the first collective
// of each set) and rank 1 would take set 1's value for set 2's.
TEST(Subsets, SetsSharingRanksDoNotMixTheirMessages) {
  World w(3);
  run_ranks(w, config(), "shared/", [](int r, Communicator& c) {
    const std::vector<int> pair{0, 1}, all{0, 1, 2};
    std::int64_t a = r == 0 ? 111 : 0, b = r == 0 ? 222 : 0;
    if (r == 0) {
      c.subset(1, pair).broadcast(&a, 1, DataType::i64, 0);
      c.subset(2, all).broadcast(&b, 1, DataType::i64, 0);
    } else if (r == 1) {
      c.subset(2, all).broadcast(&b, 1, DataType::i64, 0);
      c.subset(1, pair).broadcast(&a, 1, DataType::i64, 0);
    } else {
      c.subset(2, all).broadcast(&b, 1, DataType::i64, 0);
    }
    EXPECT_EQ(b, 222) << "rank " << r;
    if (r < 2) {
      EXPECT_EQ(a, 111) << "rank " << r;
    }
    c.barrier();
  });
}

// A call with an id in use and other members replaces the set.
TEST(Subsets, AnIdTakenAgainWithOtherMembersReplacesTheSet) {
  World w(3);
  run_ranks(w, config(), "replace/", [](int r, Communicator& c) {
    std::int64_t x = 1;
    if (r < 2) {
      c.subset(7, std::vector<int>{0, 1}).allreduce(&x, &x, 1, DataType::i64, ReduceOp::sum);
      EXPECT_EQ(x, 2);
    }
    x = 1;
    Communicator& s = c.subset(7, std::vector<int>{2, 1, 0});
    EXPECT_EQ(s.rank(), 2 - r);
    s.allreduce(&x, &x, 1, DataType::i64, ReduceOp::sum);
    EXPECT_EQ(x, 3);
  });
}

TEST(Subsets, BadIdsAndMembersAreRefused) {
  World w(2);
  std::atomic<int> checked{0};
  run_ranks(w, config(), "bad/", [&](int r, Communicator& c) {
    auto refused = [&](int id, std::vector<int> members, const std::string& says) {
      try {
        c.subset(id, members);
        ADD_FAILURE() << "subset(" << id << ") was not refused";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
        ++checked;
      }
    };
    refused(0, {0, 1}, "id 0 is not in 1..63");
    refused(64, {0, 1}, "id 64 is not in 1..63");
    refused(1, {}, "no members");
    refused(1, {0, 2}, "rank 2 is not a rank of this communicator (size 2)");
    refused(1, {-1, 0, 1}, "rank -1 is not a rank");
    refused(1, {1, 0, 1}, "rank 1 is named twice");
    refused(1, {1 - r}, "rank " + std::to_string(r) + " is not a member");
    try {
      c.subset(1, std::vector<int>{0, 1}).subset(1, std::vector<int>{0, 1});
      ADD_FAILURE() << "a set's own subset was not refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("a process set has no subsets of its own"), std::string::npos) << e.what();
      ++checked;
    }
  });
  EXPECT_EQ(checked, 16);
}

}  // namespace
}  // namespace elasticrun::collective::testing
