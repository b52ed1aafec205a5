// Reports through the rendezvous server: who may report, what the driver is handed,
// and its answer reaching rank 0, given at once, later, or never.
#include "server_fixture.h"

#include "rendezvous/metrics.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace elasticrun {
namespace {

using namespace std::chrono_literals;

auto soon() { return Clock::now() + 5s; }

// A worker's report of a completed sync (the holder rule) reaches the driver with the
// place the connection joined as and that connection's epoch.
TEST_F(RendezvousTest, ASyncReportReachesTheDriverWithTheWorkersPlaceAndEpoch) {
  auto a = join("h0", 0);
  auto b = join("h1", 0);
  ASSERT_TRUE(b->synced(12));
  ASSERT_TRUE(a->synced(12));
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (on_io([&] { return synced_.size(); }) < 2 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto seen = on_io([&] { return synced_; });
  ASSERT_EQ(seen.size(), 2u);
  std::sort(seen.begin(), seen.end(), [](const auto& x, const auto& y) { return x.host < y.host; });
  EXPECT_EQ(seen[0].host, "h0");
  EXPECT_EQ(seen[0].slot, 0);
  EXPECT_EQ(seen[0].epoch, 1u);
  EXPECT_EQ(seen[0].commits, 12u);
  EXPECT_EQ(seen[1].host, "h1");
}

TEST_F(RendezvousTest, RankZerosReportReachesTheDriverAndItsLaterAnswerComesBack) {
  // The driver answers 50 ms later, from the io thread, as one waiting on its sweep would.
  auto timer = std::make_shared<asio::steady_timer>(io_);
  on_report_ = [&, timer](rendezvous::ReportAnswer answer) {
    timer->expires_after(50ms);
    timer->async_wait([answer](boost::system::error_code) { answer(msg::Decision::stop); });
  };
  auto r0 = join("h0", 0);
  EXPECT_EQ(r0->report(40, R"({"loss":0.25,"acc":1})", soon()), msg::Decision::stop);
  auto seen = on_io([this] { return reports_; });
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].rank, 0);
  EXPECT_EQ(seen[0].epoch, 1u);
  EXPECT_EQ(seen[0].step, 40);
  EXPECT_EQ(seen[0].metrics, nlohmann::json::parse(R"({"loss":0.25,"acc":1})"));
}

TEST_F(RendezvousTest, ReportOfAnotherRankIsRefusedAndTheWorkerKeepsItsConnection) {
  on_report_ = [](rendezvous::ReportAnswer answer) { answer(msg::Decision::keep_going); };
  auto r1 = join("h0", 1), r2 = join("h1", 0);
  EXPECT_THROW(r1->report(1, R"({"loss":1})", soon()), Error);
  EXPECT_THROW(r2->report(1, "{}", soon()), Error);
  EXPECT_TRUE(on_io([this] { return reports_.empty(); }));
  r1->set("still", {1});  // refused, not disconnected
  EXPECT_EQ(r2->get("still", soon()), (collective::Bytes{1}));
  EXPECT_TRUE(on_io([this] { return lost_ranks_.empty(); }));
}

TEST_F(RendezvousTest, BadMetricsAreRefused) {
  on_report_ = [](rendezvous::ReportAnswer answer) { answer(msg::Decision::keep_going); };
  auto r0 = join("h0", 0);
  std::vector<std::string> bads = {"[1,2]", R"({"loss":"low"})", R"({"loss":{"x":1}})", "{\"loss\":1", "",
                                   std::string(rendezvous::kMaxMetricsText, ' ') + "{}"};
  for (const auto& bad : bads)
    EXPECT_THROW(r0->report(3, bad, soon()), Error) << bad.substr(0, 40);
  EXPECT_TRUE(on_io([this] { return reports_.empty(); }));
  EXPECT_EQ(r0->report(4, R"({"loss":1e-3})", soon()), msg::Decision::keep_going);
}

TEST_F(RendezvousTest, ReportOfAnEpochThatIsNoLongerCurrentIsRefused) {
  on_report_ = [](rendezvous::ReportAnswer answer) { answer(msg::Decision::keep_going); };
  auto r0 = join("h0", 0);
  on_io([this] {
    server_->start_epoch(rendezvous::assign({{"h0", 2}, {"h1", 1}, {"h2", 1}}, 0, 2), msg::NotifyKind::hosts_updated,
                         "host added");
  });
  auto t0 = Clock::now();
  while (!r0->hosts_updated() && Clock::now() - t0 < 2s) std::this_thread::sleep_for(1ms);
  // Still rank 0 of epoch 1, which keeps serving its collectives; not of the current one.
  EXPECT_THROW(r0->report(5, "{}", soon()), HostsUpdated);
  r0->rejoin(2, soon());
  EXPECT_EQ(r0->report(5, "{}", soon()), msg::Decision::keep_going);
  auto seen = on_io([this] { return reports_; });
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].epoch, 2u);
}

TEST_F(RendezvousTest, AnswerAfterTheWorkerLeftIsHarmless) {
  rendezvous::ReportAnswer kept;
  std::promise<void> asked;
  on_report_ = [&](rendezvous::ReportAnswer answer) {
    kept = std::move(answer);
    asked.set_value();
  };
  {
    auto r0 = join("h0", 0);
    std::thread reporter([&] { EXPECT_THROW(r0->report(7, "{}", Clock::now() + 300ms), TimeoutError); });
    asked.get_future().wait();
    reporter.join();
  }  // the worker is gone, its report unanswered
  std::this_thread::sleep_for(50ms);
  on_io([&] {
    kept(msg::Decision::stop);
    kept(msg::Decision::keep_going);  // a second answer is ignored
  });
  auto r1 = join("h0", 1);
  r1->set("alive", {2});
  EXPECT_EQ(r1->get("alive", soon()), (collective::Bytes{2}));
}

TEST_F(RendezvousTest, AnswerAfterTheServerStoppedIsHarmless) {
  rendezvous::ReportAnswer kept;
  std::promise<void> asked;
  on_report_ = [&](rendezvous::ReportAnswer answer) {
    kept = std::move(answer);
    asked.set_value();
  };
  auto r0 = join("h0", 0);
  std::thread reporter([&] { EXPECT_THROW(r0->report(7, "{}", soon()), WorkersFailed); });
  asked.get_future().wait();
  on_io([&] {
    server_->stop();
    kept(msg::Decision::stop);
  });
  reporter.join();
}

class ReportWithoutCallbackTest : public RendezvousTest {
 protected:
  ReportWithoutCallbackTest() { with_report_callback_ = false; }
};

TEST_F(ReportWithoutCallbackTest, EveryReportIsAnsweredKeepGoing) {
  auto r0 = join("h0", 0);
  EXPECT_EQ(r0->report(1, R"({"loss":2})", soon()), msg::Decision::keep_going);
  EXPECT_THROW(join("h0", 1)->report(1, "{}", soon()), Error);
}

// The check itself, without a server.
TEST(Metrics, FlatObjectsOfFiniteNumbersOnly) {
  EXPECT_TRUE(rendezvous::parse_metrics("{}"));
  EXPECT_TRUE(rendezvous::parse_metrics(R"({"loss":0.5,"step_time":12,"n":-3})"));
  auto why = [](std::string_view t) {
    auto r = rendezvous::parse_metrics(t);
    return r ? std::string("accepted") : r.error();
  };
  EXPECT_EQ(why("3"), "metrics must be a JSON object, not number");
  EXPECT_EQ(why("nul"), "metrics are not valid JSON");
  EXPECT_EQ(why(R"({"a":[1]})"), "metrics must be a flat JSON object of numbers");
  EXPECT_EQ(why(R"({"a":1,"b":{"c":{"d":2}}})"), "metrics must be a flat JSON object of numbers");
  EXPECT_EQ(why(R"({"a":true})"), "metric 'a' is boolean, not a number");
  EXPECT_EQ(why(R"({"a":null})"), "metric 'a' is null, not a number");
  EXPECT_FALSE(rendezvous::parse_metrics(R"({"a":1e999})"));  // out of a double's range
  EXPECT_EQ(why(R"({"":1})"), "a metric has an empty name");
  EXPECT_NE(why("{\"" + std::string(300, 'x') + "\":1}").find("is over 256 bytes"), std::string::npos);
  EXPECT_EQ(why(R"({"a":1})" + std::string(10, ' ')), "accepted");
  EXPECT_EQ(rendezvous::parse_metrics(std::string(100, ' '), 64).error(), "metrics of 100 bytes (at most 64)");
  // Deep nesting costs neither stack nor memory.
  EXPECT_EQ(why(R"({"a":)" + std::string(20000, '[') + std::string(20000, ']') + "}"),
            "metrics must be a flat JSON object of numbers");
}

}  // namespace
}  // namespace elasticrun
