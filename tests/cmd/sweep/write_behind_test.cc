// The sweep's write-behind thread, on real files: order, a queued replace superseded by
// a newer one, flush(), everything written by the destructor, a failed write logged
// without stopping the ones after it.
#include "cmd/sweep/write_behind.h"

#include "cmd/sweep/experiment.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace elasticrun::sweep {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class WriteBehindTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/write-behind-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(WriteBehindTest, AppendsInOrderAndTheNewestReplaceWins) {
  WriteBehind w;
  for (int i = 0; i < 1000; ++i) {
    w.append(dir_ / "log", std::to_string(i) + "\n");
    w.replace(dir_ / "state", "state " + std::to_string(i) + "\n");
  }
  w.flush();
  std::string expected;
  for (int i = 0; i < 1000; ++i) expected += std::to_string(i) + "\n";
  EXPECT_EQ(read(dir_ / "log"), expected);
  EXPECT_EQ(read(dir_ / "state"), "state 999\n");
  EXPECT_FALSE(fs::exists(dir_ / "state.tmp"));
}

fs::path numbered(const fs::path& dir, int i) { return dir / fmt::format("f{}", i); }

TEST_F(WriteBehindTest, TheDestructorWritesWhatIsQueued) {
  {
    WriteBehind w;
    for (int i = 0; i < 200; ++i) w.replace(numbered(dir_, i), std::to_string(i), i % 2 == 0);
  }
  for (int i = 0; i < 200; ++i) EXPECT_EQ(read(numbered(dir_, i)), std::to_string(i)) << i;
}

TEST_F(WriteBehindTest, AFailedWriteDoesNotStopTheOthers) {
  WriteBehind w;
  w.replace(dir_ / "missing-dir" / "x", "lost");
  w.append(dir_ / "missing-dir" / "y", "lost");
  w.replace(dir_ / "kept", "kept");
  w.flush();
  EXPECT_FALSE(fs::exists(dir_ / "missing-dir"));
  EXPECT_EQ(read(dir_ / "kept"), "kept");
}

TEST_F(WriteBehindTest, FlushWithNothingQueuedReturns) {
  WriteBehind w;
  w.flush();
  w.replace(dir_ / "a", "1");
  w.flush();
  w.flush();
  EXPECT_EQ(read(dir_ / "a"), "1");
}

// The experiment writes a trial's progress behind, but its end before save_trial returns:
// a sweep killed right after must find it there when resumed.
TEST_F(WriteBehindTest, ATrialsEndIsOnDiskWhenSaveReturns) {
  auto x = Experiment::create((dir_ / "exp").string(), nlohmann::json{{"seed", 1}});
  ASSERT_TRUE(x.ok()) << x.error();
  TrialRecord t;
  t.id = "0000";
  t.config = {{"lr", 0.1}};
  ASSERT_TRUE(x->add_trial(t).ok());
  t.state = "running";
  for (int i = 0; i < 200; ++i) {
    t.last_step = i;
    x->save_trial(t);
    x->append_result(t.id, nlohmann::json{{"step", i}});
  }
  t.state = "finished";
  x->save_trial(t);
  auto status = nlohmann::json::parse(read(x->trial_dir(t.id) / "status.json"));
  EXPECT_EQ(status["state"], "finished");
  EXPECT_EQ(status["last_step"], 199);
}

}  // namespace
}  // namespace elasticrun::sweep
