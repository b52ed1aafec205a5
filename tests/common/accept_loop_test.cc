// AcceptLoop over a real listening socket, in a process whose open-file limit is then
// lowered so that accept() fails with EMFILE while a connection waits in the listen
// queue: the loop retries every kRetry instead of spinning, and takes the connection
// once a descriptor is free again. Also raise_open_file_limit().
#include "common/accept_loop.h"
#include "common/fd_limit.h"
#include "tests/common/run_until.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>

namespace elasticrun {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

// Lowers RLIMIT_NOFILE's soft limit for its lifetime.
class SoftLimit {
 public:
  explicit SoftLimit(rlim_t soft) {
    ::getrlimit(RLIMIT_NOFILE, &old_);
    rlimit now{soft, old_.rlim_max};
    ok_ = ::setrlimit(RLIMIT_NOFILE, &now) == 0;
  }
  ~SoftLimit() { restore(); }
  void restore() {
    if (ok_) ::setrlimit(RLIMIT_NOFILE, &old_);
    ok_ = false;
  }
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  bool ok_ = false;
};

TEST(AcceptLoop, WaitsBetweenFailedAcceptsAndRecovers) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  int accepted = 0;
  AcceptLoop loop(acceptor, log::Component::rendezvous, [&](asio::ip::tcp::socket) { ++accepted; });

  // The client's connection completes in the kernel's listen queue, with no descriptor
  // of ours for it yet.
  asio::ip::tcp::socket client(io);
  client.connect(acceptor.local_endpoint());
  // The lowest free descriptor: under a soft limit of its number, none is free.
  int probe = ::fcntl(0, F_DUPFD, 0);
  ASSERT_GE(probe, 0);
  ::close(probe);
  std::optional<SoftLimit> limit(std::in_place, static_cast<rlim_t>(probe));
  ASSERT_TRUE(limit->ok());
  ASSERT_LT(::fcntl(0, F_DUPFD, 0), 0) << "a descriptor is still free";

  loop.start();
  auto until = std::chrono::steady_clock::now() + 1s;
  while (std::chrono::steady_clock::now() < until) {
    io.restart();
    io.run_for(until - std::chrono::steady_clock::now());
  }
  // 1 s at one try each 100 ms: about 10 tries; an accept retried at once makes
  // thousands.
  EXPECT_EQ(accepted, 0);
  EXPECT_GE(loop.failing(), 1u);
  EXPECT_LE(loop.failing(), 15u);

  limit->restore();
  EXPECT_TRUE(testing::run_until(io, [&] { return accepted == 1; }, 2s));
  EXPECT_EQ(loop.failing(), 0u);
  loop.stop();
}

TEST(AcceptLoop, StopEndsAcceptingAndRetrying) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  int accepted = 0;
  AcceptLoop loop(acceptor, log::Component::rendezvous, [&](asio::ip::tcp::socket) { ++accepted; });
  loop.start();
  asio::ip::tcp::socket first(io);
  first.connect(acceptor.local_endpoint());
  ASSERT_TRUE(testing::run_until(io, [&] { return accepted == 1; }, 2s));
  loop.stop();
  asio::ip::tcp::socket second(io);
  second.connect(acceptor.local_endpoint());
  EXPECT_FALSE(testing::run_until(io, [&] { return accepted == 2; }, 300ms));
  loop.start();
  EXPECT_TRUE(testing::run_until(io, [&] { return accepted == 2; }, 2s));
  loop.stop();
}

TEST(FdLimit, RaisesTheSoftLimitToTheHardOne) {
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &before), 0);
  if (before.rlim_max != RLIM_INFINITY && before.rlim_max < 64) GTEST_SKIP() << "hard limit " << before.rlim_max;
  SoftLimit low(32);
  ASSERT_TRUE(low.ok());
  std::uint64_t now = raise_open_file_limit();
  rlimit after{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &after), 0);
  EXPECT_EQ(now, after.rlim_cur);
  EXPECT_GT(after.rlim_cur, 32u);
  EXPECT_EQ(after.rlim_cur, std::min<rlim_t>(before.rlim_max, kMaxOpenFiles));
}

}  // namespace
}  // namespace elasticrun
