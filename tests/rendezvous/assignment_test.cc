// Rank layout: hosts in order, slots filled contiguously, local and cross ranks.
#include "rendezvous/assignment.h"

#include <gtest/gtest.h>

namespace elasticrun {
namespace {

TEST(Assignment, FillsHostsInOrderWithLocalAndCrossRanks) {
  auto a = rendezvous::assign({{"a", 2}, {"b", 2}, {"c", 3}}, 5, 1);
  ASSERT_EQ(a.size(), 5);
  struct Want {
    const char* host;
    int slot, local_rank, local_size, cross_rank, cross_size;
  } want[] = {{"a", 0, 0, 2, 0, 2}, {"a", 1, 1, 2, 0, 2}, {"b", 0, 0, 2, 1, 2},
              {"b", 1, 1, 2, 1, 2}};
  for (int r = 0; r < 4; ++r) {
    const auto& w = a.workers[r];
    EXPECT_EQ(w.rank, r);
    EXPECT_EQ(w.host, want[r].host);
    EXPECT_EQ(w.slot, want[r].slot);
    EXPECT_EQ(w.local_rank, want[r].local_rank);
    EXPECT_EQ(w.local_size, want[r].local_size);
    EXPECT_EQ(w.cross_rank, want[r].cross_rank);
  }
  const auto& last = a.workers[4];
  EXPECT_EQ(last.host, "c");
  EXPECT_EQ(last.local_rank, 0);
  EXPECT_EQ(last.local_size, 1);
  EXPECT_EQ(last.cross_rank, 2);
  EXPECT_EQ(last.cross_size, 3);   // a, b and c all have a local rank 0
  EXPECT_EQ(a.workers[1].cross_size, 2);  // local rank 1 exists on a and b only
}

TEST(Assignment, CapsAtTotalSlotsAndFinds) {
  auto a = rendezvous::assign({{"a", 2}, {"b", 1}}, 10, 4);
  EXPECT_EQ(a.size(), 3);
  EXPECT_EQ(a.epoch, 4u);
  ASSERT_NE(a.find("b", 0), nullptr);
  EXPECT_EQ(a.find("b", 0)->rank, 2);
  EXPECT_EQ(a.find("b", 1), nullptr);
  EXPECT_EQ(a.find("z", 0), nullptr);
}

}  // namespace
}  // namespace elasticrun

namespace elasticrun {
// The survivors of an epoch keep their order and places; local ranks count each
// host's places in that order (not the slot numbers).
TEST(Assignment, GivenPlacesKeepTheirOrderAndGetLocalRanksPerHost) {
  auto a = rendezvous::assign_places({{"b", 1}, {"b", 3}, {"a", 0}}, 7);
  EXPECT_EQ(a.epoch, 7u);
  ASSERT_EQ(a.size(), 3);
  EXPECT_EQ(a.workers[0].host, "b");
  EXPECT_EQ(a.workers[0].slot, 1);
  EXPECT_EQ(a.workers[0].local_rank, 0);
  EXPECT_EQ(a.workers[1].slot, 3);
  EXPECT_EQ(a.workers[1].local_rank, 1);
  EXPECT_EQ(a.workers[1].local_size, 2);
  EXPECT_EQ(a.workers[2].local_rank, 0);
  EXPECT_EQ(a.workers[2].local_size, 1);
  EXPECT_EQ(a.workers[2].cross_rank, 1);  // the second host with local rank 0
  EXPECT_EQ(a.workers[0].cross_size, 2);
  ASSERT_NE(a.find("b", 3), nullptr);
  EXPECT_EQ(a.find("b", 3)->rank, 1);
  EXPECT_EQ(a.find("b", 0), nullptr);
}
}  // namespace elasticrun
