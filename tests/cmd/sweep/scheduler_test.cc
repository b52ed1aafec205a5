// FIFO, ASHA and PBT decisions, computed by hand; state() round trips; the factory's errors.
#include "cmd/sweep/scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>

namespace elasticrun::sweep {
namespace {

using nlohmann::json;
using Action = Decision::Action;

constexpr Action kGo = Action::continue_, kStop = Action::stop, kExploit = Action::exploit;

std::unique_ptr<Scheduler> asha(Mode mode, double grace, double rf, double max_t) {
  return make_scheduler("asha", {{"grace_period", grace}, {"reduction_factor", rf}, {"max_t", max_t}}, Space{}, mode, 1);
}

// "t<i>" (with snprintf: GCC 12 warns falsely about "t" + std::to_string(i) at -O3).
std::string tid(int i) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "t%d", i);
  return buf;
}

void add(Scheduler& s, std::initializer_list<std::string> ids) {
  for (const auto& id : ids) s.on_trial_added(id, json::object());
}

TEST(Scheduler, FifoAlwaysContinues) {
  auto s = make_scheduler("fifo", nullptr, Space{}, Mode::min, 1);
  add(*s, {"a", "b"});
  for (int step = 0; step < 100; ++step) {
    EXPECT_EQ(s->on_result("a", step, 1e9).action, kGo);
    EXPECT_EQ(s->on_result("b", step, -1).action, kGo);
  }
  EXPECT_EQ(s->ranking(), (std::vector<std::string>{"b", "a"}));  // min: lower first
}

TEST(Scheduler, RankingBestFirstThenWithoutResultsThenNotFinished) {
  auto s = make_scheduler("fifo", nullptr, Space{}, Mode::max, 1);
  add(*s, {"z", "y", "x", "w", "v"});
  s->on_result("x", 1, 0.5);
  s->on_result("w", 1, 0.9);
  s->on_result("v", 1, std::nan(""));  // worst
  s->on_result("y", 1, 0.5);          // ties with x, added earlier
  s->on_trial_finished("w");
  EXPECT_EQ(s->ranking(), (std::vector<std::string>{"y", "x", "v", "z"}));
  EXPECT_THROW(s->on_result("nobody", 1, 0), std::logic_error);
}

TEST(Asha, RungsAtGraceTimesFactorPowersBelowMaxT) {
  EXPECT_EQ(static_cast<Asha&>(*asha(Mode::max, 1, 3, 10)).milestones(), (std::vector<double>{1, 3, 9}));
  EXPECT_EQ(static_cast<Asha&>(*asha(Mode::max, 1, 3, 9)).milestones(), (std::vector<double>{1, 3}));
  EXPECT_EQ(static_cast<Asha&>(*asha(Mode::max, 2, 2, 16)).milestones(), (std::vector<double>{2, 4, 8}));
  EXPECT_EQ(static_cast<Asha&>(*asha(Mode::max, 5, 4, 5)).milestones(), (std::vector<double>{}));
}

// rf = 3, rungs at 1, 3, 9, max_t 10; six trials reach rung 1 in order. Each cut-off is the 2/3
// quantile (numpy's linear percentile) of the values recorded BEFORE the trial's own:
//   t1 0.5  no value yet: no cut-off                    -> continue
//   t2 0.3  [0.5]                 cut-off 0.5            -> stop
//   t3 0.7  [0.3 0.5]             h=2/3:  0.5-0.2/3=0.4333 -> continue
//   t4 0.6  [0.3 0.5 0.7]         h=4/3:  0.5+0.2/3=0.5667 -> continue
//   t5 0.6  [0.3 0.5 0.6 0.7]     h=2:    0.6 (a tie)    -> continue (Ray stops only below)
//   t6 0.4  [0.3 0.5 0.6 0.6 0.7] h=8/3:  0.6            -> stop
// Then rung 3, survivors in order t3 0.8, t4 0.75, t1 0.9, t5 0.78:
//   t3 0.8  no value: continue; t4 0.75 [0.8] cut-off 0.8: stop;
//   t1 0.9  [0.75 0.8] h=2/3: 0.8-0.05/3=0.7833: continue; t5 0.78 [0.75 0.8 0.9] h=4/3: 0.8333: stop.
// Min mode sees the same with every metric negated.
void run_hand_computed_case(Mode mode) {
  const double sign = mode == Mode::max ? 1 : -1;
  auto s = asha(mode, 1, 3, 10);
  auto& a = static_cast<Asha&>(*s);
  add(*s, {"t1", "t2", "t3", "t4", "t5", "t6"});
  auto at = [&](const std::string& t, double step, double m) { return s->on_result(t, step, sign * m).action; };
  // Below the first rung nothing is recorded and nothing stops.
  EXPECT_EQ(at("t2", 0.5, -100), kGo);
  EXPECT_FALSE(a.cutoff(0));

  EXPECT_EQ(at("t1", 1, 0.5), kGo);
  EXPECT_NEAR(*a.cutoff(0), sign * 0.5, 1e-12);
  EXPECT_EQ(at("t2", 1, 0.3), kStop);
  EXPECT_NEAR(*a.cutoff(0), sign * (0.5 - 0.2 / 3), 1e-12);
  EXPECT_EQ(at("t3", 1, 0.7), kGo);
  EXPECT_NEAR(*a.cutoff(0), sign * (0.5 + 0.2 / 3), 1e-12);
  EXPECT_EQ(at("t4", 1.5, 0.6), kGo);  // the first result at or past the milestone counts
  EXPECT_NEAR(*a.cutoff(0), sign * 0.6, 1e-12);
  EXPECT_EQ(at("t5", 1, 0.6), kGo);
  EXPECT_EQ(at("t6", 1, 0.4), kStop);
  // A later result below the next rung records nothing, whatever its metric.
  EXPECT_EQ(at("t1", 2, -100), kGo);
  EXPECT_EQ(at("t1", 1, -100), kGo);

  EXPECT_EQ(at("t3", 3, 0.8), kGo);
  EXPECT_EQ(at("t4", 3, 0.75), kStop);
  EXPECT_EQ(at("t1", 3, 0.9), kGo);
  EXPECT_NEAR(*a.cutoff(1), sign * (0.8 + 0.1 / 3), 1e-12);
  EXPECT_EQ(at("t5", 3, 0.78), kStop);
  // max_t stops whatever the metric, without recording (t3 alone at rung 9 then).
  EXPECT_EQ(at("t3", 9, 1.0), kGo);
  const auto d = s->on_result("t1", 10, sign * 2.0);
  EXPECT_EQ(d.action, kStop);
  EXPECT_EQ(d.reason, "reached max_t 10");
  EXPECT_NEAR(*a.cutoff(2), sign * 1.0, 1e-12);
}

TEST(Asha, HandComputedCutoffsMax) { run_hand_computed_case(Mode::max); }
TEST(Asha, HandComputedCutoffsMin) { run_hand_computed_case(Mode::min); }

// The trial's own value is not part of its cut-off (Ray computes it before recording): with
// rf = 2 and [1, 3] recorded the cut-off is 2 and 1.9 stops; had 1.9 been counted, the median of
// [1, 1.9, 3] would be 1.9 itself, and a tie continues.
TEST(Asha, OwnValueIsNotPartOfTheCutoff) {
  auto s = asha(Mode::max, 1, 2, 10);
  add(*s, {"a", "b", "c"});
  EXPECT_EQ(s->on_result("a", 1, 1.0).action, kGo);
  EXPECT_EQ(s->on_result("b", 1, 3.0).action, kGo);
  EXPECT_EQ(s->on_result("c", 1, 1.9).action, kStop);
  EXPECT_NEAR(*static_cast<Asha&>(*s).cutoff(0), 1.9, 1e-12);
}

// The strict rule (Optuna's SuccessiveHalvingPruner): at a rung with n values recorded, the
// trial's own included, only the best floor(n/rf) go on, and while n < rf only the best so
// far. Min mode, rf = 3, one rung at step 5; Ray's rule decides t4 the other way.
TEST(Asha, StrictRuleKeepsOnlyTheBestFloorNOverRf) {
  auto s = make_scheduler("asha", {{"grace_period", 5}, {"reduction_factor", 3}, {"max_t", 10}, {"strict", 1}},
                          Space{}, Mode::min, 1);
  add(*s, {"t1", "t2", "t3", "t4", "t5", "t6"});
  EXPECT_EQ(s->on_result("t1", 5, 1.0).action, kGo);    // n=1: the best so far
  EXPECT_EQ(s->on_result("t2", 5, 2.0).action, kStop);  // n=2: not the best
  EXPECT_EQ(s->on_result("t3", 5, 0.5).action, kGo);    // n=3, keep 1: the best
  EXPECT_EQ(s->on_result("t4", 5, 0.8).action, kStop);  // n=4, keep 1 (0.5)
  EXPECT_EQ(s->on_result("t5", 5, 0.5).action, kGo);    // n=5, keep 1: ties the best
  EXPECT_EQ(s->on_result("t6", 5, 0.45).action, kGo);   // n=6, keep 2 (0.45, 0.5)
  auto ray = asha(Mode::min, 5, 3, 10);
  add(*ray, {"t1", "t2", "t3", "t4"});
  for (auto [id, v] : {std::pair{"t1", 1.0}, {"t2", 2.0}, {"t3", 0.5}}) ray->on_result(id, 5, v);
  // Ray: the 66.7th percentile of the negated [1, 2, 0.5] is -0.833; -0.8 is not below it.
  EXPECT_EQ(ray->on_result("t4", 5, 0.8).action, kGo);
  EXPECT_THROW(make_scheduler("asha", {{"strict", 2}}, Space{}, Mode::min, 1), SchedulerError);
}

TEST(Asha, AJumpRecordsOnlyAtTheHighestRungReached) {
  auto s = asha(Mode::min, 1, 2, 100);  // rungs 1 2 4 8 16 32 64
  auto& a = static_cast<Asha&>(*s);
  add(*s, {"a", "b"});
  EXPECT_EQ(s->on_result("a", 5, 1.0).action, kGo);  // rung 4 only
  EXPECT_FALSE(a.cutoff(0));
  EXPECT_FALSE(a.cutoff(1));
  EXPECT_NEAR(*a.cutoff(2), 1.0, 1e-12);
  EXPECT_EQ(s->on_result("b", 4, 3.0).action, kStop);
  // A trial that ends counts its latest result (Ray's on_trial_complete): b's 3.0 is already at
  // rung 4; a skipped to max_t, so its last result lands at rung 64.
  EXPECT_EQ(s->on_result("a", 100, 0.5).action, kStop);
  EXPECT_FALSE(a.cutoff(6));
  s->on_trial_finished("a");
  EXPECT_NEAR(*a.cutoff(6), 0.5, 1e-12);
}

TEST(Asha, NonFiniteMetricIsWorstAndLeftOutOfCutoffs) {
  auto s = asha(Mode::max, 1, 2, 10);
  auto& a = static_cast<Asha&>(*s);
  add(*s, {"a", "b", "c"});
  EXPECT_EQ(s->on_result("a", 1, std::nan("")).action, kGo);  // no cut-off yet
  EXPECT_FALSE(a.cutoff(0));                                   // NaN is not counted
  EXPECT_EQ(s->on_result("b", 1, 1.0).action, kGo);
  EXPECT_EQ(s->on_result("c", 1, std::numeric_limits<double>::infinity()).action, kStop);
  EXPECT_NEAR(*a.cutoff(0), 1.0, 1e-12);
}

TEST(Asha, PercentileIsNumpysLinear) {
  EXPECT_DOUBLE_EQ(percentile({3, 1, 2}, 0.5), 2);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 0.75), 3.25);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 1), 4);
  EXPECT_DOUBLE_EQ(percentile({7}, 0.9), 7);
}

// Feeds the same results to `a` and to a scheduler restored from a's state, decision by decision.
void expect_same_after_restore(Scheduler& a, Scheduler& b, const std::vector<std::tuple<std::string, double, double>>& results) {
  b.restore(json::parse(a.state().dump()));
  EXPECT_EQ(a.state(), b.state());
  for (const auto& [t, step, m] : results) {
    const Decision x = a.on_result(t, step, m), y = b.on_result(t, step, m);
    EXPECT_EQ(x.action, y.action) << t << " " << step;
    EXPECT_EQ(x.source_trial, y.source_trial);
    EXPECT_EQ(x.new_config, y.new_config);
  }
  EXPECT_EQ(a.ranking(), b.ranking());
}

TEST(Asha, StateRoundTripGivesTheSameLaterDecisions) {
  auto a = asha(Mode::min, 1, 3, 30), b = asha(Mode::min, 1, 3, 30);
  add(*a, {"t1", "t2", "t3", "t4"});
  a->on_result("t1", 1, 0.5);
  a->on_result("t2", 1, 0.3);
  a->on_result("t3", 1, std::nan(""));
  a->on_trial_finished("t3");
  expect_same_after_restore(*a, *b, {{"t4", 1, 0.45}, {"t2", 3, 0.2}, {"t1", 3, 0.3}, {"t4", 3, 0.1}});
  // A state of another kind or mode is refused.
  auto fifo = make_scheduler("fifo", nullptr, Space{}, Mode::min, 1);
  EXPECT_THROW(fifo->restore(a->state()), SchedulerError);
  EXPECT_THROW(asha(Mode::max, 1, 3, 30)->restore(a->state()), SchedulerError);
  EXPECT_THROW(asha(Mode::min, 1, 2, 30)->restore(a->state()), SchedulerError);  // other rungs
  EXPECT_THROW(b->restore(json{{"scheduler", "asha"}}), SchedulerError);
}

const char* kPbtSpace = R"({"lr": {"uniform": [0, 1]}, "opt": {"choice": ["a", "b", "c"]},
                            "q": {"quniform": [0, 1, 0.1]}, "k": 5})";

std::unique_ptr<Scheduler> pbt(Mode mode, double resample_probability, std::uint64_t seed = 3) {
  return make_scheduler("pbt", {{"perturbation_interval", 5}, {"resample_probability", resample_probability}},
                        parse_space(kPbtSpace), mode, seed);
}

json cfg(double lr, const char* opt, double q) { return {{"lr", lr}, {"opt", opt}, {"q", q}, {"k", 5}}; }

// Four trials, one result each at step 1 (before any perturbation point), max mode:
// t1 0.1 < t2 0.2 < t3 0.3 < t4 0.4; with n = 4 and quantile 0.25, k = 1: t1 is the bottom, t4 the top.
std::unique_ptr<Scheduler> pbt_population(Mode mode, double resample_probability, std::uint64_t seed = 3) {
  auto s = pbt(mode, resample_probability, seed);
  const double sign = mode == Mode::max ? 1 : -1;
  for (int i = 1; i <= 4; ++i) {
    const std::string id = tid(i);
    s->on_trial_added(id, cfg(0.1 * i, "b", 0.1 * i));
    EXPECT_EQ(s->on_result(id, 1, sign * 0.1 * i).action, kGo);
  }
  return s;
}

void run_exploit_case(Mode mode) {
  const double sign = mode == Mode::max ? 1 : -1;
  auto s = pbt_population(mode, 0.0);
  auto& p = static_cast<Pbt&>(*s);
  // Not in the bottom quantile: continue, but the perturbation point is taken.
  EXPECT_EQ(s->on_result("t4", 5, sign * 0.4).action, kGo);
  EXPECT_EQ(p.last_perturbation("t4"), 5);
  EXPECT_EQ(s->on_result("t2", 4.9, sign * 0.2).action, kGo);  // before its point
  EXPECT_EQ(p.last_perturbation("t2"), 0);
  const Decision d = s->on_result("t1", 6, sign * 0.1);
  ASSERT_EQ(d.action, kExploit);
  EXPECT_EQ(d.source_trial, "t4");
  // t4's configuration, each parameter perturbed: lr 0.4 x 0.8 or 1.2, opt a neighbour of "b",
  // q 0.4 x 0.8 = 0.32 or x 1.2 = 0.48, re-quantized to 0.3 or 0.5; the constant stays.
  EXPECT_TRUE(std::abs(d.new_config["lr"].get<double>() - 0.32) < 1e-12 ||
              std::abs(d.new_config["lr"].get<double>() - 0.48) < 1e-12) << d.new_config;
  EXPECT_TRUE(d.new_config["opt"] == "a" || d.new_config["opt"] == "c") << d.new_config;
  EXPECT_TRUE(d.new_config["q"] == 0.3 || d.new_config["q"] == 0.5) << d.new_config;
  EXPECT_EQ(d.new_config["k"], 5);
  EXPECT_EQ(*s->config("t1"), d.new_config);
  EXPECT_EQ(p.last_perturbation("t1"), 5);  // t4's, as Ray transfers it
  // The next point of t1 is 5 steps after that.
  EXPECT_EQ(s->on_result("t1", 9.9, sign * 0.0).action, kGo);
  EXPECT_EQ(s->on_result("t1", 10, sign * 0.0).action, kExploit);
}

TEST(Pbt, BottomTrialCopiesTopTrialPerturbedMax) { run_exploit_case(Mode::max); }
TEST(Pbt, BottomTrialCopiesTopTrialPerturbedMin) { run_exploit_case(Mode::min); }

TEST(Pbt, ResampleStaysInTheDomainAndQuantized) {
  auto s = pbt_population(Mode::max, 1.0);
  for (int step = 5; step < 500; step += 5) {
    const Decision d = s->on_result("t1", step, 0.0);
    ASSERT_EQ(d.action, kExploit);
    const double lr = d.new_config["lr"], q = d.new_config["q"];
    EXPECT_TRUE(lr >= 0 && lr < 1);
    EXPECT_NEAR(q * 10, std::round(q * 10), 1e-9) << q;
    EXPECT_TRUE(q >= 0 && q <= 1);
  }
}

TEST(Pbt, QuantileSizeIsCeilCappedAtHalf) {
  // 3 trials: ceil(3 x 0.5) = 2 > 1.5, so 1: only the worst exploits and the middle continues.
  auto s = make_scheduler("pbt", {{"perturbation_interval", 1}, {"quantile_fraction", 0.5}}, parse_space(kPbtSpace),
                          Mode::max, 1);
  for (int i = 1; i <= 3; ++i) s->on_trial_added(tid(i), cfg(0.5, "a", 0.5));
  s->on_result("t1", 0.5, 1);
  s->on_result("t2", 0.5, 2);
  s->on_result("t3", 0.5, 3);
  EXPECT_EQ(s->on_result("t2", 1, 2).action, kGo);
  EXPECT_EQ(s->on_result("t1", 1, 1).action, kExploit);
  EXPECT_EQ(s->on_result("t1", 2, 1).source_trial, "t3");
  // A lone trial has nobody to copy; finished trials do not count.
  s->on_trial_finished("t2");
  s->on_trial_finished("t3");
  EXPECT_EQ(s->on_result("t1", 3, 1).action, kGo);
}

TEST(Pbt, ReproducibleWithTheSeedAndAcrossRestore) {
  auto a = pbt_population(Mode::max, 0.5, 9), b = pbt_population(Mode::max, 0.5, 9);
  std::vector<json> ca, cb;
  for (int step = 5; step < 100; step += 5) {
    ca.push_back(a->on_result("t1", step, 0).new_config);
    cb.push_back(b->on_result("t1", step, 0).new_config);
  }
  EXPECT_EQ(ca, cb);
  auto other = pbt_population(Mode::max, 0.5, 10);
  std::vector<json> co;
  for (int step = 5; step < 100; step += 5) co.push_back(other->on_result("t1", step, 0).new_config);
  EXPECT_NE(ca, co);

  auto c = pbt(Mode::max, 0.5, 9);
  std::vector<std::tuple<std::string, double, double>> later;
  for (int step = 100; step < 200; step += 5)
    for (int i = 1; i <= 4; ++i) later.emplace_back(tid(i), step, (i * 37 + step) % 11);
  expect_same_after_restore(*a, *c, later);
}

TEST(Scheduler, FactoryErrorsSayWhichParameterAndWhy) {
  const Space none;
  auto error = [&](const std::string& name, const json& params) -> std::string {
    try {
      make_scheduler(name, params, none, Mode::min, 1);
    } catch (const SchedulerError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error("hyperband", nullptr), "unknown scheduler \"hyperband\" (expected fifo, asha, pbt)");
  EXPECT_EQ(error("fifo", {{"x", 1}}), "fifo: unknown parameter \"x\" (it takes none)");
  EXPECT_EQ(error("asha", {{"grace", 1}}),
            "asha: unknown parameter \"grace\" (expected grace_period, reduction_factor, max_t, brackets, strict)");
  EXPECT_EQ(error("asha", {{"max_t", "10"}}), "asha: max_t needs a number, got \"10\"");
  EXPECT_EQ(error("asha", {{"grace_period", 0}}), "asha: grace_period needs > 0, got 0");
  EXPECT_EQ(error("asha", {{"reduction_factor", 1}}), "asha: reduction_factor needs > 1, got 1");
  EXPECT_EQ(error("asha", {{"grace_period", 5}, {"max_t", 4}}), "asha: max_t needs >= grace_period, got max_t=4, grace_period=5");
  EXPECT_EQ(error("asha", {{"brackets", 3}}), "asha: brackets: only 1 is supported, got 3");
  EXPECT_EQ(error("asha", json::array()), "asha: parameters need a JSON object, got []");
  EXPECT_EQ(error("pbt", nullptr), "pbt: perturbation_interval is required");
  EXPECT_EQ(error("pbt", {{"perturbation_interval", -1}}), "pbt: perturbation_interval needs > 0, got -1");
  EXPECT_EQ(error("pbt", {{"perturbation_interval", 1}, {"quantile_fraction", 0.6}}),
            "pbt: quantile_fraction needs 0 < q <= 0.5, got 0.6");
  EXPECT_EQ(error("pbt", {{"perturbation_interval", 1}, {"resample_probability", 2}}),
            "pbt: resample_probability needs 0 <= p <= 1, got 2");
  EXPECT_EQ(error("asha", json::object()), "");
  EXPECT_THROW(parse_mode("minimum"), SchedulerError);
  EXPECT_EQ(parse_mode("max"), Mode::max);
}

}  // namespace
}  // namespace elasticrun::sweep
