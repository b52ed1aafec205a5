// The shared-memory allreduce's own behaviour: waits end on abort and deadline,
// sleepers are woken by the arriving rank, the segment file never outlives set-up,
// and when the segment cannot be made (or the ranks span hosts) every rank falls
// back to the UCX algorithms together. Correctness per type, op, size and world
// size is in collectives_test.cc, which runs every algorithm.
#include "rank_fixture.h"
#include "host/shm_group.h"
#include "test_data.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace elasticrun::collective::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

long since_us(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count();
}

HostCommConfig shm_config(Progress p) {
  HostCommConfig cfg;
  cfg.algorithm = Algorithm::shm;
  cfg.progress = p;
  cfg.timeout = 60s;
  return cfg;
}

// A fresh directory for segments, removed afterwards.
struct TempDir {
  TempDir() {
    char tmpl[] = "/dev/shm/elasticrun-shm-test.XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::size_t entries() const { return std::distance(fs::directory_iterator(path), fs::directory_iterator{}); }
  std::string path;
};

class ShmWaits : public ::testing::TestWithParam<Progress> {};

// Rank 2 takes part in the first allreduce (so the segment exists), then stops
// coming: ranks 0 and 1 wait in the shared-memory barrier until the abort.
TEST_P(ShmWaits, AbortEndsABlockedBarrierQuickly) {
  World w(3);
  std::atomic<bool> done{false};
  std::atomic<int> warmed{0};
  Clock::time_point raised_at{};
  std::vector<long> latency_us(3, -1);
  std::thread raiser([&] {
    while (warmed < 3) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(300ms);
    raised_at = Clock::now();
    w.aborts[0]->raise(AbortSignal::Kind::workers_failed, "rank 2 died");
    w.aborts[1]->raise(AbortSignal::Kind::workers_failed, "rank 2 died");
  });
  run_ranks(w, shm_config(GetParam()), "shm-abort/", [&](int r, elasticrun::Communicator& c) {
    std::vector<float> buf(1 << 18, 1.0f);  // 1 MiB: rounds with two barriers each
    c.allreduce(buf.data(), buf.data(), buf.size(), DataType::f32, ReduceOp::sum);
    EXPECT_EQ(buf[0], 3.0f);
    ++warmed;
    if (r == 2) {
      while (!done) std::this_thread::sleep_for(1ms);
      return;
    }
    try {
      c.allreduce(buf.data(), buf.data(), buf.size(), DataType::f32, ReduceOp::sum);
      ADD_FAILURE() << "allreduce returned without rank 2";
    } catch (const WorkersFailed& e) {
      latency_us[r] = since_us(raised_at);
      EXPECT_NE(std::string(e.what()).find("rank 2 died"), std::string::npos);
    }
    EXPECT_THROW(c.barrier(), WorkersFailed);
    if (r == 0) done = true;
  });
  raiser.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_GE(latency_us[r], 0) << "rank " << r;
    EXPECT_LT(latency_us[r], 100000) << "rank " << r << " took " << latency_us[r] << " us";
  }
}

TEST_P(ShmWaits, DeadlineNamesTheMissingRank) {
  World w(2);
  HostCommConfig cfg = shm_config(GetParam());
  cfg.timeout = 300ms;
  std::atomic<bool> done{false};
  run_ranks(w, cfg, "shm-deadline/", [&](int r, elasticrun::Communicator& c) {
    int x = 1;
    c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum);
    EXPECT_EQ(x, 2);
    if (r == 1) {
      while (!done) std::this_thread::sleep_for(1ms);
      return;
    }
    auto start = Clock::now();
    try {
      c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum);
      ADD_FAILURE() << "allreduce returned without rank 1";
    } catch (const TimeoutError& e) {
      long ms = since_us(start) / 1000;
      EXPECT_GE(ms, 290);
      EXPECT_LT(ms, 1000);
      std::string what = e.what();
      EXPECT_NE(what.find("allreduce: timed out waiting for rank 1 (shared memory)"), std::string::npos) << what;
    }
    done = true;
  });
}

// Ranks that arrive at very different times: the early ones go past the yield
// window and sleep, and every call still gives the right answer.
TEST_P(ShmWaits, LateRanksStillGetTheRightAnswer) {
  World w(3);
  run_ranks(w, shm_config(GetParam()), "shm-late/", [&](int r, elasticrun::Communicator& c) {
    for (int round = 0; round < 4; ++round) {
      if (r == round % 3) std::this_thread::sleep_for(20ms);
      for (std::size_t count : {std::size_t{5}, std::size_t{300000}}) {
        Buf in = input(DataType::f32, ReduceOp::sum, r, count), out(in.size());
        c.allreduce(in.data(), out.data(), count, DataType::f32, ReduceOp::sum);
        ASSERT_EQ(out, reduced(DataType::f32, ReduceOp::sum, 3, count)) << "round " << round << " count " << count;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, ShmWaits, ::testing::Values(Progress::busy, Progress::block),
                         [](const auto& info) { return info.param == Progress::busy ? "busy" : "block"; });

// A sleeper whose own time-outs are far away still returns as soon as the last
// rank arrives: only the arriving rank's wake can release it.
TEST(ShmGroup, ArrivalWakesASleeper) {
  TempDir dir;
  ShmGroup::Options o;
  o.size = 2;
  o.blocking = true;
  o.dir = dir.path;
  o.sleep_slice = 20s;
  auto g0 = ShmGroup::create(o);
  o.rank = 1;
  auto g1 = ShmGroup::attach(o, g0->path(), g0->token());
  g0->unlink();
  EXPECT_EQ(dir.entries(), 0u);
  AbortSignal abort;
  auto start = Clock::now();
  std::thread late([&] {
    std::this_thread::sleep_for(100ms);  // well past the yield window: rank 0 is asleep
    g1->barrier(Clock::now() + 30s, abort, "test");
  });
  g0->barrier(Clock::now() + 30s, abort, "test");
  long ms = since_us(start) / 1000;
  late.join();
  EXPECT_GE(ms, 95);
  EXPECT_LT(ms, 5000) << "the sleeper was not woken";
}

TEST(ShmGroup, AttachRefusesAForeignOrMissingSegment) {
  TempDir dir;
  ShmGroup::Options o;
  o.size = 2;
  o.dir = dir.path;
  auto g0 = ShmGroup::create(o);
  o.rank = 1;
  EXPECT_THROW(ShmGroup::attach(o, g0->path(), g0->token() + 1), Error);
  ShmGroup::Options bigger = o;
  bigger.slot_bytes = o.slot_bytes * 2;
  EXPECT_THROW(ShmGroup::attach(bigger, g0->path(), g0->token()), Error);
  EXPECT_THROW(ShmGroup::attach(o, dir.path + "/missing", g0->token()), Error);
  EXPECT_NO_THROW(ShmGroup::attach(o, g0->path(), g0->token()));
  ShmGroup::Options nowhere = o;
  nowhere.rank = 0;
  nowhere.dir = dir.path + "/does-not-exist";
  EXPECT_THROW(ShmGroup::create(nowhere), Error);
}

TEST(ShmAllreduce, SegmentFileIsGoneAfterSetUp) {
  TempDir dir;
  World w(3);
  HostCommConfig cfg = shm_config(Progress::automatic);
  cfg.shm_dir = dir.path;
  run_ranks(w, cfg, "shm-unlink/", [&](int r, elasticrun::Communicator& c) {
    int x = r;
    c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum);
    EXPECT_EQ(x, 3);
    c.barrier();  // every rank is past set-up, rank 0 included
    EXPECT_EQ(dir.entries(), 0u);
  });
}

// Rank 0 cannot create the segment: automatic falls back to UCX on every rank and
// gets the right answer; a forced shm says why it cannot.
TEST(ShmAllreduce, NoSegmentFallsBackTogether) {
  for (Algorithm a : {Algorithm::automatic, Algorithm::shm}) {
    World w(3);
    HostCommConfig cfg = shm_config(Progress::automatic);
    cfg.algorithm = a;
    cfg.shm_dir = "/nonexistent/elasticrun";
    std::atomic<int> errors{0};
    run_ranks(w, cfg, "shm-fallback/", [&](int r, elasticrun::Communicator& c) {
      Buf in = input(DataType::f32, ReduceOp::sum, r, 100000), out(in.size());
      try {
        c.allreduce(in.data(), out.data(), 100000, DataType::f32, ReduceOp::sum);
        EXPECT_EQ(a, Algorithm::automatic);
        EXPECT_EQ(out, reduced(DataType::f32, ReduceOp::sum, 3, 100000));
      } catch (const Error& e) {
        EXPECT_EQ(a, Algorithm::shm);
        std::string what = e.what();
        EXPECT_NE(what.find("ELASTICRUN_ALGORITHM=shm"), std::string::npos) << what;
        EXPECT_NE(what.find(r == 0 ? "/nonexistent/elasticrun" : "rank 0 of the host could not create"), std::string::npos)
            << what;
        ++errors;
      }
    });
    EXPECT_EQ(errors, a == Algorithm::shm ? 3 : 0);
  }
}

// Runs fn(rank, comm) on one thread per entry of `cfgs`, each rank with its own
// configuration (run_ranks gives every rank the same one).
void run_configs(World& w, std::vector<HostCommConfig> cfgs, const std::string& scope,
                 const std::function<void(int, elasticrun::Communicator&)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::string> errors(cfgs.size());
  for (int r = 0; r < static_cast<int>(cfgs.size()); ++r)
    threads.emplace_back([&, r] {
      try {
        cfgs[r].rank = r;
        cfgs[r].size = static_cast<int>(cfgs.size());
        cfgs[r].scope = scope;
        auto comm = make_host_communicator(cfgs[r], w.store, w.aborts[r]);
        fn(r, *comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// One rank busy-polls and one blocks: their own small_max settings differ (8 vs
// 32 KiB), so a 16 KiB vector would take different paths if each used its own.
// The group's setting is rank 0's, whatever the rank's progress mode.
TEST(ShmAllreduce, RanksInDifferentProgressModesAgreeOnThePath) {
  for (int busy_rank : {0, 1}) {
    World w(2);
    HostCommConfig busy = shm_config(Progress::busy), block = shm_config(Progress::block);
    ASSERT_NE(busy.shm_small_max, block.shm_small_max_blocking);
    std::vector<HostCommConfig> cfgs = busy_rank == 0 ? std::vector{busy, block} : std::vector{block, busy};
    run_configs(w, cfgs, "shm-modes/", [](int r, elasticrun::Communicator& c) {
      for (int i = 0; i < 50; ++i)
        for (std::size_t count : {std::size_t{4096}, std::size_t{1000}, std::size_t{300000}}) {
          Buf in = input(DataType::f32, ReduceOp::sum, r + i, count), out(in.size());
          c.allreduce(in.data(), out.data(), count, DataType::f32, ReduceOp::sum);
          Buf want = input(DataType::f32, ReduceOp::sum, i, count), other = input(DataType::f32, ReduceOp::sum, 1 + i, count);
          c.allreduce(want.data(), want.data(), 0, DataType::f32, ReduceOp::sum);  // a 0-byte call in between
          const float* a = reinterpret_cast<const float*>(want.data());
          const float* b = reinterpret_cast<const float*>(other.data());
          const float* got = reinterpret_cast<const float*>(out.data());
          for (std::size_t k = 0; k < count; ++k)
            ASSERT_EQ(got[k], a[k] + b[k]) << "call " << i << " count " << count << " element " << k;
        }
    });
  }
}

// Set-up that fails after rank 0 made the file (rank 1 never comes) must not
// leave the file behind.
TEST(ShmAllreduce, FailedSetUpLeavesNoFile) {
  TempDir dir;
  World w(2);
  HostCommConfig cfg = shm_config(Progress::automatic);
  cfg.shm_dir = dir.path;
  cfg.timeout = 500ms;
  std::atomic<bool> done{false};
  run_ranks(w, cfg, "shm-setup-fails/", [&](int r, elasticrun::Communicator& c) {
    if (r == 1) {
      while (!done) std::this_thread::sleep_for(1ms);
      return;
    }
    int x = 1;
    EXPECT_THROW(c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum), TimeoutError);
    done = true;
  });
  EXPECT_EQ(dir.entries(), 0u);
}

TEST(AlgorithmSetting, ParsesEveryNameAndRefusesOthers) {
  EXPECT_EQ(parse_algorithm("auto", "X"), Algorithm::automatic);
  EXPECT_EQ(parse_algorithm("shm", "X"), Algorithm::shm);
  EXPECT_EQ(parse_algorithm("hier", "X"), Algorithm::hier);
  EXPECT_EQ(parse_algorithm("rails", "X"), Algorithm::rails);
  EXPECT_EQ(parse_algorithm("ring", "X"), Algorithm::ring);
  EXPECT_EQ(parse_algorithm("rd", "X"), Algorithm::rd);
  EXPECT_EQ(parse_algorithm("rhd", "X"), Algorithm::rhd);
  EXPECT_EQ(parse_algorithm("direct", "X"), Algorithm::direct);
  EXPECT_EQ(parse_algorithm("twoshot", "X"), Algorithm::twoshot);
  for (const char* bad : {"", "SHM", "ring ", "tree"}) {
    try {
      parse_algorithm(bad, "ELASTICRUN_ALGORITHM");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), std::string("ELASTICRUN_ALGORITHM: unknown algorithm '") + bad +
                                           "' (expected auto, shm, hier, rails, ring, rd, rhd, direct or twoshot)");
    }
  }
}

TEST(ShmAllreduce, RanksOnSeveralHostsUseUcx) {
  World w(2);
  HostCommConfig cfg = shm_config(Progress::automatic);
  cfg.local_size = 1;
  run_ranks(w, cfg, "shm-hosts/", [&](int r, elasticrun::Communicator& c) {
    int x = r + 1;
    try {
      c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum);
      ADD_FAILURE() << "forced shm across hosts did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("span hosts"), std::string::npos) << e.what();
    }
  });
  World w2(2);
  cfg.algorithm = Algorithm::automatic;
  run_ranks(w2, cfg, "shm-hosts-auto/", [&](int r, elasticrun::Communicator& c) {
    int x = r + 1;
    c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum);
    EXPECT_EQ(x, 3);
  });
}

}  // namespace
}  // namespace elasticrun::collective::testing
