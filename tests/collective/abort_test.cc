// A collective blocked on a rank that never arrives must end promptly with the
// control plane's error when the abort is raised, and with TimeoutError at its deadline.
#include "rank_fixture.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <vector>

namespace elasticrun::collective::testing {
namespace {

using namespace std::chrono_literals;

class Abort : public ::testing::TestWithParam<Progress> {};

TEST_P(Abort, BlockedCollectiveThrowsWorkersFailedQuickly) {
  World w(3);
  CommConfig cfg;
  cfg.progress = GetParam();
  std::atomic<bool> done{false};
  std::atomic<long> raised_at_us{0};
  std::vector<long> latency_us(3, -1);
  std::thread raiser([&] {
    std::this_thread::sleep_for(300ms);
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
  CommConfig cfg;
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

INSTANTIATE_TEST_SUITE_P(Modes, Abort, ::testing::Values(Progress::busy, Progress::block),
                         [](const auto& info) { return info.param == Progress::busy ? "busy" : "block"; });

}  // namespace
}  // namespace elasticrun::collective::testing
