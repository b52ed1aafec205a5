// HostLookups: the driver's name lookups run on threads of their own, so that a resolver
// that takes seconds stalls nothing on the io_context's thread.
#include "discovery/host_lookup.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

namespace elasticrun::discovery {
namespace {

using namespace std::chrono_literals;

// A resolver whose answers wait until the test lets them go, by name.
struct Gate {
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::string> open, asked;
  HostPlace resolve(const std::string& key) {
    std::unique_lock lk(m);
    asked.push_back(key);
    cv.notify_all();
    cv.wait(lk, [&] { return std::find(open.begin(), open.end(), key) != open.end(); });
    return key.starts_with("nowhere") ? HostPlace{} : HostPlace{false, "10.0.0." + std::to_string(key.size())};
  }
  void let_go(const std::string& key) {
    std::lock_guard lk(m);
    open.push_back(key);
    cv.notify_all();
  }
  int times_asked(const std::string& key) {
    std::lock_guard lk(m);
    return static_cast<int>(std::count(asked.begin(), asked.end(), key));
  }
};

// Runs `io` until `done` or 5 s.
template <class F>
bool run_until(boost::asio::io_context& io, F done) {
  auto end = std::chrono::steady_clock::now() + 5s;
  while (!done() && std::chrono::steady_clock::now() < end) {
    io.restart();
    io.run_for(5ms);
  }
  return done();
}

TEST(HostLookups, SlowLookupStallsNothingAndAnswersInOrder) {
  boost::asio::io_context io;
  auto gate = std::make_shared<Gate>();
  HostLookups lookups(io, 2, [gate](const std::string& k) { return gate->resolve(k); });
  std::vector<std::string> order;
  lookups.when_known("user@slow", [&](const HostPlace& p) { order.push_back("slow1 " + p.toward); });
  lookups.when_known("fast", [&](const HostPlace& p) { order.push_back("fast " + p.toward); });
  lookups.when_known("slow", [&](const HostPlace&) { order.push_back("slow2"); });
  EXPECT_TRUE(order.empty()) << "nothing is answered before its lookup";
  EXPECT_EQ(lookups.pending(), 2u);
  // The loop keeps its timers while "slow" hangs in the resolver.
  int ticks = 0;
  boost::asio::steady_timer t(io);
  std::function<void()> tick = [&] {
    t.expires_after(10ms);
    t.async_wait([&](boost::system::error_code ec) {
      if (!ec && ++ticks < 10) tick();
    });
  };
  tick();
  gate->let_go("fast");
  ASSERT_TRUE(run_until(io, [&] { return ticks >= 10 && order.size() == 1; }));
  EXPECT_EQ(order, std::vector<std::string>{"fast 10.0.0.4"});
  gate->let_go("slow");
  ASSERT_TRUE(run_until(io, [&] { return order.size() == 3; }));
  EXPECT_EQ(order, (std::vector<std::string>{"fast 10.0.0.4", "slow1 10.0.0.4", "slow2"}));
  EXPECT_EQ(gate->times_asked("slow"), 1) << "one lookup per name, however many ask";
  // Known now: answered at once, and the same for "user@slow" and "[slow]".
  ASSERT_NE(lookups.find("[slow]"), nullptr);
  bool at_once = false;
  lookups.when_known("root@slow", [&](const HostPlace& p) { at_once = p.toward == "10.0.0.4"; });
  EXPECT_TRUE(at_once);
  EXPECT_EQ(lookups.pending(), 0u);
}

TEST(HostLookups, NameThatDoesNotResolveIsAskedAgain) {
  boost::asio::io_context io;
  auto gate = std::make_shared<Gate>();
  gate->let_go("nowhere");
  HostLookups lookups(io, 1, [gate](const std::string& k) { return gate->resolve(k); });
  int answers = 0;
  lookups.when_known("nowhere", [&](const HostPlace& p) { answers += !p.found(); });
  ASSERT_TRUE(run_until(io, [&] { return answers == 1; }));
  EXPECT_EQ(lookups.find("nowhere"), nullptr);
  lookups.when_known("nowhere", [&](const HostPlace& p) { answers += !p.found(); });
  ASSERT_TRUE(run_until(io, [&] { return answers == 2; }));
  EXPECT_EQ(gate->times_asked("nowhere"), 2);
}

TEST(HostLookups, MoreNamesThanThreadsAllAnswered) {
  boost::asio::io_context io;
  std::atomic<int> running{0}, most{0};
  HostLookups lookups(io, 3, [&](const std::string& k) {
    int now = ++running;
    for (int m = most; now > m && !most.compare_exchange_weak(m, now);) {
    }
    std::this_thread::sleep_for(5ms);
    --running;
    return HostPlace{false, k};
  });
  int answered = 0;
  for (int i = 0; i < 40; ++i) {
    std::string name = std::to_string(i);
    name.insert(name.begin(), 'h');
    lookups.when_known(name, [&, name](const HostPlace& p) { answered += p.toward == name; });
  }
  ASSERT_TRUE(run_until(io, [&] { return answered == 40; }));
  EXPECT_LE(most.load(), 3);
}

TEST(HostLookups, DestroyedWhileALookupHangs) {
  boost::asio::io_context io;
  auto gate = std::make_shared<Gate>();
  bool called = false;
  {
    HostLookups lookups(io, 1, [gate](const std::string& k) { return gate->resolve(k); });
    lookups.when_known("hung", [&](const HostPlace&) { called = true; });
    std::unique_lock lk(gate->m);
    ASSERT_TRUE(gate->cv.wait_for(lk, 5s, [&] { return !gate->asked.empty(); }));
  }
  gate->let_go("hung");  // the thread returns after its owner is gone
  std::this_thread::sleep_for(50ms);
  io.restart();
  io.run_for(50ms);
  EXPECT_FALSE(called);
}

TEST(HostLookups, RealResolver) {
  EXPECT_TRUE(look_up_host("localhost").local);
  EXPECT_TRUE(look_up_host("user@[::1]").local);
  HostPlace none = look_up_host("no-such-host.invalid");
  EXPECT_FALSE(none.found());
  EXPECT_EQ(bare_name("user@[fe80::1]"), "fe80::1");
}

}  // namespace
}  // namespace elasticrun::discovery
