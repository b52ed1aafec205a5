// --request-hosts-script's policy with a fake clock: what it asks for, what it gives back,
// how often, and never before the job runs.
#include "cmd/host_requests.h"

#include <gtest/gtest.h>

namespace elasticrun::cmd {
namespace {

using namespace std::chrono_literals;
using Kind = RequestAction::Kind;

RequestView view(int max_np, int usable, std::set<std::string> offered, std::set<std::string> in_use,
                 bool running = true) {
  return {max_np, usable, std::move(offered), std::move(in_use), running};
}

TEST(RequestPolicy, AsksForTheSlotsUpToMaxNpOncePerInterval) {
  RequestPolicy p(60s);
  RequestClock::time_point t{};
  auto a = p.next(t, view(8, 3, {"a", "b", "c"}, {"a", "b", "c"}));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, Kind::request);
  EXPECT_EQ(a->slots, 5);
  EXPECT_FALSE(p.next(t + 59s, view(8, 3, {"a", "b", "c"}, {"a", "b", "c"})));  // rate-limited
  a = p.next(t + 60s, view(8, 5, {"a", "b", "c", "d"}, {"a", "b", "c", "d"}));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->slots, 3);  // what is still missing
  EXPECT_FALSE(p.next(t + 200s, view(8, 8, {"a"}, {"a"})));  // at --max-np: nothing
}

TEST(RequestPolicy, NothingWithoutACapOrBeforeTheJobRuns) {
  RequestPolicy p(1s);
  RequestClock::time_point t{};
  EXPECT_FALSE(p.next(t, view(0, 1, {"a"}, {"a"})));                // no --max-np
  EXPECT_FALSE(p.next(t + 10s, view(4, 1, {"a", "b"}, {}, false)));  // no epoch yet: b is no idle host
  EXPECT_FALSE(p.next(t + 20s, view(1, 1, {"a", "b"}, {}, false)));
}

TEST(RequestPolicy, GivesBackHostsUnusedForAWholeInterval) {
  RequestPolicy p(10s);
  RequestClock::time_point t{};
  // max-np 2 reached on a and b; c and d are offered but unused
  EXPECT_FALSE(p.next(t, view(2, 4, {"a", "b", "c", "d"}, {"a", "b"})));
  // d is used at the next epoch before the interval is over: only c is given back
  EXPECT_FALSE(p.next(t + 5s, view(2, 4, {"a", "b", "c", "d"}, {"a", "d"})));
  auto a = p.next(t + 10s, view(2, 4, {"a", "b", "c", "d"}, {"a", "d"}));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, Kind::release);
  EXPECT_EQ(a->hosts, (std::vector<std::string>{"c"}));
  // still offered after the release: given back again after another interval, with b,
  // which became unused at 5 s
  EXPECT_FALSE(p.next(t + 15s, view(2, 4, {"a", "b", "c", "d"}, {"a", "d"})));
  a = p.next(t + 20s, view(2, 4, {"a", "b", "c", "d"}, {"a", "d"}));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->hosts, (std::vector<std::string>{"b", "c"}));
}

TEST(RequestPolicy, AHostThatLeavesAndComesBackStartsItsIdleTimeAgain) {
  RequestPolicy p(10s);
  RequestClock::time_point t{};
  EXPECT_FALSE(p.next(t, view(1, 2, {"a", "b"}, {"a"})));
  EXPECT_FALSE(p.next(t + 6s, view(1, 1, {"a"}, {"a"})));        // b gone
  EXPECT_FALSE(p.next(t + 12s, view(1, 2, {"a", "b"}, {"a"})));  // back: idle since 12 s
  EXPECT_FALSE(p.next(t + 21s, view(1, 2, {"a", "b"}, {"a"})));
  auto a = p.next(t + 22s, view(1, 2, {"a", "b"}, {"a"}));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->hosts, (std::vector<std::string>{"b"}));
}

}  // namespace
}  // namespace elasticrun::cmd
