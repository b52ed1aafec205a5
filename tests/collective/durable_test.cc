// Durable checkpoints of the elastic State (api/durable.h) over real collectives: rank
// 0 writes the committed state every N commits, a new job (fresh States) resumes from the
// newest intact file, a file that does not verify is passed over, and another program's
// checkpoint stops every rank with the same error.
#include "control/checkpoint_file.h"
#include "elastic_fixture.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace elasticrun::collective::testing {
namespace {

namespace fs = std::filesystem;
namespace ckpt = collective::checkpoint;

// Sets the checkpoint variables for one test (every rank's State reads them).
struct CheckpointEnv {
  fs::path dir;
  CheckpointEnv(const char* every, const char* interval) {
    char tmpl[] = "/tmp/er-durable-test-XXXXXX";
    dir = ::mkdtemp(tmpl);
    ::setenv("ELASTICRUN_CHECKPOINT_DIR", dir.c_str(), 1);
    ::setenv("ELASTICRUN_CHECKPOINT_EVERY", every, 1);
    ::setenv("ELASTICRUN_CHECKPOINT_INTERVAL", interval, 1);
  }
  ~CheckpointEnv() {
    ::unsetenv("ELASTICRUN_CHECKPOINT_DIR");
    ::unsetenv("ELASTICRUN_CHECKPOINT_EVERY");
    ::unsetenv("ELASTICRUN_CHECKPOINT_INTERVAL");
    fs::remove_all(dir);
  }
  std::string file(std::uint64_t commit) const { return (dir / ckpt::file_name(commit)).string(); }
  std::vector<std::uint64_t> commits() const {
    std::vector<std::uint64_t> out;
    for (const auto& [c, p] : ckpt::list(dir.string())) out.push_back(c);
    return out;
  }
};

// The writer is a thread of its own: wait (bounded) for the file it should write.
bool appears(const std::string& path) {
  for (int i = 0; i < 1000 && !fs::exists(path); ++i) std::this_thread::sleep_for(10ms);
  return fs::exists(path);
}

// Two ranks train "weights" = commit number for `commits` commits, waiting for each
// checkpoint that falls due so that none is skipped for a busy writer.
void train(const CheckpointEnv& env, int commits, std::uint64_t every) {
  run_contexts(2, "train/", [&](int, Context& ctx) {
    std::vector<double> w(1000, 0.0);
    std::int64_t step = 0;
    State st(ctx, quiet_hooks());
    st.track("weights", std::span(w));
    st.track_value("step", step);
    st.sync();
    for (int c = 1; c <= commits; ++c) {
      std::fill(w.begin(), w.end(), double(c));
      step = c;
      st.commit();
      if (ctx.comm().rank() == 0 && c % every == 0) {
        ASSERT_TRUE(appears(env.file(c))) << "commit " << c;
      }
      ctx.comm().barrier();
    }
  });
}

// A new job: fresh States whose values are not the checkpoint's. Returns (weights[0], step, commits) per rank.
std::vector<std::tuple<double, std::int64_t, std::uint64_t>> resume(std::size_t n_weights = 1000) {
  std::vector<std::tuple<double, std::int64_t, std::uint64_t>> seen(2);
  run_contexts(2, "resume/", [&](int r, Context& ctx) {
    std::vector<double> w(n_weights, -1.0);
    std::int64_t step = -1;
    State st(ctx, quiet_hooks());
    st.track("weights", std::span(w));
    st.track_value("step", step);
    st.sync();
    for (double x : w) ASSERT_EQ(x, w[0]);
    seen[r] = {w[0], step, st.commits()};
  });
  return seen;
}

TEST(DurableState, RankZeroWritesEveryNCommitsAndANewJobResumes) {
  CheckpointEnv env("3", "0");
  train(env, 7, 3);
  EXPECT_EQ(env.commits(), (std::vector<std::uint64_t>{6, 3}));  // not at 1, 2, 4, 5 or 7
  auto l = ckpt::read(env.file(6));
  ASSERT_TRUE(l) << l.error();
  EXPECT_EQ(l->manifest.commit, 6u);
  EXPECT_EQ(l->manifest.items.size(), 2u);
  for (const auto& [w, step, commits] : resume()) {
    EXPECT_EQ(w, 6.0);
    EXPECT_EQ(step, 6);
    EXPECT_EQ(commits, 6u);
  }
}

// Commits due faster than the disk: waiting ones are replaced by newer ones, and the
// newest is written before the State goes.
TEST(DurableState, TheNewestDueCommitIsAlwaysWritten) {
  CheckpointEnv env("1", "0");
  run_contexts(2, "fast/", [&](int, Context& ctx) {
    std::vector<double> w(1 << 16, 0.0);  // 512 KiB: each write takes a while
    State st(ctx, quiet_hooks());
    st.track("weights", std::span(w));
    st.sync();
    for (int c = 1; c <= 50; ++c) {
      w[0] = c;
      st.commit();
    }
  });
  auto files = env.commits();
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(files[0], 50u);
  auto l = ckpt::read(env.file(50));
  ASSERT_TRUE(l) << l.error();
  double first;
  std::memcpy(&first, l->payload.data(), sizeof first);
  EXPECT_EQ(first, 50.0);
}

TEST(DurableState, WithoutADirectoryNothingIsWrittenOrLoaded) {
  for (const auto& [w, step, commits] : resume()) {
    EXPECT_EQ(w, -1.0);
    EXPECT_EQ(step, -1);
    EXPECT_EQ(commits, 0u);
  }
}

TEST(DurableState, ByTimeAlone) {
  CheckpointEnv env("0", "0.05");
  run_contexts(1, "time/", [&](int, Context& ctx) {
    std::int64_t step = 0;
    State st(ctx, quiet_hooks());
    st.track_value("step", step);
    st.sync();
    std::this_thread::sleep_for(100ms);
    step = 1;
    st.commit();
    EXPECT_TRUE(appears(env.file(1)));
  });
}

TEST(DurableState, ACorruptedNewestFileIsPassedOverForThePreviousOne) {
  CheckpointEnv env("2", "0");
  train(env, 4, 2);
  ASSERT_EQ(env.commits(), (std::vector<std::uint64_t>{4, 2}));
  {
    std::fstream f(env.file(4), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);
    f.put('\x7f');
  }
  for (const auto& [w, step, commits] : resume()) {
    EXPECT_EQ(w, 2.0);
    EXPECT_EQ(step, 2);
    EXPECT_EQ(commits, 2u);
  }
  fs::resize_file(env.file(2), 50);  // torn as well: nothing intact, the job starts afresh
  for (const auto& [w, step, commits] : resume()) {
    EXPECT_EQ(w, -1.0);
    EXPECT_EQ(commits, 0u);
  }
}

TEST(DurableState, AnotherProgramsCheckpointStopsEveryRank) {
  CheckpointEnv env("1", "0");
  train(env, 1, 1);
  try {
    resume(999);  // one weight fewer than the checkpoint's
    ADD_FAILURE() << "restored a checkpoint of another layout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot restore from the durable checkpoints"), std::string::npos)
        << e.what();
  }
}

// Same names and sizes, another element type: rank 0's message says which differs.
TEST(DurableState, AnItemOfAnotherTypeIsNamedWithItsType) {
  CheckpointEnv env("1", "0");
  train(env, 1, 1);
  std::vector<std::string> said(2);
  try {
    run_contexts(2, "retyped/", [&](int r, Context& ctx) {
      std::vector<std::int64_t> w(1000, -1);  // 8000 bytes, as the checkpoint's doubles
      std::int64_t step = -1;
      State st(ctx, quiet_hooks());
      st.track("weights", std::span(w));
      st.track_value("step", step);
      try {
        st.sync();
      } catch (const Error& e) {
        said[r] = e.what();
        throw;
      }
    });
    ADD_FAILURE() << "restored a checkpoint of another type";
  } catch (const Error&) {
  }
  EXPECT_NE(said[0].find("(weights:8000:f64, step:8:u8) than this program (weights:8000:i64, step:8:u8)"),
            std::string::npos)
      << said[0];
}

// Rank 0 of a later epoch holds the state already: it must not go back to the file.
TEST(DurableState, AWorkerHoldingStateDoesNotReload) {
  CheckpointEnv env("1", "0");
  train(env, 1, 1);
  run_contexts(2, "hold/", [&](int, Context& ctx) {
    std::vector<double> w(1000, -1.0);
    std::int64_t step = -1;
    State st(ctx, quiet_hooks());
    st.track("weights", std::span(w));
    st.track_value("step", step);
    st.sync();
    EXPECT_EQ(w[0], 1.0);
    std::fill(w.begin(), w.end(), 5.0);
    st.sync();
    EXPECT_EQ(w[0], 5.0);
  });
}

TEST(DurableState, DeviceItemsAreWrittenFromTheirSnapshotAndRestoredToTheDevice) {
  CheckpointEnv env("1", "0");
  for (Snapshot snap : {Snapshot::host, Snapshot::device}) {
    auto dev = std::make_shared<FakeDevice>();
    run_contexts(1, "dev/", [&](int, Context& ctx) {
      float* d = dev->alloc<float>(4);
      for (int i = 0; i < 4; ++i) d[i] = float(i + 10);
      State st(ctx, device_hooks(dev));
      st.track("d", std::span(d, 4), snap);
      st.sync();
      st.commit();
      ASSERT_TRUE(appears(env.file(1)));
    });
    auto dev2 = std::make_shared<FakeDevice>();
    run_contexts(1, "dev2/", [&](int, Context& ctx) {
      float* d = dev2->alloc<float>(4);
      std::fill(d, d + 4, 0.0f);
      State st(ctx, device_hooks(dev2));
      st.track("d", std::span(d, 4), snap);
      int h2d = dev2->copies["h2d"];
      st.sync();
      EXPECT_EQ(dev2->copies["h2d"], h2d + 1);  // the checkpoint's bytes went to the device
      for (int i = 0; i < 4; ++i) EXPECT_EQ(d[i], float(i + 10));
    });
    fs::remove(env.file(1));
  }
}

TEST(DurableState, BadSettingsAreErrorsNamingTheVariable) {
  CheckpointEnv env("3", "0");
  for (auto [var, value] : std::vector<std::pair<const char*, const char*>>{
           {"ELASTICRUN_CHECKPOINT_EVERY", "-1"}, {"ELASTICRUN_CHECKPOINT_EVERY", "x"},
           {"ELASTICRUN_CHECKPOINT_INTERVAL", "-2"}, {"ELASTICRUN_CHECKPOINT_INTERVAL", "nan"}}) {
    ::setenv(var, value, 1);
    run_contexts(1, "bad/", [&](int, Context& ctx) {
      try {
        State st(ctx, quiet_hooks());
        ADD_FAILURE() << var << "=" << value << " was accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(var), std::string::npos) << e.what();
      }
    });
    ::setenv("ELASTICRUN_CHECKPOINT_EVERY", "3", 1);
    ::setenv("ELASTICRUN_CHECKPOINT_INTERVAL", "0", 1);
  }
  ::setenv("ELASTICRUN_CHECKPOINT_EVERY", "0", 1);
  run_contexts(1, "zero/", [&](int, Context& ctx) {
    EXPECT_THROW(State(ctx, quiet_hooks()), Error);  // neither by count nor by time: never
  });
}

}  // namespace
}  // namespace elasticrun::collective::testing
