// The epoch controller with a fake clock (as controller_test.cc): waiting for slots
// (--elastic-timeout, dips in discovered hosts, blacklist cool-downs), the reset limit,
// and which workers hold the job's state when others are lost (durable checkpoints).
#include "cmd/controller.h"
#include "tests/cmd/controller_fixture.h"

#include "cmd/exit_codes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>

namespace elasticrun::cmd {
namespace {

TEST(Controller, TooFewSlotsEndsTheJobAfterTheElasticTimeout) {
  Driver d(elastic(2));
  d.c.hosts_changed({{"a", 1}, {"b", 1}}, t0());  // discovery: a usable host may bring more
  d.start_and_join_all();
  d.drain();
  d.c.worker_exited("b", d.exit_of("b", 0, 1), t0() + 1s);
  auto cmds = d.drain();
  EXPECT_EQ(Driver::only<command::AbortEpoch>(cmds).size(), 1u);  // the survivors wait in rejoin
  EXPECT_NE(std::find(Driver::events(cmds).begin(), Driver::events(cmds).end(), "waiting_for_slots"),
            Driver::events(cmds).end());
  EXPECT_EQ(d.c.next_deadline(t0() + 1s), t0() + 101s);
  d.c.tick(t0() + 101s - 1ms);
  EXPECT_FALSE(d.c.finished());
  d.c.tick(t0() + 101s);
  ASSERT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), exit_code::kTimeout);
  EXPECT_NE(Driver::said(d.drain()).find("fewer than 2 slots available for 100 s (--elastic-timeout); 1 now"),
            std::string::npos);
}

// A job that cannot recover ends at once instead of waiting out --elastic-timeout: every
// host of a fixed list blacklisted (all ranks failed), or too few slots left on it, with
// no cool-down to bring one back; or discovery listing only hosts blacklisted for good.
TEST(Controller, SlotsThatCannotComeBackEndTheJobAtOnce) {
  struct Case {
    int min_np;
    bool fixed;
    std::vector<std::string> fail;  // hosts whose worker exits 1, in this order
    std::string said;
  };
  for (const Case& k : std::vector<Case>{
           {1, true, {"a", "b"}, "the fixed host list has 0 usable slots of the 1 needed, and its blacklisted hosts "
                                 "cannot come back (no --blacklist-cooldown-range): 'a': exited with code 1; 'b': "
                                 "exited with code 1"},
           {2, true, {"b"}, "the fixed host list has 1 usable slots of the 2 needed, and its blacklisted hosts "
                            "cannot come back (no --blacklist-cooldown-range): 'b': exited with code 1"},
           {1, false, {"a", "b"}, "every host discovery lists is blacklisted and none can come back (no "
                                  "--blacklist-cooldown-range): 'a': exited with code 1; 'b': exited with code 1"},
       }) {
    Driver d(elastic(k.min_np));
    if (k.fixed)
      d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
    else
      d.c.hosts_changed({{"a", 1}, {"b", 1}}, t0());
    d.start_and_join_all();
    d.drain();
    std::string said;
    for (const auto& h : k.fail) {
      ASSERT_FALSE(d.c.finished()) << said;
      d.c.worker_exited(h, d.exit_of(h, 0, 1), t0() + 1s);
      said += Driver::said(d.drain());
      if (!d.c.finished()) d.start_and_join_all();
    }
    ASSERT_TRUE(d.c.finished()) << said;
    EXPECT_EQ(d.c.exit_code(), exit_code::kWorkerFailed);
    EXPECT_NE(said.find(k.said), std::string::npos) << said;
  }
}

// What may still bring slots keeps the job waiting: a cool-down that will end, or
// discovery that lists a usable host (it may list more) or nothing at all (a dip).
TEST(Controller, SlotsThatMayComeBackAreWaitedFor) {
  for (int k = 0; k < 3; ++k) {
    auto cfg = elastic(k == 1 ? 3 : 2);
    if (k == 0) cfg.cooldown = std::make_pair(std::chrono::milliseconds(5000), std::chrono::milliseconds(9000));
    Driver d(cfg);
    if (k == 0)
      d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
    else
      d.c.hosts_changed({{"a", 1}, {"b", 1}, {"c", 1}}, t0());
    d.start_and_join_all();
    d.drain();
    if (k == 2) d.c.hosts_changed({}, t0() + 1s);  // a dip: every host unlisted
    d.c.worker_exited("a", d.exit_of("a", 0, 1), t0() + 2s);
    auto cmds = d.drain();
    EXPECT_FALSE(d.c.finished()) << k << ": " << Driver::said(cmds);
    EXPECT_NE(Driver::said(cmds).find("blacklisting host 'a'"), std::string::npos) << k << ": " << Driver::said(cmds);
  }
}

TEST(Controller, SlotsComingBackInTimeStartTheNextEpoch) {
  Driver d(elastic(2));
  d.c.hosts_changed({{"a", 1}, {"b", 1}}, t0());
  d.start_and_join_all();
  d.c.worker_exited("b", d.exit_of("b", 0, 1), t0() + 1s);
  d.drain();
  d.c.hosts_changed({{"a", 1}, {"b", 1}, {"c", 1}}, t0() + 50s);
  auto cmds = d.drain();
  auto ev = Driver::events(cmds);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.front(), "host_added");
  EXPECT_NE(std::find(ev.begin(), ev.end(), "slots_available"), ev.end());
  ASSERT_EQ(d.c.assignment().epoch, 2u);
  EXPECT_EQ(d.c.assignment().workers[1].host, "c");
  d.start_and_join_all();
  d.c.tick(t0() + 200s);  // the wait for slots ended: its --elastic-timeout is gone
  EXPECT_FALSE(d.c.finished()) << Driver::said(d.drain());
}

// Discovery lists fewer hosts for a while (a flaky cloud API) and then the same ones
// again: the running epoch was left alone, and the wait for slots is over with the dip,
// not still running out its --elastic-timeout (which ended a healthy job).
TEST(Controller, ADipInDiscoveredHostsThatEndsLeavesNoTimeoutBehind) {
  Driver d(elastic(2));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_and_join_all();
  d.drain();
  d.c.hosts_changed({{"a", 1}}, t0() + 1s);
  auto cmds = d.drain();
  auto ev = Driver::events(cmds);
  EXPECT_NE(std::find(ev.begin(), ev.end(), "waiting_for_slots"), ev.end());
  EXPECT_TRUE(Driver::only<command::AbortEpoch>(cmds).empty());  // a dip interrupts nothing
  EXPECT_TRUE(Driver::only<command::Signal>(cmds).empty());
  d.c.hosts_changed({{"a", 1}, {"b", 1}}, t0() + 2s);
  ev = Driver::events(d.drain());
  EXPECT_NE(std::find(ev.begin(), ev.end(), "slots_available"), ev.end());
  EXPECT_EQ(d.c.next_deadline(t0() + 2s), std::nullopt);
  d.c.tick(t0() + 200s);
  EXPECT_FALSE(d.c.finished()) << Driver::said(d.drain());
  EXPECT_EQ(d.c.assignment().epoch, 1u);
}

// A worker fails while the job waits out such a dip: its epoch cannot go on, so it is
// interrupted then (the survivors wait in rejoin), and once only.
TEST(Controller, AFailureDuringADipInterruptsTheEpochOnce) {
  Driver d(elastic(2));
  d.c.use_hosts({{"a", 1}, {"b", 1}, {"c", 1}}, t0());
  d.start_and_join_all();
  d.c.hosts_changed({{"a", 1}}, t0() + 1s);
  EXPECT_TRUE(Driver::only<command::AbortEpoch>(d.drain()).empty());
  d.c.worker_exited("b", d.exit_of("b", 0, 1), t0() + 2s);
  EXPECT_EQ(Driver::only<command::AbortEpoch>(d.drain()).size(), 1u);
  d.c.worker_exited("c", d.exit_of("c", 0, 1), t0() + 3s);
  EXPECT_TRUE(Driver::only<command::AbortEpoch>(d.drain()).empty());
  EXPECT_FALSE(d.c.finished());
}

// Every worker of the first epoch is lost before it formed (a host whose daemon cannot
// start): nobody trained, so there is no state to lose; the job starts on what is left.
TEST(Controller, LosingAnEpochThatNeverFormedLosesNoState) {
  Driver d(elastic(1, 1));
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());  // epoch 1: a only
  d.drain();
  d.c.daemon_closed("a", DaemonEnd::not_started, "ssh: cannot connect", t0() + 1s);
  auto cmds = d.drain();
  ASSERT_FALSE(d.c.finished()) << Driver::said(cmds);
  ASSERT_EQ(d.c.assignment().epoch, 2u);
  ASSERT_EQ(d.c.assignment().size(), 1);
  EXPECT_EQ(d.c.assignment().workers[0].host, "b");
  d.answer_port();
  EXPECT_EQ(Driver::only<command::Spawn>(d.drain()).size() + Driver::only<command::Spawn>(cmds).size(), 1u);
  EXPECT_EQ(Driver::said(cmds).find("no surviving worker"), std::string::npos);
}

// With --blacklist-cooldown-range a failed host comes back when its cool-down ends, also
// while the job waits for slots (nothing else would wake it: discovery lists the same).
TEST(Controller, ABlacklistedHostComesBackAfterItsCooldown) {
  auto cfg = elastic(2);
  cfg.cooldown = std::make_pair(std::chrono::milliseconds(5000), std::chrono::milliseconds(60000));
  Driver d(cfg);
  d.c.use_hosts({{"a", 1}, {"b", 1}}, t0());
  d.start_and_join_all();
  d.c.worker_exited("b", d.exit_of("b", 0, 1), t0() + 1s);
  auto cmds = d.drain();
  auto bl = Driver::only<command::Emit>(cmds);
  auto it = std::find_if(bl.begin(), bl.end(), [](const auto& e) { return e.event == "host_blacklisted"; });
  ASSERT_NE(it, bl.end());
  EXPECT_EQ(it->fields["cooldown_s"].get<double>(), 5.0);
  EXPECT_EQ(d.c.assignment().epoch, 1u);  // waiting: one slot of two
  EXPECT_EQ(d.c.next_deadline(t0() + 1s), t0() + 6s + 1ms);
  d.c.tick(t0() + 6s);
  EXPECT_EQ(d.c.assignment().epoch, 1u);
  d.c.tick(t0() + 6s + 1ms);
  ASSERT_EQ(d.c.assignment().epoch, 2u);
  ASSERT_NE(d.c.assignment().find("b", 0), nullptr);
  EXPECT_EQ(Driver::only<command::Spawn>(d.drain()).size(), 1u);
}

TEST(Controller, ResetLimitEndsTheJob) {
  auto cfg = elastic(1);
  cfg.reset_limit = 1;
  Driver d(cfg);
  d.c.use_hosts({{"a", 1}, {"b", 1}, {"c", 1}}, t0());
  d.start_and_join_all();
  d.c.worker_exited("c", d.exit_of("c", 0, 1), t0() + 1s);
  EXPECT_FALSE(d.c.finished());
  d.start_and_join_all();
  d.drain();
  d.c.worker_exited("b", d.exit_of("b", 0, 1), t0() + 2s);
  ASSERT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), exit_code::kWorkerFailed);
  EXPECT_NE(Driver::said(d.drain()).find("reset limit 1 reached (rank 1 (host 'b'"), std::string::npos);
}

TEST(Controller, NoSurvivorWithCommittedStateEndsTheJob) {
  Driver d(elastic(1, 2));
  d.c.use_hosts({{"a", 2}, {"c", 1}}, t0());  // epoch 1: both on a
  d.start_and_join_all();
  d.drain();
  // a is blacklisted with both of its workers: c has slots but no committed state.
  d.c.worker_exited("a", d.exit_of("a", 0, 1), t0() + 2s);
  ASSERT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), exit_code::kWorkerFailed);
  EXPECT_NE(Driver::said(d.drain()).find("no surviving worker holds committed state (all of epoch 1 are gone)"),
            std::string::npos);
}

// The second half of a total loss lands before the epoch that replaced the first half
// formed: the worker started for it holds no state, so it is no survivor of the state.
TEST(Controller, AWorkerOfAnEpochThatNeverFormedHoldsNoState) {
  for (bool durable : {false, true}) {
    auto cfg = elastic(1, 2);
    cfg.durable = durable;
    Driver d(cfg);
    d.c.use_hosts({{"a", 1}, {"b", 1}, {"c", 1}}, t0());
    d.start_and_join_all();
    d.c.worker_exited("b", d.exit_of("b", 0, 1), t0() + 1s);
    ASSERT_EQ(d.c.assignment().epoch, 2u);  // a kept as rank 0, c started
    auto c = d.place("c", 0);
    d.c.worker_started("c", 0, d.pid_of(c));
    d.drain();
    d.c.worker_exited("a", d.exit_of("a", 0, 1), t0() + 2s);  // before epoch 2 formed
    auto cmds = d.drain();
    if (!durable) {
      ASSERT_TRUE(d.c.finished());
      EXPECT_EQ(d.c.exit_code(), exit_code::kWorkerFailed);
      EXPECT_NE(Driver::said(cmds).find("no surviving worker holds committed state (those left were started for "
                                        "epoch 2, which never formed"),
                std::string::npos)
          << Driver::said(cmds);
    } else {
      ASSERT_FALSE(d.c.finished());
      ASSERT_EQ(d.c.assignment().epoch, 3u);
      EXPECT_EQ(d.c.assignment().workers[0].host, "c");  // rank 0 without state: it restores
      EXPECT_NE(Driver::said(cmds).find("epoch 3 restores from the newest durable checkpoint"), std::string::npos)
          << Driver::said(cmds);
    }
  }
}

// With durable checkpoints the same loss starts an epoch of new workers, which restore
// from the newest checkpoint by themselves (the library's rank 0 that holds no state).
TEST(Controller, NoSurvivorWithDurableCheckpointsStartsAFreshEpoch) {
  auto cfg = elastic(1, 2);
  cfg.durable = true;
  Driver d(cfg);
  d.c.use_hosts({{"a", 2}, {"c", 1}}, t0());
  d.start_and_join_all();
  d.drain();
  d.c.worker_exited("a", d.exit_of("a", 0, 1), t0() + 2s);
  ASSERT_FALSE(d.c.finished());
  auto cmds = d.drain();
  ASSERT_EQ(d.c.assignment().epoch, 2u);
  ASSERT_EQ(d.c.assignment().size(), 1);
  EXPECT_EQ(d.c.assignment().workers[0].host, "c");
  auto spawns = Driver::only<command::Spawn>(cmds);
  ASSERT_EQ(spawns.size(), 1u);
  EXPECT_EQ(spawns[0].place, (Place{"c", 0}));
  EXPECT_NE(Driver::said(cmds).find("every worker holding the job's state is gone: epoch 2 restores from the newest "
                                    "durable checkpoint"),
            std::string::npos)
      << Driver::said(cmds);
  bool flagged = false;
  for (const auto& e : Driver::only<command::Emit>(cmds))
    if (e.event == "reset") flagged = e.fields.at("from_checkpoint").get<bool>();
  EXPECT_TRUE(flagged);
  // The new epoch forms and finishes like any other.
  d.start_and_join_all();
  d.c.worker_exited("c", d.exit_of("c", 0, 0), t0() + 3s);
  d.drain();
  EXPECT_TRUE(d.c.finished());
  EXPECT_EQ(d.c.exit_code(), 0);
}

// The holder rule: once the job's workers report their syncs, a worker holds the state
// only after its own report. b's two workers joined the grown epoch 2 but a, the only
// holder, was lost before they synced: they hold their initial state, and one of them
// as rank 0 would give that to everyone. With b's report, b carries the state on.
TEST(Controller, AWorkerHoldsTheStateOnceItsSyncReported) {
  for (bool b_synced : {false, true}) {
    Driver d(elastic(1, 3));
    d.c.hosts_changed({{"a", 1}}, t0());
    d.start_and_join_all();
    d.c.worker_synced(d.place("a", 0), 1, 0);
    d.c.hosts_changed({{"a", 1}, {"b", 2}}, t0() + 1s);
    ASSERT_EQ(d.c.assignment().epoch, 2u);
    d.start_and_join_all();
    if (b_synced)
      for (int slot : {0, 1}) d.c.worker_synced(d.place("b", slot), 2, 4);
    auto synced = d.drain();
    d.c.worker_exited("a", d.exit_of("a", 0, 0, SIGKILL), t0() + 2s);
    auto cmds = d.drain();
    if (!b_synced) {
      ASSERT_TRUE(d.c.finished()) << Driver::said(cmds);
      EXPECT_EQ(d.c.exit_code(), exit_code::kWorkerFailed);
      EXPECT_NE(Driver::said(cmds).find("no surviving worker holds committed state"), std::string::npos)
          << Driver::said(cmds);
      continue;
    }
    ASSERT_FALSE(d.c.finished()) << Driver::said(cmds);
    ASSERT_EQ(d.c.assignment().epoch, 3u);
    EXPECT_EQ(d.c.assignment().workers[0].host, "b");
    auto events = Driver::only<command::Emit>(synced);
    auto e = std::find_if(events.begin(), events.end(),
                          [](const auto& x) { return x.event == "state_synced" && x.fields.at("host") == "b"; });
    ASSERT_NE(e, events.end());
    EXPECT_EQ(e->fields.at("slot"), 0);
    EXPECT_EQ(e->fields.at("epoch"), 2);
    EXPECT_EQ(e->fields.at("commits"), 4);
  }
}

}  // namespace
}  // namespace elasticrun::cmd
