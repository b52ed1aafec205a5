// Shrink or re-init a device communicator at a new epoch: the pure plan, and the
// agreement of N ranks (threads over UCX) on it with fake device communicators, so the
// whole decision runs without NCCL or a GPU.
#include "control/settings.h"
#include "device/device_rebuild.h"
#include "rank_fixture.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>

namespace elasticrun::collective::testing {
namespace {

using namespace std::chrono_literals;

std::vector<DevicePlace> survivors(std::uint64_t epoch, int old_size, std::vector<int> old_ranks) {
  std::vector<DevicePlace> v;
  for (int r : old_ranks) v.push_back(DevicePlace{epoch, r, old_size, true});
  return v;
}

TEST(RebuildPlan, OnlyRemovedRanksShrink) {
  auto plan = plan_rebuild(survivors(4, 5, {0, 2, 3}));
  EXPECT_TRUE(plan.shrink) << plan.why;
  EXPECT_EQ(plan.excluded, (std::vector<int>{1, 4}));
  plan = plan_rebuild(survivors(4, 2, {1}));
  EXPECT_TRUE(plan.shrink);
  EXPECT_EQ(plan.excluded, (std::vector<int>{0}));  // rank 0 died: old rank 1 leads
}

TEST(RebuildPlan, AnythingElseReinitialises) {
  auto reinit = [](std::vector<DevicePlace> p) {
    auto plan = plan_rebuild(p);
    EXPECT_FALSE(plan.shrink);
    EXPECT_TRUE(plan.excluded.empty());
    EXPECT_FALSE(plan.why.empty());
    return plan.why;
  };
  reinit({});
  EXPECT_NE(reinit(survivors(0, 0, {-1, -1})).find("newcomer"), std::string::npos);  // first epoch
  auto grown = survivors(4, 3, {0, 1, 2});
  grown.push_back(DevicePlace{});  // a newcomer
  EXPECT_NE(reinit(grown).find("newcomer"), std::string::npos);
  auto mixed = survivors(4, 3, {0, 1});
  mixed[1].epoch = 3;  // skipped an epoch's device use
  reinit(mixed);
  auto sizes = survivors(4, 3, {0, 1});
  sizes[1].size = 4;
  reinit(sizes);
  auto aborted = survivors(4, 3, {0, 2});
  aborted[1].shrinkable = false;  // its communicator was aborted, or ELASTICRUN_NCCL_SHRINK=0
  reinit(aborted);
  reinit(survivors(4, 3, {2, 0}));     // reordered
  reinit(survivors(4, 3, {0, 0}));     // duplicate
  reinit(survivors(4, 3, {0, 3}));     // out of range
  reinit(survivors(4, 3, {0, 1, 2}));  // nobody left
}

// A stand-in for an NCCL communicator: only its place.
class FakeDeviceComm final : public device::Communicator {
 public:
  FakeDeviceComm(int rank, int size, bool alive = true) : rank_(rank), size_(size), alive_(alive) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return 0; }
  void allreduce(const void*, void*, std::size_t, DataType, ReduceOp, void*) override {}
  void broadcast(void*, std::size_t, DataType, int, void*) override {}
  void allgather(const void*, void*, std::size_t, DataType, void*) override {}
  void reduce_scatter(const void*, void*, std::size_t, DataType, ReduceOp, void*) override {}
  void alltoall(const void*, void*, std::size_t, DataType, void*) override {}

  int rank_, size_;
  bool alive_;
};

struct Outcome {
  std::atomic<int> shrinks{0}, makes{0}, discards{0};
  std::vector<std::vector<int>> excluded;
};

// New epoch 5 of `n` ranks; new rank r had old place old_ranks[r] in epoch 4's
// communicator of `old_size` (-1: a newcomer).
void rebuild_world(int n, int old_size, std::vector<int> old_ranks, bool enabled, Outcome& out,
                   int dead_comm_rank = -1) {
  World w(n);
  out.excluded.assign(n, {});
  HostCommConfig base;
  base.timeout = 20s;
  run_ranks(w, base, "rebuild/", [&](int r, Communicator& host) {
    std::unique_ptr<device::Communicator> old;
    if (old_ranks[r] >= 0) old = std::make_unique<FakeDeviceComm>(old_ranks[r], old_size, r != dead_comm_rank);
    DeviceBackend be{
        [](device::Communicator& c) { return static_cast<FakeDeviceComm&>(c).alive_; },
        [&, r](device::Communicator& c, std::span<const int> ex) -> std::unique_ptr<device::Communicator> {
          ++out.shrinks;
          out.excluded[r].assign(ex.begin(), ex.end());
          int below = 0;
          for (int e : ex) below += e < c.rank() ? 1 : 0;
          return std::make_unique<FakeDeviceComm>(c.rank() - below, c.size() - static_cast<int>(ex.size()));
        },
        [&, r, n] {
          ++out.makes;
          return std::make_unique<FakeDeviceComm>(r, n);
        },
        [&](device::Communicator&) { ++out.discards; }};
    auto next = rebuild(host, std::move(old), 4, 5, enabled, be);
    EXPECT_EQ(next->rank(), r);
    EXPECT_EQ(next->size(), n);
  });
}

TEST(DeviceRebuild, SurvivorsAgreeToShrink) {
  Outcome out;
  rebuild_world(3, 4, {0, 1, 3}, true, out);
  EXPECT_EQ(out.shrinks.load(), 3);
  EXPECT_EQ(out.makes.load(), 0);
  EXPECT_EQ(out.discards.load(), 0);  // shrinking ends the old communicators itself
  for (auto& ex : out.excluded) EXPECT_EQ(ex, (std::vector<int>{2}));
}

TEST(DeviceRebuild, ANewcomerMeansFreshInitEverywhere) {
  Outcome out;
  rebuild_world(3, 2, {0, 1, -1}, true, out);
  EXPECT_EQ(out.shrinks.load(), 0);
  EXPECT_EQ(out.makes.load(), 3);
  EXPECT_EQ(out.discards.load(), 2);  // each old communicator is aborted, not finalized
}

TEST(DeviceRebuild, OneAbortedCommunicatorOrTheSwitchMeansFreshInit) {
  Outcome aborted;
  rebuild_world(2, 3, {0, 2}, true, aborted, /*dead_comm_rank=*/1);
  EXPECT_EQ(aborted.shrinks.load(), 0);
  EXPECT_EQ(aborted.makes.load(), 2);
  Outcome disabled;
  rebuild_world(2, 3, {0, 2}, false, disabled);
  EXPECT_EQ(disabled.shrinks.load(), 0);
  EXPECT_EQ(disabled.makes.load(), 2);
}

TEST(DeviceRebuild, ShrinkSwitchFromEnvironment) {
  ::unsetenv("ELASTICRUN_NCCL_SHRINK");
  EXPECT_TRUE(settings::nccl_shrink());
  ::setenv("ELASTICRUN_NCCL_SHRINK", "0", 1);
  EXPECT_FALSE(settings::nccl_shrink());
  ::setenv("ELASTICRUN_NCCL_SHRINK", "1", 1);
  EXPECT_TRUE(settings::nccl_shrink());
  ::setenv("ELASTICRUN_NCCL_SHRINK", "no", 1);
  EXPECT_THROW(settings::nccl_shrink(), Error);
  ::unsetenv("ELASTICRUN_NCCL_SHRINK");
}

}  // namespace
}  // namespace elasticrun::collective::testing
