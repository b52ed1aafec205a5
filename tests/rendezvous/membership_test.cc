// Elastic membership rules, with the clock passed in (no sleeping).
#include "rendezvous/membership.h"

#include <gtest/gtest.h>

namespace elasticrun::rendezvous {
namespace {

using namespace std::chrono_literals;
using discovery::Host;

TimePoint t0() { return TimePoint{} + 1000s; }

std::vector<std::string> hosts_of(const Assignment& a) {
  std::vector<std::string> out;
  for (const auto& w : a.workers) out.push_back(w.host + ":" + std::to_string(w.slot));
  return out;
}

std::set<Place> all_alive(const Assignment& a) {
  std::set<Place> s;
  for (const auto& w : a.workers) s.insert({w.host, w.slot});
  return s;
}

TEST(Membership, FirstEpochFollowsDiscoveryOrderUpToMaxNp) {
  Membership m({1, 3, std::nullopt});
  m.set_discovered({{"b", 2}, {"a", 2}});
  auto p = m.plan(Assignment{}, {}, t0());
  ASSERT_TRUE(p);
  EXPECT_EQ(p->assignment.epoch, 1u);
  EXPECT_EQ(hosts_of(p->assignment), (std::vector<std::string>{"b:0", "b:1", "a:0"}));
  EXPECT_EQ(p->spawn.size(), 3u);
}

TEST(Membership, SurvivorsKeepTheirOrderAndNewHostsAreAppended) {
  Membership m({1, 0, std::nullopt});
  m.set_discovered({{"a", 1}, {"b", 1}, {"c", 1}});
  auto first = m.plan(Assignment{}, {}, t0())->assignment;
  // Discovery now lists a new host first and drops b: survivors a, c keep their order.
  m.set_discovered({{"z", 1}, {"c", 1}, {"a", 1}});
  auto alive = all_alive(first);
  alive.erase({"b", 0});
  auto p = m.plan(first, alive, t0());
  ASSERT_TRUE(p);
  EXPECT_EQ(hosts_of(p->assignment), (std::vector<std::string>{"a:0", "c:0", "z:0"}));
  EXPECT_EQ(p->assignment.workers[0].host, "a");  // rank 0 is a survivor
  EXPECT_EQ(p->keep.size(), 2u);
  ASSERT_EQ(p->spawn.size(), 1u);
  EXPECT_EQ(p->spawn[0].host, "z");
}

// A worker started for an epoch that never formed holds no state: a survivor that does
// goes first, so that rank 0 (whose state every rank takes) is one of those.
TEST(Membership, SurvivorsHoldingStateComeFirst) {
  Membership m({1, 0, std::nullopt});
  m.set_discovered({{"n", 1}, {"b", 1}});
  Assignment current = m.plan(Assignment{}, {}, t0())->assignment;  // n rank 0, b rank 1
  auto p = m.plan(current, all_alive(current), t0(), {{"b", 0}});
  ASSERT_TRUE(p);
  EXPECT_EQ(hosts_of(p->assignment), (std::vector<std::string>{"b:0", "n:0"}));
  // Without holders, the old order.
  EXPECT_EQ(hosts_of(m.plan(current, all_alive(current), t0())->assignment), (std::vector<std::string>{"n:0", "b:0"}));
}

TEST(Membership, RemovedHostsWorkersAreStopped) {
  Membership m({1, 0, std::nullopt});
  m.set_discovered({{"a", 1}, {"b", 2}});
  auto first = m.plan(Assignment{}, {}, t0())->assignment;
  m.set_discovered({{"a", 1}});
  EXPECT_TRUE(m.changed(first, all_alive(first), t0()));
  auto p = m.plan(first, all_alive(first), t0());
  ASSERT_TRUE(p);
  EXPECT_EQ(p->remove, (std::vector<Place>{{"b", 0}, {"b", 1}}));
}

TEST(Membership, TooFewSlotsGivesNoPlan) {
  Membership m({3, 0, std::nullopt});
  m.set_discovered({{"a", 2}});
  EXPECT_FALSE(m.plan(Assignment{}, {}, t0()));
  m.set_discovered({});
  EXPECT_FALSE(m.plan(Assignment{}, {}, t0()));
}

TEST(Membership, BlacklistIsForGoodWithoutACooldown) {
  Membership m({1, 0, std::nullopt});
  m.set_discovered({{"a", 1}, {"b", 1}});
  EXPECT_FALSE(m.blacklist("b", t0()));
  EXPECT_TRUE(m.blacklisted("b", t0() + 100000s));
  EXPECT_EQ(m.usable_slots(t0()), 1);
  EXPECT_FALSE(m.next_expiry(t0()));
}

TEST(Membership, CooldownDoublesPerFailureUpToTheMaximum) {
  Membership m({1, 0, std::pair{2000ms, 5000ms}});
  m.set_discovered({{"a", 1}, {"b", 1}});
  EXPECT_EQ(m.blacklist("b", t0()), 2000ms);
  EXPECT_TRUE(m.blacklisted("b", t0() + 1999ms));
  EXPECT_FALSE(m.blacklisted("b", t0() + 2000ms));
  EXPECT_EQ(m.next_expiry(t0()), t0() + 2000ms);
  EXPECT_EQ(m.blacklist("b", t0()), 4000ms);
  EXPECT_EQ(m.blacklist("b", t0()), 5000ms);  // capped
  EXPECT_EQ(m.blacklist("b", t0()), 5000ms);
  // Back after the cool-down, and only if discovery still lists it.
  EXPECT_EQ(m.usable_slots(t0() + 6s), 2);
  m.set_discovered({{"a", 1}});
  EXPECT_EQ(m.usable_slots(t0() + 6s), 1);
}

TEST(Membership, NoChangeMeansNoNewEpoch) {
  Membership m({1, 0, std::nullopt});
  m.set_discovered({{"a", 2}});
  auto first = m.plan(Assignment{}, {}, t0())->assignment;
  EXPECT_FALSE(m.changed(first, all_alive(first), t0()));
  m.set_discovered({{"a", 2}, {"b", 1}});
  EXPECT_TRUE(m.changed(first, all_alive(first), t0()));
}

}  // namespace
}  // namespace elasticrun::rendezvous
