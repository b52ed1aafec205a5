// The epoch controller's restart mode (--max-restarts); fake clock.
#include "cmd/controller.h"
#include "tests/cmd/controller_fixture.h"

#include "cmd/exit_codes.h"
#include "cmd/options.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>

namespace elasticrun::cmd {
namespace {

std::vector<command::Spawn> spawns_of(const std::vector<Command>& cmds) { return Driver::only<command::Spawn>(cmds); }

std::vector<std::string> places(const std::vector<command::Spawn>& spawns) {
  std::vector<std::string> out;
  for (const auto& s : spawns) out.push_back(s.place.first + ":" + std::to_string(s.place.second));
  return out;
}

// A failed worker stops every worker of the generation (SIGTERM; it is gone already) and
// starts the next one on the same hosts, with new processes at every place, a new port,
// and TORCHELASTIC_RESTART_COUNT 1. Its host is not blacklisted. Each place's new worker
// starts only once the old one there exited.
TEST(Restart, AFailedWorkerRestartsEveryWorkerInPlace) {
  Driver d(restarting(3, 2));
  d.c.use_hosts({{"a", 2}, {"b", 1}}, t0());
  d.start_all();
  auto a0 = d.exit_of("a", 0, 0, SIGTERM), a1 = d.exit_of("a", 1, 0, SIGTERM);
  d.drain();
  d.c.worker_exited("b", d.exit_of("b", 0, 1), t0() + 5s);
  auto cmds = d.drain();
  EXPECT_EQ(Driver::said(cmds),
            "rank 2 (host 'b', slot 0, pid 98110) exited with code 1; restarting every worker (restart 1 of 2)\n");
  auto sigs = Driver::only<command::Signal>(cmds);
  ASSERT_EQ(sigs.size(), 2u);
  for (const auto& s : sigs) EXPECT_EQ(s.signal, SIGTERM);
  EXPECT_EQ(Driver::event(cmds, "host_blacklisted"), nullptr);
  auto restart = Driver::event(cmds, "restart");
  ASSERT_NE(restart, nullptr);
  EXPECT_EQ(restart->fields["cause"], "failure");
  EXPECT_EQ(restart->fields["generation"], 2);
  EXPECT_EQ(restart->fields["restart_count"], 1);
  auto epochs = Driver::only<command::StartEpoch>(cmds);
  ASSERT_EQ(epochs.size(), 1u);
  EXPECT_EQ(epochs[0].assignment.size(), 3);
  EXPECT_EQ(epochs[0].kind, msg::NotifyKind::abort);
  auto ports = Driver::only<command::ReservePort>(cmds);
  ASSERT_EQ(ports.size(), 1u);
  EXPECT_EQ(ports[0].host, "a");
  EXPECT_EQ(ports[0].epoch, 2u);
  EXPECT_TRUE(ports[0].host_store);  // the daemon hosts torch's store if it can
  EXPECT_FALSE(spawns_of(cmds).at(0).torch.agent_store);  // this one could not
  // b's old worker is gone: its successor starts at once; a's wait for theirs.
  auto spawns = Driver::only<command::Spawn>(cmds);
  ASSERT_EQ(places(spawns), (std::vector<std::string>{"b:0"}));
  EXPECT_EQ(spawns[0].torch.restart_count, 1);
  EXPECT_EQ(spawns[0].torch.master_port, Driver::port_of(2));
  EXPECT_EQ(spawns[0].torch.master_addr, "a");
  EXPECT_EQ(spawns[0].started_epoch, 2u);
  d.c.worker_exited("a", a1, t0() + 6s);
  d.c.worker_exited("a", a0, t0() + 6s);
  spawns = Driver::only<command::Spawn>(d.drain());
  EXPECT_EQ(places(spawns), (std::vector<std::string>{"a:1", "a:0"}));
  EXPECT_EQ(d.c.restarts(), 1);
  // The new generation finishes like any job.
  d.start_all();
  for (auto [h, s] : {std::pair{"a", 0}, {"a", 1}, {"b", 0}}) d.c.worker_exited(h, d.exit_of(h, s, 0), t0() + 9s);
  ASSERT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), exit_code::kOk);
}

// Stopping is bounded: a worker that ignores SIGTERM gets SIGKILL at the stop grace, and
// the new worker at its place starts once it is gone.
TEST(Restart, AWorkerThatIgnoresSigtermIsKilledAfterTheGrace) {
  Driver d(restarting(2, 1));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_all();
  auto a0 = d.exit_of("a", 0, 0, SIGKILL);
  d.c.worker_exited("b", d.exit_of("b", 0, 0, SIGKILL), t0() + 1s);
  d.drain();
  EXPECT_EQ(d.c.next_deadline(t0() + 1s), t0() + 3s);
  d.c.tick(t0() + 3s - 1ms);
  EXPECT_TRUE(Driver::only<command::Signal>(d.drain()).empty());
  d.c.tick(t0() + 3s);
  auto sigs = Driver::only<command::Signal>(d.drain());
  ASSERT_EQ(sigs.size(), 1u);
  EXPECT_EQ(sigs[0].place, (Place{"a", 0}));
  EXPECT_EQ(sigs[0].signal, SIGKILL);
  d.c.worker_exited("a", a0, t0() + 3s);
  EXPECT_EQ(places(Driver::only<command::Spawn>(d.drain())), (std::vector<std::string>{"a:0"}));
}

// The failure after the last restart ends the job, naming its cause.
TEST(Restart, ExhaustedRestartsEndTheJobNamingTheCause) {
  Driver d(restarting(2, 1));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_all();
  d.c.worker_exited("b", d.exit_of("b", 0, 3), t0() + 1s);
  ASSERT_FALSE(d.c.finished());
  d.c.worker_exited("a", msg::Exited{0, static_cast<std::uint32_t>(d.pid_of({"a", 0, 0, 0, 0, 0, 0, 1})), 0,
                                     SIGTERM},
                    t0() + 1s);
  d.start_all();
  d.drain();
  d.c.worker_exited("a", d.exit_of("a", 0, 0, SIGSEGV), t0() + 2s);
  ASSERT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), exit_code::kWorkerFailed);
  EXPECT_EQ(Driver::said(d.drain()), "rank 0 (host 'a', slot 0, pid 97120) was killed by signal 11 (SIGSEGV); no "
                                     "restart left (--max-restarts 1)\n");
  EXPECT_EQ(d.c.restarts(), 1);

  Driver z(restarting(2, 0));  // --max-restarts 0: the first failure ends it
  z.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  z.start_all();
  z.c.worker_exited("b", z.exit_of("b", 0, 1), t0() + 1s);
  ASSERT_TRUE(z.c.finished());
  EXPECT_NE(Driver::said(z.drain()).find("no restart left (--max-restarts 0)"), std::string::npos);
}

// Discovery adding a host restarts every worker with it in the assignment, not counted
// against --max-restarts (as torchrun); a change that leaves the assignment as it is
// restarts nothing.
TEST(Restart, AHostChangeRestartsEveryWorkerUncounted) {
  auto cfg = elastic(1, 3);
  cfg.max_restarts = 0;
  Driver d(cfg);
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_all();
  d.drain();
  d.c.hosts_changed({{"a", 1}, {"b", 1}, {"c", 1}}, t0() + 1s);
  auto cmds = d.drain();
  EXPECT_NE(Driver::said(cmds).find("hosts changed; restarting every worker (not counted against --max-restarts)"),
            std::string::npos);
  EXPECT_EQ(Driver::only<command::Signal>(cmds).size(), 2u);
  ASSERT_EQ(d.c.assignment().epoch, 2u);
  ASSERT_EQ(d.c.assignment().size(), 3);
  EXPECT_EQ(d.c.assignment().workers[2].host, "c");
  auto restart = Driver::event(cmds, "restart");
  ASSERT_NE(restart, nullptr);
  EXPECT_EQ(restart->fields["cause"], "hosts_changed");
  auto spawns = Driver::only<command::Spawn>(cmds);
  ASSERT_EQ(places(spawns), (std::vector<std::string>{"c:0"}));  // a and b wait for their old workers
  EXPECT_EQ(spawns[0].torch.restart_count, 0);
  EXPECT_EQ(spawns[0].torch.world_size, 3);
  EXPECT_EQ(d.c.restarts(), 0);
  // At --max-np, one more host changes nothing.
  d.c.hosts_changed({{"a", 1}, {"b", 1}, {"c", 1}, {"d", 1}}, t0() + 2s);
  EXPECT_EQ(d.c.assignment().epoch, 2u);
  EXPECT_TRUE(Driver::only<command::Signal>(d.drain()).empty());
}

// A lost daemon is a failure, counted: in an elastic job its host is blacklisted and the
// next generation runs without it; a fixed job restarts on the same hosts (a new daemon
// is started by the spawn).
TEST(Restart, ALostDaemonBlacklistsItsHostInAnElasticJobOnly) {
  auto cfg = elastic(1);
  cfg.max_restarts = 3;
  Driver d(cfg);
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_all();
  d.drain();
  d.c.daemon_closed("b", DaemonEnd::lost, "connection reset", t0() + 1s);
  auto cmds = d.drain();
  ASSERT_NE(Driver::event(cmds, "host_blacklisted"), nullptr);
  EXPECT_EQ(Driver::said(cmds), "host 'b' lost its daemon: connection reset; restarting every worker (restart 1 of 3)\n");
  ASSERT_EQ(d.c.assignment().size(), 1);
  EXPECT_EQ(d.c.assignment().workers[0].host, "a");

  Driver f(restarting(2, 3));
  f.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  f.start_all();
  f.drain();
  f.c.daemon_closed("b", DaemonEnd::lost, "connection reset", t0() + 1s);
  cmds = f.drain();
  EXPECT_FALSE(f.c.finished());
  EXPECT_EQ(Driver::event(cmds, "host_blacklisted"), nullptr);
  ASSERT_EQ(f.c.assignment().size(), 2);
  EXPECT_EQ(places(Driver::only<command::Spawn>(cmds)), (std::vector<std::string>{"b:0"}));
  EXPECT_EQ(f.c.restarts(), 1);
  f.c.daemon_closed("a", DaemonEnd::not_started, "ssh: cannot connect", t0() + 2s);  // cannot start: the end
  ASSERT_TRUE(f.c.finished());
  EXPECT_EQ(f.c.exit_code(), exit_code::kLaunchFailed);
}

// A generation fails as a whole: a worker that had finished (exit 0) runs again with the
// rest. Once a worker finished and none failed, a host change restarts nothing.
TEST(Restart, AFailureAfterAWorkerFinishedRestartsThemAll) {
  Driver d(restarting(2, 1));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_all();
  d.c.worker_exited("a", d.exit_of("a", 0, 0), t0() + 1s);
  d.c.hosts_changed({{"a", 1}, {"b", 1}, {"c", 1}}, t0() + 1s);  // fixed hosts: nothing anyway
  EXPECT_EQ(d.c.assignment().epoch, 1u);
  d.drain();
  d.c.worker_exited("b", d.exit_of("b", 0, 1), t0() + 2s);
  auto cmds = d.drain();
  EXPECT_EQ(places(Driver::only<command::Spawn>(cmds)), (std::vector<std::string>{"a:0", "b:0"}));
  d.start_all();
  d.c.worker_exited("a", d.exit_of("a", 0, 0), t0() + 3s);
  d.c.worker_exited("b", d.exit_of("b", 0, 0), t0() + 3s);
  ASSERT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), exit_code::kOk);

  auto cfg = elastic(1);
  cfg.max_restarts = 1;
  Driver e(cfg);
  e.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  e.start_all();
  e.c.worker_exited("a", e.exit_of("a", 0, 0), t0() + 1s);
  e.c.hosts_changed({{"a", 1}, {"b", 1}, {"c", 1}}, t0() + 1s);
  EXPECT_EQ(e.c.assignment().epoch, 1u);
  EXPECT_TRUE(Driver::only<command::Signal>(e.drain()).empty());
}

// Nobody waits for a program that does not join, in restart mode too; one that joined
// and then a worker that does not is a failure like any other: the generation restarts.
TEST(Restart, OnlyAProgramThatJoinsIsWaitedFor) {
  Driver d(restarting(2, 1));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_all();
  d.drain();
  EXPECT_EQ(d.c.next_deadline(t0()), std::nullopt);
  d.c.tick(t0() + 3600s);
  EXPECT_FALSE(d.c.finished());
  d.c.worker_joined(d.place("a", 0), 1);
  EXPECT_EQ(d.c.next_deadline(t0() + 3600s), t0() + 60s);
  d.c.tick(t0() + 3600s);
  EXPECT_FALSE(d.c.finished());
  EXPECT_EQ(d.c.restarts(), 1);
  EXPECT_NE(Driver::said(d.drain()).find("did not join epoch 1 within 60.0 s; restarting every worker"),
            std::string::npos);
}

// The root cause is the failure that restarted the generation, not a worker that the
// restart stopped and that wrote an error file too (its peer was gone).
TEST(Restart, AWorkerStoppedByARestartIsNoRootCause) {
  const char* recorded = R"({"message": {"message": "RuntimeError: peer gone", "extraInfo": {}}})";
  Driver d(restarting(2, 1));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_all();
  d.drain();
  auto a = d.exit_of("a", 0, 1);
  a.error_file = recorded;
  a.error_file_size = a.error_file.size();
  auto b = d.exit_of("b", 0, 1);
  b.error_file = recorded;
  b.error_file_size = b.error_file.size();
  d.c.worker_exited("b", b, t0() + 1s);
  auto cmds = d.drain();
  EXPECT_NE(Driver::said(cmds).find("exited with code 1; restarting every worker (restart 1 of 1)\n"
                                    "root cause (first observed failure):\n  host      : b\n"),
            std::string::npos)
      << Driver::said(cmds);
  d.c.worker_exited("a", a, t0() + 1s);  // SIGTERMed by the restart, but it failed first
  cmds = d.drain();
  EXPECT_EQ(Driver::said(cmds), "");
  for (const auto& e : Driver::only<command::Emit>(cmds)) EXPECT_NE(e.event, "worker_error");
}

// Where rank 0's daemon hosts torch's store (its fork server runs), every worker of the
// generation is told so (TORCHELASTIC_USE_AGENT_STORE=True), and the event says it.
TEST(Restart, WorkersUseTheStoreTheDaemonHosts) {
  Driver d(restarting(2, 1));
  d.hosts_stores = true;
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  auto cmds = d.drain();
  auto spawns = spawns_of(cmds);
  ASSERT_EQ(spawns.size(), 2u);
  for (const auto& s : spawns) EXPECT_TRUE(s.torch.agent_store) << s.place.first;
  auto e = Driver::event(cmds, "port_reserved");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->fields["store"], true);
  // A later generation whose daemon could not host it: rank 0 hosts it, as without.
  d.hosts_stores = false;
  d.start_all();
  auto a0 = d.exit_of("a", 0, 0, SIGTERM);
  d.c.worker_exited("b", d.exit_of("b", 0, 1), t0() + 1s);
  d.c.worker_exited("a", a0, t0() + 2s);
  spawns = spawns_of(d.drain());
  ASSERT_EQ(spawns.size(), 2u);
  for (const auto& s : spawns) EXPECT_FALSE(s.torch.agent_store) << s.place.first;
}

// -x naming where the workers find the store, or who hosts it, keeps the daemon from
// hosting one: the workers would not use it, or not agree on it.
TEST(Restart, NoStoreIsHostedWhenTheUserSaysWhereItIs) {
  Options o;
  o.max_restarts = 1;
  EXPECT_TRUE(ControllerConfig::of(o).agent_store);
  for (const char* kv : {"MASTER_PORT=29400", "MASTER_ADDR=n1", "TORCHELASTIC_USE_AGENT_STORE=False"}) {
    o.env = {"OMP_NUM_THREADS=1", kv};
    EXPECT_FALSE(ControllerConfig::of(o).agent_store) << kv;
  }
  o.env = {"MASTER_PORTS=1"};
  EXPECT_TRUE(ControllerConfig::of(o).agent_store);
  auto cfg = restarting(2, 1);
  cfg.agent_store = false;
  Driver d(cfg);
  d.hosts_stores = true;
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  auto cmds = d.drain();
  ASSERT_EQ(Driver::only<command::ReservePort>(cmds).size(), 1u);
  EXPECT_FALSE(Driver::only<command::ReservePort>(cmds)[0].host_store);
  for (const auto& s : spawns_of(cmds)) EXPECT_FALSE(s.torch.agent_store);
}

}  // namespace
}  // namespace elasticrun::cmd
