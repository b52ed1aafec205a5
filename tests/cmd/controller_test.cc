// The epoch controller's rules with a fake clock: no processes, no sockets, no sleeping.
// Each test feeds events at chosen times and reads the commands that come out, as the
// driver would carry them out.
#include "cmd/controller.h"
#include "tests/cmd/controller_fixture.h"

#include "cmd/exit_codes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>

namespace elasticrun::cmd {
namespace {

TEST(Controller, FixedJobStartsEveryWorkerAndEndsWhenAllExitZero) {
  Driver d(fixed(3));
  d.c.use_hosts({{"a", 2}, {"b", 1}}, t0());
  auto cmds = d.drain();
  auto epochs = Driver::only<command::StartEpoch>(cmds);
  ASSERT_EQ(epochs.size(), 1u);
  EXPECT_EQ(epochs[0].assignment.epoch, 1u);
  auto spawns = Driver::only<command::Spawn>(cmds);
  ASSERT_EQ(spawns.size(), 3u);
  EXPECT_EQ(spawns[2].place, (Place{"b", 0}));
  EXPECT_EQ(spawns[2].rank, 2);
  EXPECT_EQ(spawns[2].size, 3);
  // The epoch is announced to the server before any worker starts.
  EXPECT_TRUE(std::holds_alternative<command::StartEpoch>(cmds[0]));
  d.start_and_join_all();
  EXPECT_EQ(Driver::events(d.drain()),
            (std::vector<std::string>{"worker_started", "worker_started", "worker_started", "epoch_joined"}));
  d.c.worker_exited("a", d.exit_of("a", 0, 0), t0() + 5s);
  d.c.worker_exited("a", d.exit_of("a", 1, 0), t0() + 5s);
  EXPECT_FALSE(d.c.finished());
  d.c.worker_exited("b", d.exit_of("b", 0, 0), t0() + 6s);
  ASSERT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), exit_code::kOk);
  auto fin = Driver::only<command::Finish>(d.drain());
  ASSERT_EQ(fin.size(), 1u);
  EXPECT_EQ(fin[0].code, 0);
}

TEST(Controller, JoinDeadlineIsTheStartTimeoutAndEndsAFixedJob) {
  Driver d(fixed(2));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.drain();
  d.c.worker_joined(d.place("a", 0), 1);
  ASSERT_EQ(d.c.next_deadline(t0()), t0() + 60s);
  d.c.tick(t0() + 60s - 1ms);
  EXPECT_FALSE(d.c.finished());
  d.c.tick(t0() + 60s);
  ASSERT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), exit_code::kTimeout);
  EXPECT_EQ(Driver::said(d.drain()), "1 of 2 workers did not join within 60.0 s (rank@host: 1@b)\n");
}

TEST(Controller, AllJoinedMeansNoJoinDeadline) {
  Driver d(fixed(2));
  d.c.use_hosts({{"a", 2}}, t0());
  d.start_and_join_all();
  EXPECT_EQ(d.c.next_deadline(t0()), std::nullopt);
}

// Outside elastic mode one death arrives twice: the lost rendezvous connection says
// nothing, the daemon's exit report ends the job with what happened.
TEST(Controller, FixedJobFailsOnceWithTheExitReport) {
  Driver d(fixed(2));
  d.c.use_hosts({{"a", 2}}, t0());
  d.start_and_join_all();
  d.drain();
  d.c.worker_lost(d.place("a", 1), t0() + 1s);
  EXPECT_FALSE(d.c.finished());
  EXPECT_TRUE(d.drain().empty());
  d.c.worker_exited("a", d.exit_of("a", 1, 3), t0() + 1s);
  ASSERT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), exit_code::kWorkerFailed);
  EXPECT_EQ(Driver::said(d.drain()), "rank 1 (host 'a', slot 1, pid 97111) exited with code 3\n");
}

// The commands of host b's failure in a job on {a: 1, b: 2}, once b:0 failed: SIGKILL to
// it, SIGTERM to b:1, and the next epoch, of a alone, announced as an abort.
void expect_b_failed(const std::vector<Command>& cmds) {
  auto signals = Driver::only<command::Signal>(cmds);
  ASSERT_EQ(signals.size(), 2u);
  EXPECT_EQ(signals[0].place, (Place{"b", 0}));
  EXPECT_EQ(signals[0].signal, SIGKILL);
  EXPECT_EQ(signals[1].place, (Place{"b", 1}));
  EXPECT_EQ(signals[1].signal, SIGTERM);
  auto epochs = Driver::only<command::StartEpoch>(cmds);
  ASSERT_EQ(epochs.size(), 1u);
  EXPECT_EQ(epochs[0].assignment.epoch, 2u);
  EXPECT_EQ(epochs[0].assignment.size(), 1);
  EXPECT_EQ(epochs[0].kind, msg::NotifyKind::abort);
}

// b:1, SIGTERMed at `at` and still running, gets SIGKILL at the stop grace (2 s), not 1 ms
// before.
void expect_sigkill_after_the_grace(Driver& d, TimePoint at) {
  EXPECT_EQ(d.c.next_deadline(at), at + 2s);
  d.c.tick(at + 2s - 1ms);
  EXPECT_TRUE(Driver::only<command::Signal>(d.drain()).empty());
  d.c.tick(at + 2s);
  auto kill = Driver::only<command::Signal>(d.drain());
  ASSERT_EQ(kill.size(), 1u);
  EXPECT_EQ(kill[0].place, (Place{"b", 1}));
  EXPECT_EQ(kill[0].signal, SIGKILL);
}

// In elastic mode a death is one failure: the lost connection acts first, the exit
// report that follows changes nothing.
TEST(Controller, ElasticFailureBlacklistsTheHostAndStopsItsOtherWorkers) {
  Driver d(elastic(1));
  d.c.use_hosts({{"a", 1}, {"b", 2}}, t0());
  d.start_and_join_all();
  d.drain();
  d.c.worker_lost(d.place("b", 0), t0() + 1s);
  auto cmds = d.drain();
  EXPECT_EQ(Driver::said(cmds),
            "rank 1 (host 'b', slot 0, pid 98110) lost its rendezvous connection; blacklisting host 'b'\n");
  expect_b_failed(cmds);
  EXPECT_EQ(d.c.resets(), 1);
  // The exit report of the same death is no second failure.
  d.c.worker_exited("b", msg::Exited{0, 98110, 0, SIGKILL}, t0() + 1s);
  EXPECT_EQ(Driver::only<command::StartEpoch>(d.drain()).size(), 0u);
  EXPECT_EQ(d.c.resets(), 1);
  // The SIGTERMed worker that does not exit gets SIGKILL after the stop grace.
  expect_sigkill_after_the_grace(d, t0() + 1s);
}

// A worker silent for --worker-timeout (SIGSTOPped, frozen) fails like a dead one: its
// host is blacklisted with the cause, the silent process gets SIGKILL at once (a stopped
// process acts on no SIGTERM), its host's other worker the usual SIGTERM-then-SIGKILL, and
// the survivors are told at once (abort).
TEST(Controller, ASilentWorkerIsFailedKilledAndItsHostBlacklisted) {
  Driver d(elastic(1));
  d.c.use_hosts({{"a", 1}, {"b", 2}}, t0());
  d.start_and_join_all();
  d.drain();
  auto b0 = d.place("b", 0);
  d.c.worker_silent(b0, 5230ms, t0() + 6s);
  auto cmds = d.drain();
  EXPECT_EQ(Driver::said(cmds), "rank 1 (host 'b', slot 0, pid 98110) sent nothing for 5.2 s, not even a heartbeat "
                                "(--worker-timeout); blacklisting host 'b'\n");
  auto emits = Driver::only<command::Emit>(cmds);
  auto bl = std::find_if(emits.begin(), emits.end(), [](const auto& e) { return e.event == "host_blacklisted"; });
  ASSERT_NE(bl, emits.end());
  EXPECT_EQ(bl->fields["cause"], "worker_timeout");
  EXPECT_EQ(bl->fields["host"], "b");
  expect_b_failed(cmds);
  // The killed worker's exit and a late report of the same silence change nothing.
  d.c.worker_exited("b", msg::Exited{0, 98110, 0, SIGKILL}, t0() + 6s);
  d.c.worker_silent(b0, 5400ms, t0() + 6s);
  EXPECT_TRUE(Driver::only<command::StartEpoch>(d.drain()).empty());
  EXPECT_EQ(d.c.resets(), 1);
  // b's other worker, if it ignores SIGTERM (or is stopped too), gets SIGKILL at the grace.
  expect_sigkill_after_the_grace(d, t0() + 6s);
}

// Outside elastic mode a silent worker ends the job at once, naming it.
TEST(Controller, ASilentWorkerEndsAFixedJob) {
  Driver d(fixed(2));
  d.c.use_hosts({{"a", 2}}, t0());
  d.start_and_join_all();
  d.drain();
  d.c.worker_silent(d.place("a", 1), 5000ms, t0() + 6s);
  ASSERT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), exit_code::kWorkerFailed);
  EXPECT_EQ(Driver::said(d.drain()),
            "rank 1 (host 'a', slot 1, pid 97111) sent nothing for 5.0 s, not even a heartbeat (--worker-timeout)\n");
}

TEST(Controller, AStoppedWorkerThatExitsInTimeGetsNoSigkill) {
  Driver d(elastic(1));
  d.c.use_hosts({{"a", 1}, {"b", 2}}, t0());
  d.start_and_join_all();
  d.c.worker_exited("b", d.exit_of("b", 0, 1), t0() + 1s);
  d.drain();
  d.c.worker_exited("b", msg::Exited{1, static_cast<std::uint32_t>(d.pid_of({"b", 1, 0, 0, 0, 0, 0, 1})), 0, SIGTERM},
                    t0() + 2s);
  auto cmds = d.drain();
  ASSERT_EQ(Driver::events(cmds), (std::vector<std::string>{"worker_exited"}));
  EXPECT_TRUE(Driver::only<command::Emit>(cmds)[0].fields["removed"].get<bool>());
  d.c.tick(t0() + 10s);
  EXPECT_TRUE(Driver::only<command::Signal>(d.drain()).empty());
}

// A worker that misses an epoch keeps the deadline of the wait that began then, however
// many epochs follow before it: epochs replaced faster than the limit cannot keep it in.
TEST(Controller, JoinDeadlineIsKeptAcrossEpochsTheWorkerMisses) {
  Driver d(elastic(1));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_and_join_all();
  // Epoch 2 (host c added): b never joins it.
  d.c.hosts_changed({{"a", 1}, {"b", 1}, {"c", 1}}, t0() + 10s);
  ASSERT_EQ(d.c.assignment().epoch, 2u);
  d.c.worker_joined(d.place("a", 0), 2);
  d.c.worker_joined(d.place("c", 0), 2);
  // Epoch 3 (host z added) 20 s later: b's wait still began in epoch 2.
  d.c.hosts_changed({{"a", 1}, {"b", 1}, {"c", 1}, {"z", 1}}, t0() + 30s);
  ASSERT_EQ(d.c.assignment().epoch, 3u);
  d.drain();
  EXPECT_EQ(d.c.next_deadline(t0() + 30s), t0() + 40s);  // 10 s + --rendezvous-timeout
  d.c.tick(t0() + 40s);
  auto said = Driver::said(d.drain());
  EXPECT_NE(said.find("host 'b', slot 0"), std::string::npos) << said;
  EXPECT_NE(said.find("did not join epoch 3 within 30.0 s (waiting since epoch 2); blacklisting host 'b'"),
            std::string::npos)
      << said;
  EXPECT_EQ(d.c.assignment().epoch, 4u);
  EXPECT_EQ(d.c.assignment().find("b", 0), nullptr);
}

TEST(Controller, AnAbandonedEpochIsReplacedAfterTheGraceUnlessAFailureExplainsIt) {
  Driver d(elastic(1));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_and_join_all();
  d.drain();
  d.c.epoch_abandoned(d.place("a", 0), 1, t0() + 1s);
  EXPECT_EQ(d.c.next_deadline(t0() + 1s), t0() + 3s);
  d.c.tick(t0() + 3s - 1ms);
  EXPECT_EQ(d.c.assignment().epoch, 1u);
  d.c.tick(t0() + 3s);
  auto cmds = d.drain();
  EXPECT_EQ(Driver::said(cmds),
            "rank 0 (host 'a', slot 0, pid 97110) gave up on epoch 1 and nothing failed meanwhile; starting a new "
            "epoch\n");
  auto epochs = Driver::only<command::StartEpoch>(cmds);
  ASSERT_EQ(epochs.size(), 1u);
  EXPECT_EQ(epochs[0].kind, msg::NotifyKind::abort);
  EXPECT_EQ(epochs[0].assignment.size(), 2);  // nobody blacklisted
  EXPECT_NE(epochs[0].reason.find("gave up on epoch 1"), std::string::npos);

  Driver e(elastic(1));
  e.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  e.start_and_join_all();
  e.c.epoch_abandoned(e.place("a", 0), 1, t0() + 1s);
  e.c.worker_exited("b", e.exit_of("b", 0, 9), t0() + 2s);  // the failure it saw
  ASSERT_EQ(e.c.assignment().epoch, 2u);
  e.drain();
  e.c.tick(t0() + 3s);
  EXPECT_TRUE(Driver::only<command::StartEpoch>(e.drain()).empty());
  EXPECT_EQ(e.c.assignment().epoch, 2u);
}

// A daemon that could not start fails its host's workers like any lost daemon does;
// outside elastic mode it ends the job as a launch failure.
TEST(Controller, ADaemonThatCannotStartFailsItsHost) {
  Driver d(elastic(1));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.drain();
  d.c.daemon_closed("b", DaemonEnd::not_started, "ssh: cannot connect", t0() + 1s);
  auto cmds = d.drain();
  EXPECT_EQ(Driver::said(cmds), "host 'b' could not start its daemon: ssh: cannot connect; blacklisting it\n");
  EXPECT_TRUE(Driver::only<command::Signal>(cmds).empty());  // it has no process to signal
  ASSERT_EQ(d.c.assignment().epoch, 2u);
  EXPECT_EQ(d.c.assignment().size(), 1);

  Driver f(fixed(2));
  f.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  f.c.daemon_closed("b", DaemonEnd::not_started, "ssh: cannot connect", t0() + 1s);
  ASSERT_TRUE(f.c.finished());
  EXPECT_EQ(f.c.exit_code(), exit_code::kLaunchFailed);
  Driver g(fixed(2));
  g.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  g.c.daemon_closed("b", DaemonEnd::clean, "", t0() + 1s);
  EXPECT_FALSE(g.c.finished());
  g.c.daemon_closed("b", DaemonEnd::lost, "connection reset", t0() + 1s);
  ASSERT_TRUE(g.c.finished());
  EXPECT_EQ(g.c.exit_code(), exit_code::kWorkerFailed);
}

// A program that cannot start on a host added later (its environment not ready there),
// when it runs on the others: the host is blacklisted and the elastic job goes on. A
// program that has started nowhere else still ends the job at once (exit 3).
TEST(Controller, AnElasticJobGoesOnWithoutAHostWhereTheProgramCannotStart) {
  Driver d(elastic(1));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_and_join_all();
  d.drain();
  d.c.hosts_changed({{"a", 1}, {"b", 1}, {"c", 1}}, t0() + 1s);
  ASSERT_EQ(d.c.assignment().epoch, 2u);
  d.drain();
  d.c.spawn_failed("c", 0, "cannot execute 'train': No such file or directory", t0() + 2s);
  auto cmds = d.drain();
  ASSERT_FALSE(d.c.finished()) << Driver::said(cmds);
  const auto* bl = Driver::event(cmds, "host_blacklisted");
  ASSERT_NE(bl, nullptr);
  EXPECT_EQ(bl->fields.at("host"), "c");
  EXPECT_EQ(bl->fields.at("cause"), "spawn_failed");
  EXPECT_NE(Driver::said(cmds).find("host 'c' could not start rank 2: cannot execute 'train'"), std::string::npos)
      << Driver::said(cmds);
  EXPECT_EQ(d.c.assignment().find("c", 0), nullptr);

  Driver f(elastic(1));
  f.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  f.drain();
  f.c.spawn_failed("b", 0, "cannot execute 'train'", t0() + 1s);  // nothing started yet anywhere
  ASSERT_TRUE(f.c.finished());
  EXPECT_EQ(f.c.exit_code(), exit_code::kLaunchFailed);
  Driver g(fixed(2));
  g.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  g.start_all();
  g.c.spawn_failed("b", 0, "cannot execute 'train'", t0() + 1s);  // fixed: never a host's fault
  ASSERT_TRUE(g.c.finished());
  EXPECT_EQ(g.c.exit_code(), exit_code::kLaunchFailed);
}

// A place removed and listed again gets its new worker only after the old one exited:
// at most one process per place.
TEST(Controller, APlaceListedAgainWaitsForItsStoppingWorker) {
  Driver d(elastic(1));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_and_join_all();
  d.drain();
  auto old = d.exit_of("b", 0, 0, SIGTERM);
  d.c.hosts_changed({{"a", 1}}, t0() + 1s);  // b removed: its worker gets SIGTERM
  d.c.hosts_changed({{"a", 1}, {"b", 1}}, t0() + 2s);  // and b is back before it exited
  auto cmds = d.drain();
  EXPECT_EQ(Driver::only<command::Spawn>(cmds).size(), 0u);
  ASSERT_EQ(d.c.assignment().epoch, 3u);
  // Its output is still the old worker's.
  EXPECT_EQ(d.c.rank_at("b", 0), 1);
  d.c.worker_exited("b", old, t0() + 3s);
  auto spawns = Driver::only<command::Spawn>(d.drain());
  ASSERT_EQ(spawns.size(), 1u);
  EXPECT_EQ(spawns[0].place, (Place{"b", 0}));
  EXPECT_EQ(spawns[0].started_epoch, 3u);
  // The old process's rendezvous connection closing later is not the new worker's.
  d.c.worker_lost(rendezvous::WorkerPlace{"b", 0, 1, 0, 1, 0, 2, 1}, t0() + 4s);
  EXPECT_TRUE(Driver::only<command::StartEpoch>(d.drain()).empty());
}

TEST(Controller, NothingHappensAfterTheEnd) {
  Driver d(elastic(1));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_and_join_all();
  d.c.finish(130, "interrupted by SIGINT; stopping all workers");
  auto cmds = d.drain();
  ASSERT_EQ(Driver::only<command::Finish>(cmds).size(), 1u);
  EXPECT_EQ(Driver::said(cmds), "interrupted by SIGINT; stopping all workers\n");
  d.c.worker_exited("b", d.exit_of("b", 0, 1), t0() + 1s);
  d.c.hosts_changed({{"a", 1}, {"c", 1}}, t0() + 1s);
  d.c.finish(1, "again");
  cmds = d.drain();
  EXPECT_EQ(Driver::events(cmds), (std::vector<std::string>{"worker_exited"}));
  EXPECT_EQ(d.c.exit_code(), 130);
  EXPECT_EQ(d.c.next_deadline(t0() + 1s), std::nullopt);
}

}  // namespace
}  // namespace elasticrun::cmd
