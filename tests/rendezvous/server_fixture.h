// The fixture of the rendezvous server's tests: a server on loopback running its
// io_context on a thread, epoch 1 with h0 (2 slots) and h1 (1 slot), and the real
// worker-side client to join it.
#pragma once

#include "rendezvous/server.h"
#include "control/rendezvous_client.h"

#include <elasticrun/types.hpp>

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <vector>

namespace elasticrun {

namespace asio = boost::asio;
using collective::Clock;
using collective::RendezvousClient;

class RendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rendezvous::Server::Callbacks cb;
    cb.on_worker_lost = [this](const rendezvous::WorkerPlace& p, std::uint64_t) {
      lost_ranks_.push_back(p.rank);
      lost_started_.push_back(p.started_epoch);
    };
    cb.on_worker_silent = [this](const rendezvous::WorkerPlace& p, std::uint64_t, std::chrono::milliseconds silent) {
      silent_.push_back({p.rank, silent});
    };
    if (with_report_callback_)
      cb.on_report = [this](const rendezvous::WorkerPlace& p, std::uint64_t epoch, std::int64_t step,
                            const nlohmann::json& metrics, rendezvous::ReportAnswer answer) {
        reports_.push_back({p.rank, epoch, step, metrics});
        if (on_report_) on_report_(std::move(answer));
      };
    cb.on_synced = [this](const rendezvous::WorkerPlace& p, std::uint64_t epoch, std::uint64_t commits) {
      synced_.push_back({p.host, p.slot, epoch, commits});
    };
    rendezvous::ServerLimits limits = limits_;
    limits.handshake_timeout = handshake_timeout_;
    limits.worker_timeout = worker_timeout_;
    server_ = std::make_unique<rendezvous::Server>(io_, secret_, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0),
                                                   cb, limits);
    server_->start_epoch(rendezvous::assign({{"h0", 2}, {"h1", 1}}, 3, 1), msg::NotifyKind::abort, "");
    addr_ = "127.0.0.1:" + std::to_string(server_->port());
    guard_ = std::make_unique<asio::executor_work_guard<asio::io_context::executor_type>>(io_.get_executor());
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    std::promise<void> stopped;
    asio::post(io_, [&] {
      server_->stop();
      stopped.set_value();
    });
    stopped.get_future().wait();
    guard_.reset();
    io_.stop();
    thread_.join();
  }
  // `started`: the epoch the worker was started in (its ELASTICRUN_EPOCH).
  std::unique_ptr<RendezvousClient> join(const std::string& host, int slot, const auth::Secret* s = nullptr,
                                         std::uint64_t started = 1) {
    return std::make_unique<RendezvousClient>(addr_, s ? *s : secret_, host, slot, started,
                                              Clock::now() + std::chrono::seconds(5));
  }
  template <class F>
  auto on_io(F f) {
    std::promise<decltype(f())> p;
    asio::post(io_, [&] {
      if constexpr (std::is_void_v<decltype(f())>) f(), p.set_value();
      else p.set_value(f());
    });
    return p.get_future().get();
  }
  // A raw TCP connection for sending arbitrary bytes.
  int raw_connect() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(server_->port());
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    return fd;
  }
  // True if the server closed `fd` within `ms`.
  static bool closed_by_peer(int fd, int ms) {
    timeval tv{ms / 1000, (ms % 1000) * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[4096];
    while (true) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
    }
  }

  asio::io_context io_;
  auth::Secret secret_ = auth::random_secret();
  std::unique_ptr<rendezvous::Server> server_;
  std::unique_ptr<asio::executor_work_guard<asio::io_context::executor_type>> guard_;
  std::thread thread_;
  std::string addr_;
  std::chrono::milliseconds handshake_timeout_{500};
  rendezvous::ServerLimits limits_;  // set before SetUp (in a constructor); the two above win
  std::vector<int> lost_ranks_;
  std::vector<std::uint64_t> lost_started_;
  // Reports the driver was handed (on the io thread: read them through on_io), and what
  // it does with each one's answer; without on_report_ the answer is dropped unanswered.
  struct Seen {
    int rank;
    std::uint64_t epoch;
    std::int64_t step;
    nlohmann::json metrics;
  };
  bool with_report_callback_ = true;  // set before SetUp (in a constructor) to leave it out
  std::chrono::milliseconds worker_timeout_{0};  // likewise: the server's, 0 none
  // Workers the server gave up as silent, with how long they had been (io thread).
  std::vector<std::pair<int, std::chrono::milliseconds>> silent_;
  std::vector<Seen> reports_;
  // Workers that reported a completed sync (io thread): host, slot, epoch, commits.
  struct Synced {
    std::string host;
    int slot;
    std::uint64_t epoch, commits;
  };
  std::vector<Synced> synced_;
  std::function<void(rendezvous::ReportAnswer)> on_report_;
};

}  // namespace elasticrun
