// The host feed (--host-discovery-fd): host lists pushed over a real pipe, read by the
// real HostWatcher polling with a zero interval, as the job does.
#include "discovery/host_source.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <string>

namespace elasticrun::discovery {
namespace {

using namespace std::chrono_literals;
using Hosts = std::vector<Host>;

class Feed : public ::testing::Test {
 protected:
  void SetUp() override {
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    read_ = p[0];
    write_ = p[1];
  }
  void TearDown() override { close_writer(); }

  void start(FeedOptions o = {}) {
    HostWatcher::Callbacks cb{[this](const Hosts& h) { changes.push_back(h); },
                              [this](const std::string& e) { errors.push_back(e); },
                              [this](const std::string& e) { fatals.push_back(e); }};
    watcher_ = std::make_unique<HostWatcher>(io_, make_feed_source(io_, read_, o), 0ms, std::move(cb));
    watcher_->start();
  }
  void send(const std::string& s) { ASSERT_EQ(::write(write_, s.data(), s.size()), static_cast<ssize_t>(s.size())); }
  void close_writer() {
    if (write_ >= 0) ::close(write_);
    write_ = -1;
  }
  bool run_until(const std::function<bool()>& done) { return testing::run_until(io_, done); }

  boost::asio::io_context io_;
  int read_ = -1, write_ = -1;
  std::unique_ptr<HostWatcher> watcher_;
  std::vector<Hosts> changes;
  std::vector<std::string> errors, fatals;
};

TEST_F(Feed, EachListArrivesAsItIsSentAndRepeatsAreNotChanges) {
  start({.default_slots = 2});
  send("a:3\nb\n\n");
  ASSERT_TRUE(run_until([&] { return changes.size() == 1; }));
  EXPECT_EQ(changes[0], (Hosts{{"a", 3}, {"b", 2}}));
  send("a:3\nb\n\n");  // the same list again
  send("# a comment\nb:1\r\n\n");
  ASSERT_TRUE(run_until([&] { return changes.size() == 2; }));
  EXPECT_EQ(changes[1], (Hosts{{"b", 1}}));
  send("\n");  // no hosts at all is a list too
  ASSERT_TRUE(run_until([&] { return changes.size() == 3; }));
  EXPECT_TRUE(changes[2].empty());
  EXPECT_TRUE(errors.empty());
  EXPECT_TRUE(fatals.empty());
}

TEST_F(Feed, ListsSentTogetherLeaveTheNewest) {
  send("a:1\n\nb:1\n\nc:4\n\n");  // all three before the first read
  start();
  ASSERT_TRUE(run_until([&] { return !changes.empty() && changes.back() == Hosts{{"c", 4}}; }));
  io_.run_for(30ms);
  EXPECT_EQ(changes.back(), (Hosts{{"c", 4}}));
  EXPECT_LE(changes.size(), 2u);  // the first read may see the first list alone
}

TEST_F(Feed, AMalformedListIsAnErrorAndTheNextOneIsRead) {
  start();
  send("a:2\n\n");
  ASSERT_TRUE(run_until([&] { return changes.size() == 1; }));
  send("a:x\n\n");
  ASSERT_TRUE(run_until([&] { return errors.size() == 1; }));
  EXPECT_NE(errors[0].find("--host-discovery-fd"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("line 1"), std::string::npos) << errors[0];
  EXPECT_EQ(watcher_->current(), (Hosts{{"a", 2}}));  // kept
  send("b:1\n\n");
  ASSERT_TRUE(run_until([&] { return changes.size() == 2; }));
  EXPECT_EQ(changes[1], (Hosts{{"b", 1}}));
}

TEST_F(Feed, AnOversizedListIsDroppedWhole) {
  start({.max_block = 64});
  send("a:1\n\n");
  ASSERT_TRUE(run_until([&] { return changes.size() == 1; }));
  std::string big;
  for (int i = 0; i < 20; ++i) big += "host" + std::to_string(i) + ":1\n";
  send(big + "\n");
  ASSERT_TRUE(run_until([&] { return errors.size() == 1; }));
  EXPECT_NE(errors[0].find("exceeds 64 bytes"), std::string::npos) << errors[0];
  EXPECT_EQ(watcher_->current(), (Hosts{{"a", 1}}));
  send("c:1\n\n");
  ASSERT_TRUE(run_until([&] { return changes.size() == 2; }));
  EXPECT_EQ(changes[1], (Hosts{{"c", 1}}));
}

TEST_F(Feed, EndBeforeAnyListIsFatal) {
  start();
  send("a:1\n");  // never finished by an empty line
  close_writer();
  ASSERT_TRUE(run_until([&] { return !fatals.empty(); }));
  EXPECT_NE(fatals[0].find("closed inside a host list"), std::string::npos) << fatals[0];
  EXPECT_TRUE(changes.empty());
}

TEST_F(Feed, EndAfterAListKeepsItAndSaysSoOnce) {
  start();
  send("a:1\n\n");
  close_writer();
  ASSERT_TRUE(run_until([&] { return errors.size() == 1; }));
  io_.run_for(50ms);
  EXPECT_EQ(errors, (std::vector<std::string>{"--host-discovery-fd " + std::to_string(read_) + " was closed"}));
  EXPECT_EQ(changes, (std::vector<Hosts>{{{"a", 1}}}));
  EXPECT_TRUE(fatals.empty());
}

TEST_F(Feed, AnOverlongLineEndsTheFeed) {
  start({.max_line = 32});
  send("a:1\n\n");
  ASSERT_TRUE(run_until([&] { return changes.size() == 1; }));
  send(std::string(100, 'x'));
  ASSERT_TRUE(run_until([&] { return errors.size() == 1; }));
  EXPECT_NE(errors[0].find("a line of more than 32 bytes"), std::string::npos) << errors[0];
  send("\nb:1\n\n");  // nothing more is read
  io_.run_for(50ms);
  EXPECT_EQ(changes.size(), 1u);
}

}  // namespace
}  // namespace elasticrun::discovery
