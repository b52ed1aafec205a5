// Job records and reclaim: a dead job's leftover worker groups are killed and its record
// removed; a live job's record, finished or half-written, is left alone.
#include "daemon/job_records.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

namespace ed = elasticrun::daemon;
namespace fs = std::filesystem;

namespace {

struct JobRecordsTest : ::testing::Test {
  fs::path dir = fs::temp_directory_path() / ("er-job-records-test." + std::to_string(::getpid()));
  void SetUp() override { fs::create_directories(dir); }
  void TearDown() override { fs::remove_all(dir); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir / name) << text; }

  // A pid that named a process of ours a moment ago and names none now.
  static int dead_pid() {
    int pid = ::fork();
    if (pid == 0) ::_exit(0);
    ::waitpid(pid, nullptr, 0);
    return pid;
  }
  // A child leading its own process group, sleeping until killed.
  static int group_leader() {
    int pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::pause();
      ::_exit(0);
    }
    ::setpgid(pid, pid);
    return pid;
  }
  // Whether `pid` (our child) still runs 100 ms from now (time for a SIGKILL to land).
  static bool still_runs(int pid) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return ::waitpid(pid, nullptr, WNOHANG) == 0;
  }
  // Whether `pid` (our child) ends within 5 s; reaps it.
  static bool ends(int pid) {
    for (int i = 0; i < 500; ++i) {
      if (::waitpid(pid, nullptr, WNOHANG) == pid) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

}  // namespace

TEST_F(JobRecordsTest, ADeadJobsWorkersAreKilledAndItsRecordRemoved) {
  int worker = group_leader();
  int job = dead_pid();
  write("job." + std::to_string(job),
        "job " + std::to_string(job) + " 1\n" + std::to_string(worker) + " " +
            std::to_string(ed::process_start_time(worker)) + "\n");
  auto report = ed::reclaim_jobs(dir.string());
  EXPECT_EQ(report.jobs, 1);
  EXPECT_EQ(report.groups, 1);
  EXPECT_TRUE(ends(worker)) << "the dead job's worker still runs";
  EXPECT_FALSE(fs::exists(dir / ("job." + std::to_string(job))));
}

TEST_F(JobRecordsTest, ALiveJobsRecordAndItsWorkersAreLeftAlone) {
  int worker = group_leader();
  {
    ed::JobRecord record(dir.string());  // this process is the live job
    record.add(worker);
    auto report = ed::reclaim_jobs(dir.string());
    EXPECT_EQ(report.jobs, 0);
    EXPECT_TRUE(still_runs(worker)) << "a live job's worker was killed";
    EXPECT_TRUE(fs::exists(dir / ("job." + std::to_string(::getpid()))));
  }
  EXPECT_FALSE(fs::exists(dir / ("job." + std::to_string(::getpid())))) << "the record outlived its job";
  ::kill(worker, SIGKILL);
  EXPECT_TRUE(ends(worker));
}

TEST_F(JobRecordsTest, ALiveJobsHalfWrittenRecordIsLeftAlone) {
  // Reclaim runs while jobs run (after any job's abnormal end): a live job may be
  // between writing its temporary record and renaming it.
  std::string live = "job." + std::to_string(::getpid()) + ".tmp";
  std::string dead = "job." + std::to_string(dead_pid()) + ".tmp";
  write(live, "job 1 1\n");
  write(dead, "job 1 1\n");
  ed::reclaim_jobs(dir.string());
  EXPECT_TRUE(fs::exists(dir / live)) << "a live job's record was removed while it was being written";
  EXPECT_FALSE(fs::exists(dir / dead)) << "a dead job's half-written record stayed";
}

TEST_F(JobRecordsTest, AWorkerPidReusedByAnotherProcessIsNotKilled) {
  int job = dead_pid();
  int stranger = group_leader();
  // The record names the stranger's pid with another start time: a worker that ended,
  // its pid since reused.
  write("job." + std::to_string(job), "job " + std::to_string(job) + " 1\n" + std::to_string(stranger) + " " +
                                          std::to_string(ed::process_start_time(stranger) + 1) + "\n");
  auto report = ed::reclaim_jobs(dir.string());
  EXPECT_EQ(report.jobs, 1);
  EXPECT_EQ(report.groups, 0);
  EXPECT_TRUE(still_runs(stranger)) << "a process that reused a recorded pid was killed";
  ::kill(stranger, SIGKILL);
  EXPECT_TRUE(ends(stranger));
}
