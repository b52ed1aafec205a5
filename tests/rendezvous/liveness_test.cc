// Liveness, the worker timeout's bookkeeping, with a fake clock: the deadline and one
// tick before it, hearing, forgetting, and a stalled owner.
#include "rendezvous/liveness.h"

#include <gtest/gtest.h>

namespace elasticrun::rendezvous {
namespace {

using namespace std::chrono_literals;
using TimePoint = LivenessClock::time_point;

TimePoint t0() { return TimePoint{} + 1000s; }

std::vector<int> keys(const std::vector<Liveness<int>::Silent>& s) {
  std::vector<int> out;
  for (const auto& x : s) out.push_back(x.key);
  return out;
}

// Checks every tick from `from` up to and including `to`, as the server's timer does;
// returns the keys given up, in order.
std::vector<int> run(Liveness<int>& l, TimePoint from, TimePoint to) {
  std::vector<int> out;
  for (TimePoint t = from; t <= to; t += l.tick())
    for (int k : keys(l.check(t))) out.push_back(k);
  return out;
}

TEST(Liveness, IntervalAndTickFollowTheTimeout) {
  EXPECT_EQ(heartbeat_interval(5000ms), 1000ms);
  EXPECT_EQ(heartbeat_interval(1000ms), 200ms);
  EXPECT_EQ(Liveness<int>(5000ms).tick(), 250ms);
  EXPECT_EQ(Liveness<int>(1000ms).tick(), 50ms);
  EXPECT_EQ(Liveness<int>(100ms).tick(), 10ms);
}

TEST(Liveness, SilentForTheTimeoutIsGivenUpAndOneTickBeforeIsNot) {
  Liveness<int> l(5000ms);
  l.watch(1, t0());
  EXPECT_TRUE(l.check(t0() + 5000ms - 1ms).empty());
  auto silent = l.check(t0() + 5000ms);
  ASSERT_EQ(silent.size(), 1u);
  EXPECT_EQ(silent[0].key, 1);
  EXPECT_EQ(silent[0].silent, 5000ms);
  EXPECT_EQ(l.size(), 0u);  // given up once
  EXPECT_TRUE(l.check(t0() + 5001ms).empty());
}

TEST(Liveness, HeartbeatsKeepAWorkerInAndItsLastOneStartsTheClock) {
  Liveness<int> l(1000ms);
  l.watch(1, t0());
  l.watch(2, t0());
  TimePoint t = t0();
  for (int i = 0; i < 50; ++i) {  // 10 s of beats every 200 ms from worker 2 only
    t += 200ms;
    l.heard(2, t);
    for (TimePoint c = t - 150ms; c <= t; c += l.tick()) EXPECT_NE(keys(l.check(c)), std::vector<int>{2});
  }
  EXPECT_EQ(l.size(), 1u);  // worker 1 went long ago
  // Worker 2 stops right after a beat at t.
  EXPECT_EQ(run(l, t + l.tick(), t + 1000ms - 1ms), std::vector<int>{});
  EXPECT_EQ(keys(l.check(t + 1000ms)), std::vector<int>{2});
}

TEST(Liveness, LongestSilentComeFirst) {
  Liveness<int> l(1000ms);
  l.watch(1, t0());
  l.watch(2, t0() + 10ms);
  l.watch(3, t0() + 20ms);
  l.heard(1, t0() + 30ms);
  EXPECT_EQ(keys(l.check(t0() + 2s)), (std::vector<int>{2, 3, 1}));
}

TEST(Liveness, ForgottenAndUnwatchedKeysAreNeverGivenUp) {
  Liveness<int> l(1000ms);
  l.watch(1, t0());
  l.watch(2, t0());
  l.forget(1);
  l.heard(3, t0());  // not watched: hearing it does not start watching it
  EXPECT_EQ(l.size(), 1u);
  EXPECT_EQ(keys(l.check(t0() + 1s)), std::vector<int>{2});
}

// The owner's own timer ran 2 s late: the workers' heartbeats wait unread in their
// sockets. Nobody is given up at that check; a worker silent from then on still is, one
// timeout later.
TEST(Liveness, ACheckFarBehindItsTimeGivesUpNobody) {
  Liveness<int> l(1000ms);
  l.watch(1, t0());
  EXPECT_TRUE(run(l, t0(), t0() + 500ms).empty());
  TimePoint late = t0() + 500ms + l.tick() + 2s;
  EXPECT_TRUE(l.check(late).empty());
  EXPECT_EQ(l.size(), 1u);
  EXPECT_EQ(run(l, late + l.tick(), late + 1000ms - 1ms), std::vector<int>{});
  EXPECT_EQ(keys(l.check(late + 1000ms)), std::vector<int>{1});
}

// A check a little late (scheduling noise, under the slack of a quarter timeout) is no
// stall: the silent worker is given up there.
TEST(Liveness, ACheckALittleLateIsNoStall) {
  Liveness<int> l(1000ms);
  l.watch(1, t0());
  EXPECT_TRUE(run(l, t0(), t0() + 900ms).empty());
  EXPECT_EQ(keys(l.check(t0() + 900ms + l.tick() + 200ms)), std::vector<int>{1});
}

}  // namespace
}  // namespace elasticrun::rendezvous
