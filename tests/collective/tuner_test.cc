// The tuner's state machine (host/tuner.h): which candidate each call of a size class
// runs, when the ranks must agree, and what they then decide. Pure: no ranks, no clock.
#include "host/host_communicator.h"
#include "host/tuner.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace elasticrun::collective {
namespace {

using Kind = Tuner::Kind;

constexpr int kRun = Tuner::kRun;  // untimed calls, then the timed ones

// Runs a class's calls with the given times per candidate (as many candidates as times):
// kWarm calls of the fixed choice, a run of it, then one of each alternative, the warm
// calls and each run's first calls far slower (they are not counted), and of the timed
// ones one far faster (a full token bucket) and one far slower: only each run's median
// counts. Returns the call after which the tuner asked for the agreement (-1: never).
int trials(Tuner& t, Kind k, std::size_t bytes, std::vector<double> times) {
  const int n = static_cast<int>(times.size());
  for (int call = 0; call <= Tuner::calls(n) + 2; ++call) {
    const int c = t.pick(k, bytes);
    const int i = call - Tuner::kWarm;
    EXPECT_EQ(c, i < 0 ? 0 : i / kRun) << "call " << call;
    EXPECT_EQ(t.timed(k, bytes), i >= 0 && i < n * kRun && i % kRun >= Tuner::kSettle) << "call " << call;
    const int at = i < 0 ? 0 : i % kRun - Tuner::kSettle;  // < 0: untimed
    const int mid = Tuner::kTrials / 2;
    double secs = at < 0 ? 1.0 : times[c] * (at < mid ? 0.1 : at == mid ? 1.0 : 9.0);
    if (t.record(k, bytes, n, c, secs)) return call;
  }
  return -1;
}

// The confirming round after `finalist` won the first: a run of it, then one of the fixed
// choice, timed as in trials(). Returns the call after which the tuner asked for the
// agreement (-1: never).
int confirm(Tuner& t, Kind k, std::size_t bytes, int candidates, int finalist, double finalist_time,
            double fixed_time) {
  for (int call = 0; call <= 2 * kRun + 2; ++call) {
    const int c = t.pick(k, bytes);
    EXPECT_EQ(c, call < kRun ? finalist : 0) << "call " << call;
    EXPECT_EQ(t.timed(k, bytes), call < 2 * kRun && call % kRun >= Tuner::kSettle) << "call " << call;
    const int at = call % kRun - Tuner::kSettle, mid = Tuner::kTrials / 2;
    const double time = c == 0 ? fixed_time : finalist_time;
    if (t.record(k, bytes, candidates, c, at < 0 ? 1.0 : time * (at < mid ? 0.1 : at == mid ? 1.0 : 9.0)))
      return call;
  }
  return -1;
}

TEST(Tuner, EachCandidateRunsItsTrialsThenTheRanksAgree) {
  Tuner t;
  EXPECT_EQ(trials(t, Kind::allreduce, 10000, {2e-3, 1e-3}), Tuner::calls(2) - 1);
  Tuner::Times mine = t.samples(Kind::allreduce, 10000);
  EXPECT_DOUBLE_EQ(mine[0], 2e-3);
  EXPECT_DOUBLE_EQ(mine[1], 1e-3);
  // The sums over (say) three ranks put the alternative ahead: not yet decided, it runs
  // again against the fixed choice, then the ranks agree once more.
  EXPECT_EQ(t.decide(Kind::allreduce, 10000, 2, {6e-3, 3e-3}), 1);
  EXPECT_FALSE(t.decided(Kind::allreduce, 10000));
  EXPECT_EQ(confirm(t, Kind::allreduce, 10000, 2, 1, 1e-3, 2e-3), 2 * kRun - 1);
  mine = t.samples(Kind::allreduce, 10000);
  EXPECT_DOUBLE_EQ(mine[0], 2e-3);
  EXPECT_DOUBLE_EQ(mine[1], 1e-3);
  // Confirmed: from then on every call of the class runs it, and nothing more is recorded.
  EXPECT_EQ(t.decide(Kind::allreduce, 10000, 2, {6e-3, 3e-3}), 1);
  EXPECT_TRUE(t.decided(Kind::allreduce, 10000));
  for (std::size_t bytes : {8193u, 10000u, 16384u}) EXPECT_EQ(t.pick(Kind::allreduce, bytes), 1) << bytes;
  EXPECT_FALSE(t.record(Kind::allreduce, 10000, 2, 1, 1e-6));
  EXPECT_FALSE(t.timed(Kind::allreduce, 10000));
  EXPECT_EQ(t.pick(Kind::allreduce, 10000), 1);
}

// What one disturbance did on 2 shared cores: the fixed choice's five calls took twice
// their usual time, and an alternative twice as slow as it looked ahead. Measured again, the
// fixed choice wins and stays.
TEST(Tuner, AnAlternativeThatDoesNotWinTwiceLosesToTheFixedChoice) {
  Tuner t;
  trials(t, Kind::allreduce, 64, {280e-6, 140e-6, 200e-6});
  EXPECT_EQ(t.decide(Kind::allreduce, 64, 3, t.samples(Kind::allreduce, 64)), 1);
  EXPECT_FALSE(t.decided(Kind::allreduce, 64));
  EXPECT_EQ(t.pick(Kind::allreduce, 64), 1);
  EXPECT_EQ(confirm(t, Kind::allreduce, 64, 3, 1, 250e-6, 120e-6), 2 * kRun - 1);
  EXPECT_EQ(t.decide(Kind::allreduce, 64, 3, t.samples(Kind::allreduce, 64)), 0);
  EXPECT_TRUE(t.decided(Kind::allreduce, 64));
  EXPECT_EQ(t.pick(Kind::allreduce, 64), 0);
  EXPECT_FALSE(t.timed(Kind::allreduce, 64));
  // The second round must also clear the margin: 3 % faster again is not enough.
  Tuner u;
  trials(u, Kind::broadcast, 64, {2e-3, 1e-3});
  u.decide(Kind::broadcast, 64, 2, u.samples(Kind::broadcast, 64));
  confirm(u, Kind::broadcast, 64, 2, 1, 0.97e-3, 1e-3);
  EXPECT_EQ(u.decide(Kind::broadcast, 64, 2, u.samples(Kind::broadcast, 64)), 0);
  // And the finalist is the one compared: a third candidate's stale first-round time is not.
  Tuner v;
  trials(v, Kind::allreduce, 64, {3e-3, 1e-3, 2e-3});
  v.decide(Kind::allreduce, 64, 3, v.samples(Kind::allreduce, 64));
  confirm(v, Kind::allreduce, 64, 3, 1, 1e-3, 3e-3);
  EXPECT_EQ(v.decide(Kind::allreduce, 64, 3, v.samples(Kind::allreduce, 64)), 1);
}

TEST(Tuner, ThreeCandidatesRunInTurnAndTheFastestAlternativeWins) {
  Tuner t;
  EXPECT_EQ(trials(t, Kind::allreduce, 10000, {3e-3, 2e-3, 1e-3}), Tuner::calls(3) - 1);
  Tuner::Times mine = t.samples(Kind::allreduce, 10000);
  EXPECT_DOUBLE_EQ(mine[0], 3e-3);
  EXPECT_DOUBLE_EQ(mine[1], 2e-3);
  EXPECT_DOUBLE_EQ(mine[2], 1e-3);
  EXPECT_EQ(t.decide(Kind::allreduce, 10000, 3, mine), 2);
  EXPECT_EQ(t.pick(Kind::allreduce, 10000), 2);
  confirm(t, Kind::allreduce, 10000, 3, 2, 1e-3, 3e-3);
  EXPECT_EQ(t.decide(Kind::allreduce, 10000, 3, t.samples(Kind::allreduce, 10000)), 2);
  EXPECT_EQ(t.pick(Kind::allreduce, 10000), 2);
  Tuner u;
  trials(u, Kind::broadcast, 100, {3e-3, 1e-3, 2e-3});
  EXPECT_EQ(u.decide(Kind::broadcast, 100, 3, u.samples(Kind::broadcast, 100)), 1);
  EXPECT_EQ(u.pick(Kind::broadcast, 100), 1);
  // The margin is against the fixed choice: 3 % and 2 % faster keep it.
  Tuner v;
  trials(v, Kind::broadcast, 100, {1e-3, 0.97e-3, 0.98e-3});
  EXPECT_EQ(v.decide(Kind::broadcast, 100, 3, v.samples(Kind::broadcast, 100)), 0);
}

// Where waits sleep, every algorithm is a candidate twice: as it waits by default, then
// with waits that sleep at once, in the same order after all of them. A sleeping
// alternative (direct+sleep, the sixth) is chosen like any other: it runs its trials in
// turn, wins the first round, and stays after winning the second against the fixed choice.
TEST(Tuner, WhereWaitsSleepEachAlgorithmIsACandidateTwice) {
  const Tuner::Candidates c{{"rhd", "rd", "direct"}, 3, true};
  EXPECT_EQ(c.total(), 6);
  EXPECT_EQ(c.name(0), "rhd");
  EXPECT_EQ(c.name(3), "rhd+sleep");
  EXPECT_EQ(c.name(5), "direct+sleep");
  EXPECT_EQ(c.algorithm(4), 1);
  EXPECT_FALSE(c.sleeps(2));
  EXPECT_TRUE(c.sleeps(3));
  const Tuner::Candidates awake{{"binomial", "direct", "direct"}, 1, false};
  EXPECT_EQ(awake.total(), 1);  // one algorithm, waits that do not sleep: nothing to tune
  const Tuner::Candidates one{{"binomial", "direct", "direct"}, 1, true};
  EXPECT_EQ(one.total(), 2);    // one algorithm, tuned for its waits
  EXPECT_EQ(one.name(1), "binomial+sleep");
  Tuner t;
  EXPECT_EQ(trials(t, Kind::broadcast, 300000, {6e-3, 5e-3, 7e-3, 6e-3, 4e-3, 3e-3}), Tuner::calls(6) - 1);
  EXPECT_EQ(t.decide(Kind::broadcast, 300000, 6, t.samples(Kind::broadcast, 300000)), 5);
  confirm(t, Kind::broadcast, 300000, 6, 5, 3e-3, 6e-3);
  EXPECT_EQ(t.decide(Kind::broadcast, 300000, 6, t.samples(Kind::broadcast, 300000)), 5);
  EXPECT_EQ(t.pick(Kind::broadcast, 300000), 5);
}

// A world of one whose waits sleep: records what run_tuned asks of them.
class Alone final : public Transport {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Request isend(int, std::uint64_t, const void*, std::size_t) override { throw Error("alone: no peer"); }
  Request irecv(int, std::uint64_t, void*, std::size_t) override { throw Error("alone: no peer"); }
  void wait(std::span<Request>, Clock::time_point, const char*) override {}
  void cancel_all() override {}
  bool sleeps() const override { return true; }
  void sleep_at_once(bool yes) override { sleeping = yes; }
  bool sleeping = false;
};

// run_tuned runs each candidate with its waits: rd, direct awake, then rd+sleep,
// direct+sleep asleep at once; direct+sleep, far the fastest, wins both rounds, and from
// then on every call runs direct with waits that sleep at once.
TEST(Tuner, RunTunedSetsEachCandidatesWaits) {
  Alone tp;
  Workspace ws;
  Step st{tp, Clock::now() + std::chrono::seconds(30), 0, ws, 4096, 2, "test"};
  Tuner t;
  const Tuner::Candidates c{{"rd", "direct", "direct"}, 2, true};
  std::vector<std::pair<int, bool>> ran;  // (algorithm, sleeping at once)
  std::string decision;
  for (int call = 0; call < Tuner::most_calls(4) + 3; ++call)
    run_tuned(st, t, Kind::allreduce, 64, c, [&](const std::string& text) { decision = text; }, [&](int a) {
      ran.emplace_back(a, tp.sleeping);
      std::this_thread::sleep_for(std::chrono::microseconds(a == 1 && tp.sleeping ? 300 : 2000));
    });
  ASSERT_EQ(ran.size(), static_cast<std::size_t>(Tuner::most_calls(4) + 3));
  auto expect = [&](int from, int to, int algorithm, bool sleeping) {
    for (int i = from; i < to; ++i) EXPECT_EQ(ran[i], std::make_pair(algorithm, sleeping)) << "call " << i;
  };
  constexpr int w = Tuner::kWarm, r = kRun;
  expect(0, w, 0, false);
  expect(w, w + r, 0, false);
  expect(w + r, w + 2 * r, 1, false);
  expect(w + 2 * r, w + 3 * r, 0, true);
  expect(w + 3 * r, w + 4 * r, 1, true);
  expect(w + 4 * r, w + 5 * r, 1, true);   // the confirming round: direct+sleep,
  expect(w + 5 * r, w + 6 * r, 0, false);  // then the fixed choice
  expect(w + 6 * r, w + 6 * r + 3, 1, true);
  EXPECT_NE(decision.find(": direct+sleep"), std::string::npos) << decision;
}

TEST(Tuner, TheAlternativeMustWinByTheMargin) {
  Tuner t;
  trials(t, Kind::allreduce, 10000, {1e-3, 0.97e-3});
  EXPECT_EQ(t.decide(Kind::allreduce, 10000, 2, {1e-3, 0.97e-3}), 0);  // 3 % faster: not enough
  EXPECT_TRUE(t.decided(Kind::allreduce, 10000));                       // and no second round
  EXPECT_EQ(t.pick(Kind::allreduce, 10000), 0);
  Tuner u;
  trials(u, Kind::broadcast, 10000, {1e-3, 0.7e-3});
  EXPECT_EQ(u.decide(Kind::broadcast, 10000, 2, {1e-3, 0.7e-3}), 1);
  confirm(u, Kind::broadcast, 10000, 2, 1, 0.7e-3, 1e-3);
  EXPECT_EQ(u.decide(Kind::broadcast, 10000, 2, {1e-3, 0.7e-3}), 1);
  EXPECT_TRUE(u.decided(Kind::broadcast, 10000));
  // 10 % faster is within what 2 shared cores vary by: not enough either.
  Tuner v;
  trials(v, Kind::broadcast, 10000, {1e-3, 0.9e-3});
  EXPECT_EQ(v.decide(Kind::broadcast, 10000, 2, {1e-3, 0.9e-3}), 0);
  EXPECT_TRUE(v.decided(Kind::broadcast, 10000));
}

TEST(Tuner, ClassesAndKindsAreTunedApart) {
  Tuner t;
  trials(t, Kind::allreduce, 10000, {2e-3, 1e-3});
  t.decide(Kind::allreduce, 10000, 2, {2e-3, 1e-3});
  confirm(t, Kind::allreduce, 10000, 2, 1, 1e-3, 2e-3);
  t.decide(Kind::allreduce, 10000, 2, {2e-3, 1e-3});
  // 16385 bytes is the next class, and broadcast of the same size its own: both untried.
  EXPECT_EQ(t.pick(Kind::allreduce, 16385), 0);
  EXPECT_EQ(t.pick(Kind::broadcast, 10000), 0);
  EXPECT_EQ(trials(t, Kind::allreduce, 16385, {1e-3, 2e-3, 3e-3}), Tuner::calls(3) - 1);
  EXPECT_EQ(t.decide(Kind::allreduce, 16385, 3, {1e-3, 2e-3, 3e-3}), 0);
  EXPECT_EQ(t.pick(Kind::allreduce, 10000), 1);
}

TEST(Tuner, DirectJoinsAClassWithinItsLimits) {
  constexpr std::size_t kMax = 512 * 1024;
  EXPECT_TRUE(Tuner::direct_fits(8, 64 * 1024, 16, kMax));       // 7 x 64 KiB = 448 KiB
  EXPECT_FALSE(Tuner::direct_fits(8, 64 * 1024 + 1, 16, kMax));  // the next class: 7 x 128 KiB
  EXPECT_TRUE(Tuner::direct_fits(8, 40000, 16, kMax));           // by the class's largest call
  EXPECT_TRUE(Tuner::direct_fits(3, 8, 16, kMax));
  EXPECT_FALSE(Tuner::direct_fits(2, 8, 16, kMax));              // direct is rd among 2
  EXPECT_TRUE(Tuner::direct_fits(16, 8, 16, kMax));
  EXPECT_FALSE(Tuner::direct_fits(17, 8, 16, kMax));
}

// The communicator's own limit: among 8 ranks direct up to 32 KiB (7 copies of it, 224
// KiB), and two-shot from 64 KiB; among 4 direct up to 64 KiB.
TEST(Tuner, DirectsDefaultLimit) {
  const HostCommConfig cfg;
  EXPECT_TRUE(Tuner::direct_fits(8, 32 * 1024, cfg.direct_max_ranks, cfg.direct_max_bytes));
  EXPECT_FALSE(Tuner::direct_fits(8, 32 * 1024 + 1, cfg.direct_max_ranks, cfg.direct_max_bytes));
  EXPECT_TRUE(Tuner::direct_fits(4, 64 * 1024, cfg.direct_max_ranks, cfg.direct_max_bytes));
  EXPECT_FALSE(Tuner::direct_fits(4, 64 * 1024 + 1, cfg.direct_max_ranks, cfg.direct_max_bytes));
}

// Each allreduce class's candidates by name, fixed choice first.
std::string names(const Tuner::Candidates& c) {
  std::string s;
  for (int i = 0; i < c.total(); ++i) s += c.name(i) + ",";
  return s;
}

TEST(Tuner, RdClassesTryHalvingWhereEveryCallHoldsAnElementPerRank) {
  constexpr std::size_t kAbove = 512;
  auto of = [](const char* fixed, int n, std::size_t bytes, bool direct, bool sleeping = false) {
    return names(Tuner::allreduce_candidates(fixed, n, bytes, kAbove, direct, n >= 3, sleeping));
  };
  // rhd's classes try rd, and direct where it fits, else two-shot (among 3 or more).
  EXPECT_EQ(of("rhd", 8, 10000, true), "rhd,rd,direct,");
  EXPECT_EQ(of("rhd", 8, 100000, false), "rhd,rd,twoshot,");
  EXPECT_EQ(of("rhd", 2, 10000, false, true), "rhd,rd,rhd+sleep,rd+sleep,");
  // rd's try rhd from the class above halving_above: 513-1024 bytes, not 257-512.
  EXPECT_EQ(of("rd", 8, 513, true), "rd,rhd,direct,");
  EXPECT_EQ(of("rd", 8, 4096, true), "rd,rhd,direct,");
  EXPECT_EQ(of("rd", 8, 512, true), "rd,direct,");
  EXPECT_EQ(of("rd", 2, 2048, false), "rd,rhd,");
  EXPECT_EQ(of("rd", 2, 100, false), "rd,");
  // Among 128 ranks a call of the 513-1024 class may hold 65 doubles: fewer than the ranks.
  EXPECT_EQ(of("rd", 128, 1000, false), "rd,");
  EXPECT_EQ(of("rd", 128, 1025, false), "rd,rhd,");
}

TEST(Tuner, RingClassesTryHalvingAndTwoShot) {
  EXPECT_EQ(names(Tuner::allreduce_candidates("ring", 8, 300000, 512, false, true, false)), "ring,rhd,twoshot,");
  EXPECT_EQ(names(Tuner::allreduce_candidates("ring", 2, 300000, 512, false, false, true)),
            "ring,rhd,ring+sleep,rhd+sleep,");
}

TEST(Tuner, SizeClassesArePowerOfTwoRanges) {
  EXPECT_EQ(Tuner::size_class(8192), std::make_pair(std::size_t{4096}, std::size_t{8192}));
  EXPECT_EQ(Tuner::size_class(8193), std::make_pair(std::size_t{8192}, std::size_t{16384}));
  EXPECT_EQ(Tuner::size_class(1), std::make_pair(std::size_t{0}, std::size_t{1}));
}

}  // namespace
}  // namespace elasticrun::collective
