// The epoch controller's rules for a job that is ending: once a worker finished (exit
// 0), no worker starts, and an epoch that cannot complete is replaced by one of the
// survivors that hold the job's state.
#include "cmd/controller.h"
#include "tests/cmd/controller_fixture.h"

#include "cmd/exit_codes.h"

#include <gtest/gtest.h>

#include <csignal>

namespace elasticrun::cmd {
namespace {

// A new epoch that starts during the last step: a worker whose part of the last
// collective completed exits 0 without joining it, while the peer interrupted by it
// waits in re-join. The survivors finish the job among themselves; no worker starts.
TEST(Controller, AWorkerFinishingDuringANewEpochLeavesTheSurvivorsToFinish) {
  Driver d(elastic(2));
  d.c.use_hosts({{"a", 1}, {"b", 1}, {"c", 1}}, t0());
  d.start_and_join_all();
  auto a_done = d.exit_of("a", 0, 0);
  d.c.hosts_changed({{"a", 1}, {"b", 1}}, t0() + 1s);  // c removed: epoch 2
  ASSERT_EQ(d.c.assignment().epoch, 2u);
  d.drain();
  d.c.worker_joined(d.place("b", 0), 2);  // b was interrupted and re-joins
  d.c.worker_exited("a", a_done, t0() + 2s);  // a had finished in epoch 1
  auto cmds = d.drain();
  EXPECT_NE(Driver::said(cmds).find("a worker finished before epoch 2 formed; the 1 remaining worker finish"),
            std::string::npos)
      << Driver::said(cmds);
  EXPECT_TRUE(Driver::only<command::Spawn>(cmds).empty());
  auto starts = Driver::only<command::StartEpoch>(cmds);
  ASSERT_EQ(starts.size(), 1u);
  ASSERT_EQ(starts[0].assignment.size(), 1);  // fewer than --min-np: the job is ending
  EXPECT_EQ(starts[0].assignment.workers[0].host, "b");
  EXPECT_EQ(starts[0].assignment.workers[0].rank, 0);
  EXPECT_EQ(starts[0].kind, msg::NotifyKind::abort);
  d.c.worker_joined(d.place("b", 0), 3);
  d.c.worker_exited("b", d.exit_of("b", 0, 0), t0() + 3s);
  ASSERT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), exit_code::kOk);
}

// A worker that fails after another finished: the rest finish without it. Members that
// never held the job's state (started for an epoch that never formed) are stopped, not
// made rank 0.
TEST(Controller, AFailureAfterAWorkerFinishedLeavesTheSurvivorsHoldingStateToFinish) {
  Driver d(elastic(1));
  d.c.use_hosts({{"a", 1}, {"b", 1}, {"c", 1}}, t0());
  d.start_and_join_all();
  d.c.hosts_changed({{"a", 1}, {"b", 1}, {"c", 1}, {"n", 1}}, t0() + 1s);  // epoch 2 adds n
  ASSERT_EQ(d.c.assignment().epoch, 2u);
  d.c.worker_started("n", 0, d.pid_of(d.place("n", 0)));
  d.c.worker_joined(d.place("n", 0), 2);
  d.c.worker_joined(d.place("c", 0), 2);
  d.drain();
  d.c.worker_exited("a", d.exit_of("a", 0, 0), t0() + 2s);  // finished in epoch 1
  ASSERT_EQ(d.c.assignment().epoch, 3u);
  auto cmds = d.drain();
  auto starts = Driver::only<command::StartEpoch>(cmds);
  ASSERT_EQ(starts.size(), 1u);
  std::vector<std::string> hosts;
  for (const auto& w : starts[0].assignment.workers) hosts.push_back(w.host);
  EXPECT_EQ(hosts, (std::vector<std::string>{"b", "c"}));
  auto sigs = Driver::only<command::Signal>(cmds);
  ASSERT_EQ(sigs.size(), 1u);
  EXPECT_EQ(sigs[0].place, (Place{"n", 0}));
  EXPECT_EQ(sigs[0].signal, SIGTERM);
  // c fails before epoch 3 ran: b finishes alone.
  d.c.worker_exited("c", d.exit_of("c", 0, 1), t0() + 3s);
  ASSERT_EQ(d.c.assignment().epoch, 4u);
  ASSERT_EQ(d.c.assignment().size(), 1);
  EXPECT_EQ(d.c.assignment().workers[0].host, "b");
  d.c.worker_exited("b", d.exit_of("b", 0, 0), t0() + 4s);
  ASSERT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), exit_code::kOk);
}

// The only worker holding the state finishes as an epoch that adds a worker forms (a
// host added during the last step; `elasticrun sweep` grows a trial as it stops): the
// job is done, and the worker started for that epoch, which never held state, stops.
TEST(Controller, EveryHolderFinishingAsAWorkerIsAddedFinishesTheJob) {
  Driver d(elastic(1));
  d.c.use_hosts({{"a", 1}}, t0());
  d.start_and_join_all();
  auto a_done = d.exit_of("a", 0, 0);
  d.c.hosts_changed({{"a", 2}}, t0() + 1s);  // epoch 2 adds a's slot 1
  ASSERT_EQ(d.c.assignment().epoch, 2u);
  d.c.worker_started("a", 1, d.pid_of(d.place("a", 1)));
  d.drain();
  d.c.worker_exited("a", a_done, t0() + 2s);  // it had finished in epoch 1
  auto cmds = d.drain();
  ASSERT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), exit_code::kOk) << Driver::said(cmds);
  EXPECT_NE(Driver::said(cmds).find("every worker holding the job's state finished; 1 that joined late stopped"),
            std::string::npos)
      << Driver::said(cmds);
  auto sigs = Driver::only<command::Signal>(cmds);
  ASSERT_EQ(sigs.size(), 1u);
  EXPECT_EQ(sigs[0].place, (Place{"a", 1}));
  EXPECT_TRUE(Driver::only<command::StartEpoch>(cmds).empty());
}

TEST(Controller, NoSurvivorHoldingStateToFinishEndsTheJob) {
  Driver d(elastic(1));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_and_join_all();
  d.c.worker_exited("a", d.exit_of("a", 0, 0), t0() + 1s);
  EXPECT_FALSE(d.c.finished());  // b follows
  d.c.worker_exited("b", d.exit_of("b", 0, 1), t0() + 2s);
  ASSERT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), exit_code::kWorkerFailed);
  EXPECT_NE(Driver::said(d.drain()).find("no surviving worker holds committed state to finish the job (rank 1"),
            std::string::npos);
}

}  // namespace
}  // namespace elasticrun::cmd
