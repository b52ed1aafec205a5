// The slot pool: start, grow best-first up to max, give back, host failures, placement.
#include "cmd/sweep/pool.h"

#include <gtest/gtest.h>

#include <ostream>

namespace elasticrun::sweep {

// Readable failures: gtest prints these instead of their bytes (found by ADL, so outside the
// anonymous namespace).
void PrintTo(const Slice& s, std::ostream* os) { *os << s.host << ":" << s.slots; }
void PrintTo(const Shrunk& s, std::ostream* os) { *os << s.trial << " size " << s.size << (s.below_min ? " below min" : ""); }

namespace {

TrialNeed need(const std::string& id, int min_np, int max_np) { return {id, min_np, max_np}; }

// Every trial's share adds up to its size, at most its max; no host gives more than it has.
void expect_consistent(const Pool& pool, const std::vector<TrialNeed>& trials) {
  int busy = 0;
  for (const auto& t : trials) {
    int sum = 0;
    for (const auto& s : pool.share(t.id)) sum += s.slots;
    EXPECT_EQ(sum, pool.size(t.id)) << t.id;
    EXPECT_LE(pool.size(t.id), t.max_np) << t.id;
    busy += sum;
  }
  EXPECT_EQ(busy, pool.busy_slots());
  for (const auto& h : pool.hosts()) EXPECT_GE(pool.free_on(h), 0) << h;
}

TEST(Pool, StartableTakesMinEachInOrderAndStopsAtTheFirstThatDoesNotFit) {
  Pool pool;
  pool.add_host("a", 4);
  pool.add_host("b", 4);
  pool.add_host("c", 2);
  std::vector<TrialNeed> pending;
  for (const char* id : {"t1", "t2", "t3", "t4", "t5", "t6"}) pending.push_back(need(id, 2, 4));
  EXPECT_EQ(pool.startable(pending), (std::vector<std::string>{"t1", "t2", "t3", "t4", "t5"}));
  // A big trial first blocks the smaller ones behind it (no overtaking).
  EXPECT_EQ(pool.startable({need("big", 11, 12), need("small", 2, 2)}), std::vector<std::string>{});
  EXPECT_EQ(pool.busy_slots(), 0);  // startable changes nothing
}

TEST(Pool, StartGrowBestFirstUpToMaxAndGiveBack) {
  Pool pool;
  pool.add_host("a", 4);
  pool.add_host("b", 4);
  pool.add_host("c", 2);
  const std::vector<TrialNeed> trials = {need("t1", 2, 4), need("t2", 2, 4), need("t3", 2, 4), need("t4", 2, 4)};
  // Compact placement of min_np: the host with the most free slots, ties to the first added.
  ASSERT_TRUE(pool.start(trials[0], 0));
  EXPECT_EQ(pool.share("t1"), (Share{{"a", 2}}));
  ASSERT_TRUE(pool.start(trials[1], 1));
  EXPECT_EQ(pool.share("t2"), (Share{{"b", 2}}));  // b has 4 free, a 2
  ASSERT_TRUE(pool.start(trials[2], 2));
  EXPECT_EQ(pool.share("t3"), (Share{{"a", 2}}));  // a, b, c: 2 free each
  EXPECT_EQ(pool.free_slots(), 4);
  EXPECT_FALSE(pool.start(trials[1], 1));  // already running

  // 4 spare slots, each trial wants 2 more: t1 and t2 (best priorities) get them, t3 nothing.
  EXPECT_EQ(pool.allocate(), (std::vector<std::string>{"t1", "t2"}));
  EXPECT_EQ(pool.share("t1"), (Share{{"a", 2}, {"b", 2}}));  // a is full: b (2 free, before c)
  EXPECT_EQ(pool.share("t2"), (Share{{"b", 2}, {"c", 2}}));
  EXPECT_EQ(pool.size("t3"), 2);
  EXPECT_EQ(pool.free_slots(), 0);
  EXPECT_EQ(pool.utilisation(), 1.0);
  EXPECT_FALSE(pool.start(trials[3], 3));  // nothing free; running trials keep theirs
  EXPECT_EQ(pool.allocate(), std::vector<std::string>{});
  expect_consistent(pool, trials);

  // t2 stops: its 4 slots return at once; t4 starts first, then the rest grows t3 (t1 is at max).
  pool.release("t2");
  EXPECT_EQ(pool.size("t2"), 0);
  EXPECT_EQ(pool.free_slots(), 4);
  EXPECT_EQ(pool.startable({trials[3]}), std::vector<std::string>{"t4"});
  ASSERT_TRUE(pool.start(trials[3], 3));
  EXPECT_EQ(pool.share("t4"), (Share{{"b", 2}}));
  EXPECT_EQ(pool.allocate(), std::vector<std::string>{"t3"});
  EXPECT_EQ(pool.share("t3"), (Share{{"a", 2}, {"c", 2}}));
  EXPECT_EQ(pool.size("t1"), 4);  // never more than max
  expect_consistent(pool, trials);
}

TEST(Pool, RankingDecidesWhoGrows) {
  Pool pool;
  pool.add_host("a", 8);
  ASSERT_TRUE(pool.start(need("x", 1, 8), 0));
  ASSERT_TRUE(pool.start(need("y", 1, 8), 1));
  pool.set_ranking({"y", "x"});  // y is now the better trial
  EXPECT_EQ(pool.allocate(), (std::vector<std::string>{"y"}));
  EXPECT_EQ(pool.size("y"), 7);
  EXPECT_EQ(pool.size("x"), 1);
}

TEST(Pool, AHeldTrialKeepsItsSlotsAndGetsNoMore) {
  Pool pool;
  pool.add_host("a", 4);
  ASSERT_TRUE(pool.start(need("x", 1, 4), 0));
  ASSERT_TRUE(pool.start(need("y", 1, 4), 1));
  pool.hold("x");  // x is stopping
  pool.hold("unknown");
  EXPECT_EQ(pool.allocate(), (std::vector<std::string>{"y"}));
  EXPECT_EQ(pool.size("x"), 1);
  EXPECT_EQ(pool.size("y"), 3);
  pool.release("x");
  EXPECT_EQ(pool.allocate(), (std::vector<std::string>{"y"}));
  EXPECT_EQ(pool.size("y"), 4);
}

TEST(Pool, PlacementPrefersAHostTheTrialAlreadyUses) {
  Pool pool;
  pool.add_host("a", 2);
  pool.add_host("b", 6);
  ASSERT_TRUE(pool.start(need("t", 1, 3), 0));
  EXPECT_EQ(pool.share("t"), (Share{{"b", 1}}));  // most free
  ASSERT_TRUE(pool.start(need("u", 1, 1), 1));
  EXPECT_EQ(pool.share("u"), (Share{{"b", 1}}));  // b still has 4 free against a's 2
  pool.allocate();
  EXPECT_EQ(pool.share("t"), (Share{{"b", 3}}));  // grows where it is, not onto a
}

TEST(Pool, HostRemovalShrinksItsTrialsAndReportsThoseBelowMin) {
  Pool pool;
  pool.add_host("a", 4);
  pool.add_host("b", 4);
  const std::vector<TrialNeed> trials = {need("big", 3, 6), need("small", 2, 2)};
  ASSERT_TRUE(pool.start(trials[0], 0));
  ASSERT_TRUE(pool.start(trials[1], 1));
  pool.allocate();
  EXPECT_EQ(pool.share("big"), (Share{{"a", 4}, {"b", 2}}));
  EXPECT_EQ(pool.share("small"), (Share{{"b", 2}}));

  // a fails: big keeps 2 slots on b, below its min of 3; small is untouched.
  EXPECT_EQ(pool.remove_host("a"), (std::vector<Shrunk>{{"big", 2, true}}));
  EXPECT_EQ(pool.share("big"), (Share{{"b", 2}}));
  EXPECT_EQ(pool.total_slots(), 4);
  EXPECT_EQ(pool.hosts(), std::vector<std::string>{"b"});
  expect_consistent(pool, trials);

  // A new host: big, below its min, is topped up to min_np before anyone grows, then to max.
  pool.add_host("c", 1);
  EXPECT_EQ(pool.allocate(), std::vector<std::string>{"big"});
  EXPECT_EQ(pool.size("big"), 3);
  expect_consistent(pool, trials);
}

TEST(Pool, BelowMinIsToppedUpBeforeABetterTrialGrows) {
  Pool pool;
  pool.add_host("a", 2);
  ASSERT_TRUE(pool.start(need("short", 2, 2), 1));
  pool.add_host("b", 4);
  ASSERT_TRUE(pool.start(need("best", 1, 8), 0));
  EXPECT_EQ(pool.allocate(), std::vector<std::string>{"best"});
  EXPECT_EQ(pool.share("best"), (Share{{"b", 4}}));
  EXPECT_EQ(pool.remove_host("a"), (std::vector<Shrunk>{{"short", 0, true}}));
  // 3 new slots: short gets back to its min of 2 first, although best ranks higher and wants 4.
  pool.add_host("d", 3);
  EXPECT_EQ(pool.allocate(), (std::vector<std::string>{"best", "short"}));
  EXPECT_EQ(pool.share("short"), (Share{{"d", 2}}));
  EXPECT_EQ(pool.share("best"), (Share{{"b", 4}, {"d", 1}}));
}

TEST(Pool, AHostLosingSlotsShrinksTheWorstTrialFirst) {
  Pool pool;
  pool.add_host("a", 4);
  ASSERT_TRUE(pool.start(need("good", 2, 2), 0));
  ASSERT_TRUE(pool.start(need("bad", 2, 2), 1));
  EXPECT_EQ(pool.set_host("a", 3), (std::vector<Shrunk>{{"bad", 1, true}}));
  EXPECT_EQ(pool.size("good"), 2);
  EXPECT_EQ(pool.free_on("a"), 0);
  EXPECT_EQ(pool.set_host("a", 1), (std::vector<Shrunk>{{"bad", 0, true}, {"good", 1, true}}));
  pool.release("bad");
  pool.release("nobody");
  EXPECT_EQ(pool.busy_slots(), 1);
}

TEST(Pool, UsageMeterIntegratesSlotSeconds) {
  UsageMeter m;
  m.record(0, 4, 8, true);    // [0, 10): 4 of 8 busy, trials waiting
  m.record(10, 8, 8, false);  // [10, 20): all busy
  m.record(20, 0, 8, false);
  EXPECT_DOUBLE_EQ(m.busy_slot_seconds(), 120);
  EXPECT_DOUBLE_EQ(m.available_slot_seconds(), 160);
  EXPECT_DOUBLE_EQ(m.utilisation(), 0.75);
  EXPECT_DOUBLE_EQ(m.utilisation_while_waiting(), 0.5);
}

}  // namespace
}  // namespace elasticrun::sweep
