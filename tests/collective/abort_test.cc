// A collective blocked on a rank that never arrives must end promptly with the
// control plane's error when the abort is raised, and with TimeoutError at its deadline.
#include "rank_fixture.h"
#include "host/ucx_transport.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <chrono>
#include <vector>

namespace elasticrun::collective::testing {
namespace {

using namespace std::chrono_literals;

class Abort : public ::testing::TestWithParam<Progress> {};

// A UcxTransport's options for rank `r` of `n`, all on one host.
UcxTransport::Options ucx_options(int r, int n, const char* scope, Progress progress) {
  UcxTransport::Options o;
  o.rank = r;
  o.size = n;
  o.local_size = n;
  o.scope = scope;
  o.blocking = progress == Progress::block;
  return o;
}

TEST_P(Abort, BlockedCollectiveThrowsWorkersFailedQuickly) {
  World w(3);
  HostCommConfig cfg;
  cfg.progress = GetParam();
  std::atomic<bool> done{false};
  std::atomic<long> raised_at_us{0};
  std::vector<long> latency_us(3, -1);
  std::atomic<int> entering{0};  // ranks 0 and 1 about to call the allreduce
  std::thread raiser([&] {
    // Once both are in it (their communicators made, which can take longer than any fixed
    // wait on a busy machine), and waiting for rank 2.
    while (entering < 2) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(50ms);
    raised_at_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
    w.aborts[0]->raise(AbortSignal::Kind::workers_failed, "rank 2 died");
    w.aborts[1]->raise(AbortSignal::Kind::workers_failed, "rank 2 died");
  });
  run_ranks(w, cfg, "abort/", [&](int r, elasticrun::Communicator& c) {
    if (r == 2) {
      while (!done) std::this_thread::sleep_for(1ms);  // never joins
      return;
    }
    std::vector<float> buf(1 << 20, 1.0f);  // large enough for the ring with partial progress
    ++entering;
    try {
      c.allreduce(buf.data(), buf.data(), buf.size(), DataType::f32, ReduceOp::sum);
      ADD_FAILURE() << "allreduce returned without rank 2";
    } catch (const WorkersFailed& e) {
      auto now = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
      latency_us[r] = now - raised_at_us.load();
      EXPECT_NE(std::string(e.what()).find("rank 2 died"), std::string::npos);
    }
    // Further use fails at once with the same error.
    EXPECT_THROW(c.barrier(), WorkersFailed);
    if (r == 0) done = true;
  });
  raiser.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_GE(latency_us[r], 0) << "rank " << r;
    EXPECT_LT(latency_us[r], 100000) << "rank " << r << " took " << latency_us[r] << " us";
  }
}

TEST_P(Abort, DeadlineGivesTimeoutError) {
  World w(2);
  HostCommConfig cfg;
  cfg.progress = GetParam();
  cfg.timeout = 300ms;
  std::atomic<bool> done{false};
  run_ranks(w, cfg, "deadline/", [&](int r, elasticrun::Communicator& c) {
    if (r == 1) {
      while (!done) std::this_thread::sleep_for(1ms);
      return;
    }
    auto start = Clock::now();
    int x = 1;
    try {
      c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum);
      ADD_FAILURE() << "allreduce returned without rank 1";
    } catch (const TimeoutError& e) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      EXPECT_GE(ms, 290);
      EXPECT_LT(ms, 1000);
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("allreduce"), std::string::npos) << e.what();
    }
    done = true;
  });
}

// A wait that times out names every peer it still needed, and none it had heard from:
// rank 0 receives from ranks 1 (who sends), 2 and 3 (who do not), and sends 1 MiB (a
// rendezvous, complete only once taken) to ranks 3 and 4 (who never take it).
TEST_P(Abort, TimeoutNamesEveryPeerStillAwaited) {
  World w(5);
  std::atomic<bool> done{false};
  std::mutex mu;
  std::exception_ptr first;
  std::string what;
  auto rank = [&](int r) {
    try {
      auto tp = std::make_unique<UcxTransport>(ucx_options(r, 5, "awaited/", GetParam()), w.store, w.aborts[r]);
      UcxTransport& ucx = *tp;
      std::uint64_t one = 1;
      if (r == 1) {
        Transport::Request s = ucx.isend(0, Transport::make_tag(3, 0), &one, sizeof one);
        ucx.wait(std::span(&s, 1), Clock::now() + 10s, "test");
      }
      // The others keep progressing (a receive nobody sends, again and again) until rank 0
      // has closed its endpoints, which waits for them.
      while (r != 0 && !done) {
        std::uint64_t none = 0;
        Transport::Request idle = ucx.irecv(0, Transport::make_tag(9, 0), &none, sizeof none);
        try {
          ucx.wait(std::span(&idle, 1), Clock::now() + 20ms, "idle");
        } catch (const TimeoutError&) {
        }
      }
      if (r != 0) return;
      std::uint64_t in[3] = {};
      std::vector<std::uint8_t> big(1 << 20, 7);
      std::vector<Transport::Request> reqs;
      for (int p : {1, 2, 3}) reqs.push_back(ucx.irecv(p, Transport::make_tag(3, 0), &in[p - 1], sizeof one));
      for (int p : {3, 4}) reqs.push_back(ucx.isend(p, Transport::make_tag(3, 1), big.data(), big.size()));
      auto start = Clock::now();
      try {
        ucx.wait(reqs, start + 300ms, "allreduce");
        ADD_FAILURE() << "the wait returned without ranks 2, 3 and 4";
      } catch (const TimeoutError& e) {
        what = e.what();
        EXPECT_LT(Clock::now() - start, 2s);
      }
      EXPECT_EQ(in[0], 1u);
      tp.reset();
      done = true;
    } catch (...) {
      done = true;
      std::lock_guard lock(mu);
      if (!first) first = std::current_exception();
    }
  };
  std::vector<std::thread> others;
  for (int r = 1; r < 5; ++r) others.emplace_back(rank, r);
  rank(0);
  for (auto& t : others) t.join();
  if (first) std::rethrow_exception(first);
  EXPECT_EQ(what, "allreduce: timed out waiting for messages from ranks 2, 3 and for ranks 3, 4 to take their messages");
}

// A receive that fails once the abort is raised reports the abort (WorkersFailed, which
// elastic run() recovers from), not ProtocolError (which ends the worker): peers that
// already left the epoch leave it at unknown points, so what arrives then says nothing
// about the program. Without an abort, a message larger than the receive is still a
// ProtocolError. Rank 0 posts receives A (fits) and B (too small); rank 1 sends B's
// oversized message, then A's, so B has failed by the time the wait for A returns;
// the abort is raised between that wait and the wait for B, or 200 ms into the wait
// for B (the notice can reach a rank after a departing peer's last message).
enum class Notice { none, before, late };

void truncated_receive(Progress progress, Notice notice) {
  const bool abort_first = notice != Notice::none;
  World w(2);
  std::atomic<bool> posted{false};
  std::mutex mu;
  std::exception_ptr first;
  auto rank = [&](int r) {
    try {
      UcxTransport ucx(ucx_options(r, 2, "trunc/", progress), w.store, w.aborts[r]);
      Transport& tp = ucx;  // the one-request wait() is the base class's
      auto deadline = Clock::now() + 10s;
      std::uint64_t small = 0, big[8] = {1, 2, 3, 4, 5, 6, 7, 8}, a_in = 0, a_out = 42;
      if (r == 1) {
        while (!posted) std::this_thread::sleep_for(1ms);
        Transport::Request s[2] = {tp.isend(0, Transport::make_tag(7, 1), big, sizeof big),
                                   tp.isend(0, Transport::make_tag(7, 0), &a_out, sizeof a_out)};
        tp.wait(s, deadline, "test");
        return;
      }
      Transport::Request a = tp.irecv(1, Transport::make_tag(7, 0), &a_in, sizeof a_in);
      Transport::Request b = tp.irecv(1, Transport::make_tag(7, 1), &small, sizeof small);
      posted = true;
      tp.wait(a, deadline, "test");
      EXPECT_EQ(a_in, 42u);
      if (notice == Notice::before) w.aborts[0]->raise(AbortSignal::Kind::workers_failed, "epoch 3 started");
      std::thread late([&] {
        if (notice != Notice::late) return;
        std::this_thread::sleep_for(200ms);
        w.aborts[0]->raise(AbortSignal::Kind::workers_failed, "epoch 3 started");
      });
      auto start = Clock::now();
      try {
        tp.wait(b, deadline, "allgatherv");
        ADD_FAILURE() << "a truncated receive succeeded";
      } catch (const ProtocolError& e) {
        EXPECT_FALSE(abort_first) << "after the abort: " << e.what();
      } catch (const WorkersFailed& e) {
        EXPECT_TRUE(abort_first) << "without an abort: " << e.what();
        EXPECT_NE(std::string(e.what()).find("epoch 3 started"), std::string::npos) << e.what();
      }
      late.join();
      // It waits for a late notice (up to UcxTransport::kNoticeGrace), not for an early one.
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      if (notice == Notice::before) {
        EXPECT_LT(ms, 100);
      }
      if (notice == Notice::late) {
        EXPECT_LT(ms, 1000);
      }
    } catch (...) {
      std::lock_guard lock(mu);
      if (!first) first = std::current_exception();
    }
  };
  std::thread t1(rank, 1);
  rank(0);
  t1.join();
  if (first) std::rethrow_exception(first);
}

TEST_P(Abort, TruncatedReceiveAfterAbortReportsTheAbort) { truncated_receive(GetParam(), Notice::before); }
TEST_P(Abort, TruncatedReceiveBeforeALateNoticeReportsTheAbort) { truncated_receive(GetParam(), Notice::late); }
TEST_P(Abort, TruncatedReceiveWithoutAbortIsProtocolError) { truncated_receive(GetParam(), Notice::none); }

INSTANTIATE_TEST_SUITE_P(Modes, Abort, ::testing::Values(Progress::busy, Progress::block),
                         [](const auto& info) { return info.param == Progress::busy ? "busy" : "block"; });

}  // namespace
}  // namespace elasticrun::collective::testing
