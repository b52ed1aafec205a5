// The space file, seeded sampling and PBT's perturbations: hand-computed cases.
#include "cmd/sweep/space.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

namespace elasticrun::sweep {
namespace {

using nlohmann::json;

// The error parse_space gives for `text` (empty when it parses).
std::string error_of(const std::string& text) {
  try {
    parse_space(text);
  } catch (const SpaceError& e) {
    return e.what();
  }
  return "";
}

TEST(Space, ParsesEveryDomainInFileOrder) {
  Space s = parse_space(R"({"z": 3, "lr": {"loguniform": [1e-4, 0.1]}, "bs": {"grid": [32, 64]},
    "opt": {"choice": ["sgd", "adam"]}, "m": {"uniform": [0, 1]}, "k": {"quniform": [16, 256, 16]},
    "d": {"quniform": [0, 1, 0.25]}, "n": {"randint": [1, 5]}})");
  ASSERT_EQ(s.params.size(), 8u);
  std::vector<std::string> names;
  for (const auto& p : s.params) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"z", "lr", "bs", "opt", "m", "k", "d", "n"}));
  EXPECT_EQ(s.find("z")->domain, Domain::constant);
  EXPECT_EQ(s.find("lr")->domain, Domain::loguniform);
  EXPECT_EQ(s.find("k")->domain, Domain::quniform);
  EXPECT_TRUE(s.find("k")->integral);
  EXPECT_FALSE(s.find("d")->integral);
  EXPECT_EQ(s.find("n")->lower, 1);
  EXPECT_EQ(s.find("n")->upper, 5);
  EXPECT_EQ(s.find("missing"), nullptr);
  EXPECT_EQ(s.grid_points(), 2u);
}

TEST(Space, EveryBadFileNamesTheFieldAndTheProblem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"lr": {"loguniform": [-1, 1]}})", R"("lr": loguniform needs 0 < lower < upper, got lower=-1)"},
      {R"({"lr": {"loguniform": [0, 1]}})", R"("lr": loguniform needs 0 < lower < upper, got lower=0)"},
      {R"({"lr": {"loguniform": [0.1, 0.01]}})", R"("lr": loguniform needs lower < upper, got lower=0.1, upper=0.01)"},
      {R"({"m": {"uniform": [2, 1]}})", R"("m": uniform needs lower < upper, got lower=2, upper=1)"},
      {R"({"m": {"uniform": [1]}})", R"("m": uniform needs [lower, upper] (numbers), got [1])"},
      {R"({"m": {"uniform": ["a", 1]}})", R"("m": uniform needs [lower, upper] (numbers), got ["a",1])"},
      {R"({"k": {"quniform": [0, 1, 0]}})", R"("k": quniform needs q > 0, got q=0)"},
      {R"({"k": {"quniform": [0.1, 0.2, 1]}})", R"("k": quniform needs a multiple of q within [lower, upper], got lower=0.1, upper=0.2, q=1)"},
      {R"({"k": {"quniform": [0, 1]}})", R"("k": quniform needs [lower, upper, q] (numbers), got [0,1])"},
      {R"({"n": {"randint": [0.5, 3]}})", R"("n": randint needs [lower, upper] (integers), got [0.5,3])"},
      {R"({"n": {"randint": [3, 3]}})", R"("n": randint needs lower < upper (upper is exclusive), got lower=3, upper=3)"},
      {R"({"bs": {"grid": []}})", R"("bs": grid needs a non-empty list of values, got [])"},
      {R"({"opt": {"choice": "adam"}})", R"("opt": choice needs a non-empty list of values, got "adam")"},
      {R"({"x": {"normal": [0, 1]}})", R"("x": unknown domain "normal" (expected one of grid, choice, uniform, quniform, loguniform, randint))"},
      {R"({"x": {"grid": [1], "choice": [2]}})", R"("x": needs exactly one of grid, choice, uniform, quniform, loguniform, randint, got {"grid":[1],"choice":[2]})"},
      {R"({"x": {}})", R"("x": needs exactly one of)"},
      {R"([1, 2])", "space: expected a JSON object of parameters, got array"},
      {R"({"lr": )", "space: not valid JSON:"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string got = error_of(text);
    EXPECT_EQ(got.substr(0, expected.size()), expected) << text;
  }
}

TEST(Space, GridTimesSamplesInKeyOrderLastKeyFastest) {
  Space s = parse_space(R"({"b": {"grid": [1, 2]}, "a": {"grid": ["x", "y", "z"]}, "c": 5,
                            "u": {"uniform": [0, 1]}})");
  auto configs = sample(s, 2, 7);
  ASSERT_EQ(configs.size(), 12u);  // 2 x 3 grid points, 2 repetitions
  const std::vector<std::pair<int, std::string>> order = {{1, "x"}, {1, "y"}, {1, "z"}, {2, "x"}, {2, "y"}, {2, "z"}};
  std::set<double> draws;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    EXPECT_EQ(configs[i]["b"], order[i % 6].first) << i;
    EXPECT_EQ(configs[i]["a"], order[i % 6].second) << i;
    EXPECT_EQ(configs[i]["c"], 5);
    const double u = configs[i]["u"];
    EXPECT_GE(u, 0);
    EXPECT_LT(u, 1);
    draws.insert(u);
  }
  EXPECT_EQ(draws.size(), 12u);  // a fresh draw for every configuration
  EXPECT_TRUE(sample(s, 0, 7).empty());
}

TEST(Space, SameSeedSameConfigsOtherSeedOthers) {
  Space s = parse_space(R"({"lr": {"loguniform": [1e-4, 0.1]}, "n": {"randint": [0, 1000]},
                            "opt": {"choice": ["a", "b", "c", "d"]}, "bs": {"grid": [1, 2]}})");
  EXPECT_EQ(sample(s, 5, 42), sample(s, 5, 42));
  EXPECT_NE(sample(s, 5, 42), sample(s, 5, 43));
  // The first repetition does not depend on how many follow.
  auto three = sample(s, 3, 42), one = sample(s, 1, 42);
  EXPECT_EQ(std::vector<json>(three.begin(), three.begin() + 2), one);
}

TEST(Space, RngIsTheStandardEngineWithOurConversions) {
  // The standard fixes mt19937_64's 10000th output for the default seed, so draws are the same
  // on every conforming library; our conversions are plain arithmetic on that output.
  Rng a(5489);
  for (int i = 0; i < 9999; ++i) a.next();
  EXPECT_EQ(a.next(), 9981545732273789042ull);
  Rng b(1), c(1);
  EXPECT_EQ(b.uniform01(), static_cast<double>(c.next() >> 11) / 9007199254740992.0);
}

TEST(Space, RngStateRoundTrip) {
  Rng a(99);
  for (int i = 0; i < 5; ++i) a.below(7);
  Rng b = Rng::restore(json::parse(a.state().dump()));
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a.next(), b.next());
}

TEST(Space, DrawsStayInTheirDomains) {
  Space s = parse_space(R"({"n": {"randint": [0, 3]}, "lr": {"loguniform": [1e-4, 0.1]},
                            "k": {"quniform": [16, 256, 16]}, "d": {"quniform": [0, 1, 0.25]}})");
  std::set<std::int64_t> ints;
  std::set<double> quarters;
  for (const auto& c : sample(s, 400, 3)) {
    ints.insert(c["n"].get<std::int64_t>());
    const double lr = c["lr"];
    EXPECT_GE(lr, 1e-4);
    EXPECT_LE(lr, 0.1);
    ASSERT_TRUE(c["k"].is_number_integer()) << c;
    const std::int64_t k = c["k"];
    EXPECT_EQ(k % 16, 0);
    EXPECT_GE(k, 16);
    EXPECT_LE(k, 256);
    quarters.insert(c["d"].get<double>());
  }
  EXPECT_EQ(ints, (std::set<std::int64_t>{0, 1, 2}));  // hi is exclusive, every value reached
  EXPECT_EQ(quarters, (std::set<double>{0, 0.25, 0.5, 0.75, 1}));
}

// Every outcome of perturbing `current` many times.
std::set<json> outcomes(const Param& p, const json& current) {
  Rng rng(5);
  std::set<json> out;
  for (int i = 0; i < 200; ++i) out.insert(perturb(p, current, rng));
  return out;
}

TEST(Space, PerturbMultipliesByPointEightOrOnePointTwoWithinTheDomain) {
  Space s = parse_space(R"({"u": {"uniform": [0, 10]}, "q": {"quniform": [0, 10, 0.5]},
    "n": {"randint": [0, 10]}, "c": {"choice": ["a", "b", "c"]}, "g": {"grid": [1, 2, 3]},
    "l": {"loguniform": [1e-4, 0.1]}, "k": 7})");
  EXPECT_EQ(outcomes(*s.find("u"), 5.0), (std::set<json>{4.0, 6.0}));
  EXPECT_EQ(outcomes(*s.find("u"), 9.5), (std::set<json>{9.5 * 0.8, 10.0}));  // 11.4 clamped to hi
  EXPECT_EQ(outcomes(*s.find("q"), 3.0), (std::set<json>{2.5, 3.5}));   // 2.4 and 3.6 re-quantized
  EXPECT_EQ(outcomes(*s.find("n"), 5), (std::set<json>{4, 6}));
  EXPECT_EQ(outcomes(*s.find("n"), 9), (std::set<json>{7, 9}));  // 10.8 rounds to 11, past hi - 1
  EXPECT_EQ(outcomes(*s.find("c"), "b"), (std::set<json>{"a", "c"}));
  EXPECT_EQ(outcomes(*s.find("c"), "a"), (std::set<json>{"a", "b"}));  // clamped at the end
  EXPECT_EQ(outcomes(*s.find("g"), 3), (std::set<json>{2, 3}));
  EXPECT_EQ(outcomes(*s.find("k"), 7), (std::set<json>{7}));
  auto l = outcomes(*s.find("l"), 0.01);
  ASSERT_EQ(l.size(), 2u);
  EXPECT_DOUBLE_EQ(l.begin()->get<double>(), 0.008);
  EXPECT_DOUBLE_EQ(l.rbegin()->get<double>(), 0.012);
  // A value not in the list is resampled from it.
  for (const auto& x : outcomes(*s.find("c"), "zzz")) EXPECT_TRUE(x == "a" || x == "b" || x == "c");
}

TEST(Space, ExploreResamplesWithTheGivenProbability) {
  Space s = parse_space(R"({"u": {"uniform": [0, 10]}, "k": 7, "n": {"randint": [0, 100]}})");
  const json config = {{"u", 5.0}, {"k", 7}, {"n", 50}, {"extra", "kept"}};
  Rng rng(11);
  for (int i = 0; i < 50; ++i) {
    json perturbed = explore(s, config, 0.0, rng);
    EXPECT_TRUE(perturbed["u"] == 4.0 || perturbed["u"] == 6.0) << perturbed;
    EXPECT_TRUE(perturbed["n"] == 40 || perturbed["n"] == 60) << perturbed;
    EXPECT_EQ(perturbed["k"], 7);
    EXPECT_EQ(perturbed["extra"], "kept");
  }
  std::set<json> resampled;
  for (int i = 0; i < 50; ++i) {
    json r = explore(s, config, 1.0, rng);
    const double u = r["u"];
    EXPECT_TRUE(u >= 0 && u < 10);
    resampled.insert(r["n"]);
  }
  EXPECT_GT(resampled.size(), 10u);  // fresh draws, not the four perturbed values
}

}  // namespace
}  // namespace elasticrun::sweep
