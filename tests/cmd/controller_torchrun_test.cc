// The epoch controller's side of programs written for torchrun: the epoch's port, the
// rule that only a program using libelasticrun is waited for, error files; fake clock.
#include "cmd/controller.h"
#include "tests/cmd/controller_fixture.h"

#include "cmd/exit_codes.h"

#include <gtest/gtest.h>

namespace elasticrun::cmd {
namespace {

// A program that never links libelasticrun never joins: nobody waits for it. Once any
// worker joined (the program uses the library), the others have --start-timeout as
// before. An elastic job that recovers in process needs the library: it waits from the
// start.
TEST(Torchrun, OnlyAProgramThatJoinsIsWaitedFor) {
  Driver d(fixed(2));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_all();
  d.drain();
  EXPECT_EQ(d.c.next_deadline(t0()), std::nullopt);
  d.c.tick(t0() + 3600s);
  EXPECT_FALSE(d.c.finished());
  d.c.worker_joined(d.place("a", 0), 1);
  EXPECT_EQ(d.c.next_deadline(t0() + 3600s), t0() + 60s);
  d.c.tick(t0() + 3600s);
  ASSERT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), exit_code::kTimeout);
  Driver e(elastic(1));
  e.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  e.start_all();
  EXPECT_EQ(e.c.next_deadline(t0()), t0() + 60s);
}

// An epoch's workers start once rank 0's daemon reserved its port: with it in
// MASTER_PORT, or, if it could not, without (said once). A late answer for an epoch gone
// by starts nothing.
TEST(Torchrun, SpawnsWaitForTheEpochsPort) {
  Driver d(fixed(2));
  d.answer_ports = false;
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  auto cmds = d.drain();
  ASSERT_EQ(Driver::only<command::ReservePort>(cmds).size(), 1u);
  EXPECT_EQ(Driver::only<command::ReservePort>(cmds)[0].hosts, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(Driver::only<command::ReservePort>(cmds)[0].host_store);  // only restart mode asks
  EXPECT_TRUE(Driver::only<command::Spawn>(cmds).empty());
  d.c.port_reserved("b", 1, 4000, "");  // not rank 0's host
  d.c.port_reserved("a", 7, 4000, "");  // not this epoch
  EXPECT_TRUE(Driver::only<command::Spawn>(d.drain()).empty());
  d.c.port_reserved("a", 1, 0, "bind: no free port");
  cmds = d.drain();
  auto spawns = Driver::only<command::Spawn>(cmds);
  ASSERT_EQ(spawns.size(), 2u);
  EXPECT_EQ(spawns[0].torch.master_port, 0);
  EXPECT_EQ(Driver::said(cmds), "host 'a' could not reserve a port for epoch 1 (bind: no free port); its workers get "
                                "no MASTER_PORT\n");
  d.c.port_reserved("a", 1, 4000, "");  // answered already
  EXPECT_TRUE(d.drain().empty());
}

// Rank 0's host fails before its daemon answered: the workers waiting for the port have
// no process to stop; the next epoch asks its own rank 0's host, and its workers, those
// kept from the epoch before included, start with that port.
TEST(Torchrun, WorkersWaitingForAPortOfAFailedHostHaveNoProcess) {
  Driver d(elastic(1));
  d.answer_ports = false;
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.drain();
  d.c.daemon_closed("a", DaemonEnd::not_started, "ssh: cannot connect", t0() + 1s);
  auto cmds = d.drain();
  EXPECT_TRUE(Driver::only<command::Signal>(cmds).empty());
  auto ports = Driver::only<command::ReservePort>(cmds);
  ASSERT_EQ(ports.size(), 1u);
  EXPECT_EQ(ports[0].host, "b");
  EXPECT_EQ(ports[0].epoch, 2u);
  d.c.port_reserved("b", 2, 4100, "");
  auto spawns = Driver::only<command::Spawn>(d.drain());
  ASSERT_EQ(spawns.size(), 1u);
  EXPECT_EQ(spawns[0].place, (Place{"b", 0}));
  EXPECT_EQ(spawns[0].torch.master_port, 4100);
  EXPECT_EQ(spawns[0].torch.master_addr, "b");
}

// torchrun's variables of a spawned worker come from its epoch's assignment.
TEST(Torchrun, SpawnsCarryTorchrunsView) {
  Driver d(fixed(4));
  d.c.use_hosts({{"a", 1}, {"b", 3}}, t0());
  auto spawns = Driver::only<command::Spawn>(d.drain());
  ASSERT_EQ(spawns.size(), 4u);
  const auto& t = spawns[3].torch;  // b, slot 2
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.world_size, 4);
  EXPECT_EQ(t.local_rank, 2);
  EXPECT_EQ(t.local_world_size, 3);
  EXPECT_EQ(t.group_rank, 1);
  EXPECT_EQ(t.group_world_size, 2);
  EXPECT_EQ(t.master_addr, "a");
  EXPECT_EQ(t.master_port, Driver::port_of(1));
  EXPECT_EQ(t.max_restarts, 0);
}

const char* kRecorded = R"({"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": )"
                        R"("Traceback (most recent call last):\n  File \"t.py\", line 3\nRuntimeError: boom\n", )"
                        R"("timestamp": "1700000000"}}})";

// A failed worker's error file: the root cause told after the failure, and an event. One
// whose failure was seen first as a lost connection is told at its exit.
TEST(Torchrun, AFailedWorkersErrorFileIsTheRootCause) {
  Driver d(fixed(2));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_all();
  d.drain();
  auto e = d.exit_of("b", 0, 1);
  e.error_file = kRecorded;
  e.error_file_size = e.error_file.size();
  d.c.worker_exited("b", e, t0() + 1s);
  auto cmds = d.drain();
  EXPECT_EQ(Driver::said(cmds), "rank 1 (host 'b', slot 0, pid 98110) exited with code 1\n"
                                "root cause (first observed failure):\n"
                                "  time      : 2023-11-14 22:13:20 UTC\n"
                                "  host      : b\n"
                                "  rank      : 1 (local_rank: 0)\n"
                                "  exitcode  : 1 (pid: 98110)\n"
                                "  message   : RuntimeError: boom\n"
                                "  traceback : Traceback (most recent call last):\n"
                                "                File \"t.py\", line 3\n"
                                "              RuntimeError: boom\n");
  auto ev = Driver::event(cmds, "worker_error");
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->fields["message"], "RuntimeError: boom");
  EXPECT_EQ(ev->fields["rank"], 1);
  EXPECT_EQ(ev->fields["timestamp"], 1700000000);
  // One that failed after the job ended (stopped by it) is no root cause.
  auto a = d.exit_of("a", 0, 1);
  a.error_file = kRecorded;
  a.error_file_size = a.error_file.size();
  d.c.worker_exited("a", a, t0() + 1s);
  EXPECT_EQ(Driver::event(d.drain(), "worker_error"), nullptr);

  Driver l(elastic(1));
  l.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  l.start_and_join_all();
  auto x = l.exit_of("b", 0, 1);
  l.c.worker_lost(l.place("b", 0), t0() + 1s);
  x.error_file = "not json \x1b[31m";
  x.error_file_size = x.error_file.size();
  l.drain();
  l.c.worker_exited("b", x, t0() + 1s);
  EXPECT_NE(Driver::said(l.drain()).find("  error_file: unreadable: not JSON: not json ?[31m"), std::string::npos);
}


}  // namespace
}  // namespace elasticrun::cmd
