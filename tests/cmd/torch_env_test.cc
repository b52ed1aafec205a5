// torchrun's variables for a worker, from its epoch's assignment.
#include "cmd/torch_env.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace elasticrun::cmd {
namespace {

TEST(TorchEnv, GroupsAreHostsInTheOrderOfTheirFirstRank) {
  auto a = rendezvous::assign({{"n1", 2}, {"n2", 1}, {"n3", 4}}, 5, 3);
  auto t = torch_worker(a, 4);  // n3, slot 1
  EXPECT_EQ(t.rank, 4);
  EXPECT_EQ(t.world_size, 5);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_world_size, 2);  // -np 5 leaves n3 two of its four slots
  EXPECT_EQ(t.group_rank, 2);
  EXPECT_EQ(t.group_world_size, 3);
  EXPECT_EQ(t.master_addr, "n1");
  auto s = rendezvous::assign_places({{"n2", 0}, {"n1", 1}, {"n2", 1}}, 4);  // survivors in rank order
  t = torch_worker(s, 2);
  EXPECT_EQ(t.group_rank, 0);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_world_size, 2);
  EXPECT_EQ(t.master_addr, "n2");
}

// "user@host" says how to log in: MASTER_ADDR is the host part.
TEST(TorchEnv, MasterAddrLeavesOutTheUser) {
  auto a = rendezvous::assign({{"alice@n1", 1}, {"n2", 1}}, 2, 2);
  EXPECT_EQ(torch_worker(a, 1).master_addr, "n1");
  EXPECT_EQ(torch_worker(a, 0).host, "n1");
}

// Horovod's cross rank: the worker's index among the workers of its local rank (one per
// host, hosts in the order of their first rank), and their number.
TEST(TorchEnv, CrossRanksAreHorovods) {
  auto a = rendezvous::assign({{"n1", 2}, {"n2", 1}, {"n3", 2}}, 5, 5);
  std::vector<std::pair<int, int>> want{{0, 3}, {0, 2}, {1, 3}, {2, 3}, {1, 2}};  // local ranks 0 1 0 0 1
  for (int r = 0; r < 5; ++r) {
    TorchWorker w = torch_worker(a, r);
    EXPECT_EQ(std::make_pair(w.cross_rank, w.cross_size), want[r]) << "rank " << r;
  }
}

TEST(TorchEnv, EveryVariableTorchrunSets) {
  TorchWorker w{3, 5, 1, 2, 2, 3, "n1", 29517, 2, 4, false, 1, 3, "n3"};
  EXPECT_EQ(torch_env(w, "job-7"),
            (std::vector<std::string>{"RANK=3", "LOCAL_RANK=1", "WORLD_SIZE=5", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=2",
                                      "GROUP_WORLD_SIZE=3", "ROLE_RANK=3", "ROLE_WORLD_SIZE=5", "ROLE_NAME=default",
                                      "MASTER_ADDR=n1", "MASTER_PORT=29517", "TORCHELASTIC_RESTART_COUNT=2",
                                      "TORCHELASTIC_MAX_RESTARTS=4", "TORCHELASTIC_RUN_ID=job-7",
                                      "TORCHELASTIC_USE_AGENT_STORE=False", "NCCL_ASYNC_ERROR_HANDLING=1",
                                      "HOROVOD_RANK=3", "HOROVOD_SIZE=5", "HOROVOD_LOCAL_RANK=1",
                                      "HOROVOD_LOCAL_SIZE=2", "HOROVOD_CROSS_RANK=1", "HOROVOD_CROSS_SIZE=3",
                                      "HOROVOD_HOSTNAME=n3"}));
  w.agent_store = true;
  auto with_store = torch_env(w, "job-7");
  EXPECT_NE(std::find(with_store.begin(), with_store.end(), "TORCHELASTIC_USE_AGENT_STORE=True"), with_store.end());
  w.master_port = 0;  // none reserved: no MASTER_PORT rather than a wrong one
  for (const auto& kv : torch_env(w, "x")) EXPECT_NE(kv.rfind("MASTER_PORT=", 0), 0u) << kv;
}

}  // namespace
}  // namespace elasticrun::cmd
