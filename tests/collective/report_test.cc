// Context::report's collective (api/report.h): every rank leaves with rank 0's
// decision or rank 0's kind of error, and the metrics' JSON text.
#include "api/report.h"
#include "rank_fixture.h"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

namespace elasticrun::collective::testing {
namespace {

// Runs report_collective on 3 ranks, rank 0 asking `ask`; what each rank got:
// "keep_going", "stop", or the name of the error kind it threw.
std::vector<std::string> outcomes(const std::function<msg::Decision()>& ask, std::atomic<int>* asked = nullptr) {
  World w(3);
  std::vector<std::string> got(3);
  run_ranks(w, HostCommConfig{}, "report/", [&](int r, elasticrun::Communicator& c) {
    auto counted = [&] {
      if (asked) ++*asked;
      return ask();
    };
    try {
      got[r] = report_collective(c, counted) == msg::Decision::stop ? "stop" : "keep_going";
    } catch (const WorkersFailed&) {
      got[r] = "WorkersFailed";
    } catch (const HostsUpdated&) {
      got[r] = "HostsUpdated";
    } catch (const TimeoutError&) {
      got[r] = "TimeoutError";
    } catch (const ProtocolError&) {
      got[r] = "ProtocolError";
    } catch (const Error&) {
      got[r] = "Error";
    }
  });
  return got;
}

using V = std::vector<std::string>;

TEST(Report, EveryRankReturnsRankZerosDecisionAndOnlyRankZeroAsks) {
  std::atomic<int> asked{0};
  EXPECT_EQ(outcomes([] { return msg::Decision::stop; }, &asked), (V{"stop", "stop", "stop"}));
  EXPECT_EQ(asked.load(), 1);
  EXPECT_EQ(outcomes([] { return msg::Decision::keep_going; }), (V{"keep_going", "keep_going", "keep_going"}));
}

TEST(Report, EveryRankThrowsTheKindOfRankZerosError) {
  EXPECT_EQ(outcomes([]() -> msg::Decision { throw HostsUpdated("epoch 2 announced"); }),
            (V{"HostsUpdated", "HostsUpdated", "HostsUpdated"}));
  EXPECT_EQ(outcomes([]() -> msg::Decision { throw TimeoutError("no decision"); }),
            (V{"TimeoutError", "TimeoutError", "TimeoutError"}));
  EXPECT_EQ(outcomes([]() -> msg::Decision { throw WorkersFailed("driver lost"); }),
            (V{"WorkersFailed", "WorkersFailed", "WorkersFailed"}));
  EXPECT_EQ(outcomes([]() -> msg::Decision { throw Error("refused"); }), (V{"Error", "Error", "Error"}));
  // A bad metric is found on rank 0 (only its metrics are sent): an Error everywhere.
  EXPECT_EQ(outcomes([]() -> msg::Decision { return metrics_json({{"loss", NAN}}), msg::Decision::stop; }),
            (V{"Error", "Error", "Error"}));
}

TEST(Report, MetricsAreAJsonObjectThatKeepsEveryDouble) {
  Metrics m{{"loss", 0.1}, {"q\"uote\\", -1e-300}, {"tab\tnl\n\x01", 3}, {"big", 1.7976931348623157e308}};
  auto j = nlohmann::json::parse(metrics_json(m));
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.size(), m.size());
  for (const auto& [k, v] : m) EXPECT_EQ(j.at(k).get<double>(), v) << k;
  EXPECT_EQ(metrics_json({}), "{}");
  EXPECT_THROW(metrics_json({{"", 1}}), Error);
  EXPECT_THROW(metrics_json({{"x", std::numeric_limits<double>::infinity()}}), Error);
}

}  // namespace
}  // namespace elasticrun::collective::testing
