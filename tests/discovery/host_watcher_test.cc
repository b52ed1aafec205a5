// HostWatcher: first failure fatal, later failures keep the last good set, changes are
// reported once each; with a scripted fake source and with real scripts.
#include "discovery/host_source.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <boost/asio/post.hpp>

#include <deque>

namespace elasticrun::discovery {
namespace {

using namespace std::chrono_literals;
using testing::TempDir;
using Hosts = std::vector<Host>;

// Answers polls from a queue the test fills; counts polls and cancels.
struct FakeState {
  std::deque<Result<Hosts>> answers;
  HostSource::Done pending;
  int polls = 0, cancels = 0;
};

class FakeSource final : public HostSource {
 public:
  FakeSource(boost::asio::io_context& io, std::shared_ptr<FakeState> s) : io_(io), s_(std::move(s)) {}
  void poll(Done done) override {
    ++s_->polls;
    if (s_->answers.empty()) {
      s_->pending = std::move(done);  // hangs until the test answers
      return;
    }
    auto r = std::move(s_->answers.front());
    s_->answers.pop_front();
    boost::asio::post(io_, [done = std::move(done), r = std::move(r)]() mutable { done(std::move(r)); });
  }
  void cancel() override {
    ++s_->cancels;
    s_->pending = nullptr;
  }

 private:
  boost::asio::io_context& io_;
  std::shared_ptr<FakeState> s_;
};

struct Recorder {
  std::vector<Hosts> changes;
  std::vector<std::string> errors, fatals;
  HostWatcher::Callbacks callbacks() {
    return {[this](const Hosts& h) { changes.push_back(h); }, [this](const std::string& e) { errors.push_back(e); },
            [this](const std::string& e) { fatals.push_back(e); }};
  }
};

class WatcherFake : public ::testing::Test {
 protected:
  std::unique_ptr<HostWatcher> make(std::chrono::milliseconds interval = 10ms) {
    return std::make_unique<HostWatcher>(io_, std::make_unique<FakeSource>(io_, s_), interval, rec_.callbacks());
  }
  boost::asio::io_context io_;
  std::shared_ptr<FakeState> s_ = std::make_shared<FakeState>();
  Recorder rec_;
};

TEST_F(WatcherFake, FirstFailureIsFatalAndStops) {
  s_->answers.push_back(fail("boom"));
  auto w = make();
  w->start();
  ASSERT_TRUE(testing::run_until(io_, [&] { return !rec_.fatals.empty(); }));
  io_.run_for(50ms);
  EXPECT_EQ(rec_.fatals, (std::vector<std::string>{"boom"}));
  EXPECT_TRUE(rec_.errors.empty());
  EXPECT_TRUE(rec_.changes.empty());
  EXPECT_EQ(s_->polls, 1);
}

TEST_F(WatcherFake, ErrorsKeepTheSetAndChangesAreReportedOnce) {
  Hosts a{{"a", 1}}, ab{{"a", 1}, {"b", 2}};
  for (auto& r : std::vector<Result<Hosts>>{a, a, fail("x"), fail("x"), a, ab, ab, Hosts{}, a})
    s_->answers.push_back(std::move(r));
  auto w = make();
  w->start();
  ASSERT_TRUE(testing::run_until(io_, [&] { return s_->answers.empty() && s_->pending; }));
  EXPECT_EQ(rec_.changes, (std::vector<Hosts>{a, ab, Hosts{}, a}));
  EXPECT_EQ(rec_.errors, (std::vector<std::string>{"x", "x"}));
  EXPECT_TRUE(rec_.fatals.empty());
  EXPECT_EQ(w->current(), a);
}

TEST_F(WatcherFake, PollNowDuringAPollIsCoalesced) {
  auto w = make(10s);  // no scheduled polls in this test
  w->start();
  ASSERT_EQ(s_->polls, 1);
  w->poll_now();
  w->poll_now();
  EXPECT_EQ(s_->polls, 1);
  s_->answers.push_back(Hosts{{"b", 1}});
  auto done = std::move(s_->pending);
  done(Hosts{{"a", 1}});  // ends the first poll; exactly one more follows at once
  ASSERT_TRUE(testing::run_until(io_, [&] { return rec_.changes.size() == 2; }));
  io_.run_for(50ms);
  EXPECT_EQ(s_->polls, 2);
  w->poll_now();
  ASSERT_TRUE(testing::run_until(io_, [&] { return s_->polls == 3; }));
}

TEST_F(WatcherFake, StopCancelsARunningPoll) {
  auto w = make();
  w->start();
  ASSERT_TRUE(s_->pending);
  w->stop();
  EXPECT_EQ(s_->cancels, 1);
  EXPECT_FALSE(s_->pending);
  io_.run_for(50ms);
  EXPECT_EQ(s_->polls, 1);
}

TEST_F(WatcherFake, CallbackMayDestroyTheWatcher) {
  std::unique_ptr<HostWatcher> w;
  s_->answers.push_back(Hosts{{"a", 1}});
  HostWatcher::Callbacks cb;
  cb.on_change = [&](const Hosts&) { w.reset(); };
  w = std::make_unique<HostWatcher>(io_, std::make_unique<FakeSource>(io_, s_), 10ms, cb);
  w->start();
  ASSERT_TRUE(testing::run_until(io_, [&] { return !w; }));
  io_.run_for(50ms);
  EXPECT_EQ(s_->polls, 1);
}

// With real scripts: the script prints a file the test rewrites, or fails on demand.
class WatcherScript : public ::testing::Test {
 protected:
  void SetUp() override {
    hosts_ = dir_.file("hosts");
    mode_ = dir_.file("mode");
    testing::write_file(hosts_, "127.0.0.1:1\n127.0.0.2:1\n");
    testing::write_file(mode_, "ok\n");
    opt_.path = testing::write_script(dir_, "discover.sh",
        "#!/bin/sh\n"
        "case $(cat " + mode_ + ") in\n"
        "  fail) echo 'no API' >&2; exit 3;;\n"
        "  hang) exec sleep 100;;\n"
        "  garbage) echo 'node:x';;\n"
        "  *) cat " + hosts_ + ";;\n"
        "esac\n");
    opt_.timeout = 1s;  // a loaded CI machine can take 300 ms to start a shell
  }
  std::unique_ptr<HostWatcher> make() {
    return std::make_unique<HostWatcher>(io_, make_script_source(io_, opt_), 20ms, rec_.callbacks());
  }
  bool wait_changes(std::size_t n) { return testing::run_until(io_, [&] { return rec_.changes.size() >= n; }); }
  bool wait_errors(std::size_t n) { return testing::run_until(io_, [&] { return rec_.errors.size() >= n; }); }

  boost::asio::io_context io_;
  TempDir dir_;
  std::string hosts_, mode_;
  ScriptOptions opt_;
  Recorder rec_;
};

TEST_F(WatcherScript, FirstPollFailureIsFatal) {
  testing::write_file(mode_, "fail\n");
  auto w = make();
  w->start();
  ASSERT_TRUE(testing::run_until(io_, [&] { return !rec_.fatals.empty(); }));
  EXPECT_EQ(rec_.fatals[0], "discovery script exited with code 3: no API");
  EXPECT_TRUE(rec_.changes.empty());
}

TEST_F(WatcherScript, LaterFailuresKeepTheLastGoodSet) {
  auto w = make();
  w->start();
  ASSERT_TRUE(wait_changes(1));
  Hosts good{{"127.0.0.1", 1}, {"127.0.0.2", 1}};
  EXPECT_EQ(rec_.changes[0], good);
  std::size_t errors = 0;
  for (std::string mode : {"fail", "hang", "garbage"}) {
    testing::write_file(mode_, mode + "\n");
    // Two polls; in hang mode each takes the 1 s timeout.
    ASSERT_TRUE(testing::run_until(io_, [&] { return rec_.errors.size() >= errors + 2; }, 10s)) << mode;
    errors = rec_.errors.size();
    EXPECT_EQ(rec_.changes.size(), 1u) << mode;
    EXPECT_EQ(w->current(), good) << mode;
  }
  EXPECT_NE(std::find(rec_.errors.begin(), rec_.errors.end(), "discovery script timed out after 1.0 s"),
            rec_.errors.end());
  EXPECT_EQ(rec_.errors.back(), "discovery script output, line 1: slots 'x' is not a number");
  EXPECT_TRUE(rec_.fatals.empty());
  // Recovery with a new list is a change.
  testing::write_file(hosts_, "127.0.0.3:2\n");
  testing::write_file(mode_, "ok\n");
  ASSERT_TRUE(wait_changes(2));
  EXPECT_EQ(rec_.changes[1], (Hosts{{"127.0.0.3", 2}}));
}

TEST_F(WatcherScript, FlappingHostsAreEachReported) {
  auto w = make();
  w->start();
  ASSERT_TRUE(wait_changes(1));
  std::vector<std::string> lists{"127.0.0.1:1\n127.0.0.2:1\n127.0.0.3:1\n", "127.0.0.1:1\n", "",
                                 "127.0.0.1:1\n127.0.0.2:1\n127.0.0.3:1\n", "127.0.0.2:1\n127.0.0.1:1\n"};
  for (std::size_t i = 0; i < lists.size(); ++i) {
    testing::write_file(hosts_, lists[i]);
    ASSERT_TRUE(wait_changes(i + 2)) << i;
  }
  EXPECT_EQ(rec_.changes[3], Hosts{});  // zero hosts is an answer, not an error
  EXPECT_EQ(rec_.changes.back(), (Hosts{{"127.0.0.2", 1}, {"127.0.0.1", 1}}));
  // Rewriting the same list is no change.
  testing::write_file(hosts_, lists.back());
  io_.run_for(200ms);
  EXPECT_EQ(rec_.changes.size(), lists.size() + 1);
  EXPECT_TRUE(rec_.errors.empty());
}

}  // namespace
}  // namespace elasticrun::discovery
