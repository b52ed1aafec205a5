// WorkerTable: a worker's report belongs to that worker even when its pid is given to a
// new worker while the old one's pipes are still being drained (the pid is free once
// the old worker was reaped). The first worker is a real process; the second is added
// under the pid the kernel freed, as a fork server would report a new fork that got it.
#include "daemon/worker_table.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <thread>
#include <string>
#include <vector>

namespace elasticrun::daemon {
namespace {

struct Report {
  std::uint32_t slot;
  int pid, code, sig;
  std::string out;
};

TEST(WorkerTable, AReusedPidReportsEachWorkerAsItself) {
  boost::asio::io_context io;
  std::vector<Report> reports;
  std::map<std::uint32_t, std::string> output;
  WorkerEvents ev;
  ev.on_output = [&](std::uint32_t slot, int, std::span<const std::uint8_t> d) {
    output[slot].append(reinterpret_cast<const char*>(d.data()), d.size());
  };
  ev.on_exit = [&](std::uint32_t slot, int pid, int code, int sig) {
    reports.push_back({slot, pid, code, sig, output[slot]});
  };
  WorkerTable table(io, ev);

  // Worker A (slot 0): a real process that writes and exits 3; the test keeps a copy of
  // its stdout's write end, as a grandchild outside its group would, so its report
  // waits for the drain.
  int a_out[2], a_err[2];
  ASSERT_EQ(::pipe(a_out), 0);
  ASSERT_EQ(::pipe(a_err), 0);
  pid_t a = ::fork();
  if (a == 0) {
    ::setpgid(0, 0);
    ::write(a_out[1], "from a", 6);
    ::_exit(3);
  }
  ::setpgid(a, a);
  ::close(a_err[1]);
  int held = a_out[1];
  table.add(0, a, UniqueFd(a_out[0]), UniqueFd(a_err[0]));
  int status = 0;
  ASSERT_EQ(::waitpid(a, &status, 0), a);
  table.exited(a, status);
  io.run_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(reports.empty());  // A's stdout is still open: its drain has begun

  // Worker B (slot 1) gets A's pid.
  int b_out[2], b_err[2];
  ASSERT_EQ(::pipe(b_out), 0);
  ASSERT_EQ(::pipe(b_err), 0);
  table.add(1, a, UniqueFd(b_out[0]), UniqueFd(b_err[0]));
  EXPECT_EQ(table.running_pids(), std::vector<int>{a});
  ::write(b_out[1], "from b", 6);
  ::close(b_out[1]);
  ::close(b_err[1]);
  table.exited(a, 7 << 8);  // B exits 7
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (reports.size() < 2 && std::chrono::steady_clock::now() < deadline)
    io.run_for(std::chrono::milliseconds(20));
  ::close(held);
  ASSERT_EQ(reports.size(), 2u);
  // B's pipes closed at once: its report comes first; A's after its 500 ms drain.
  EXPECT_EQ(reports[0].slot, 1u);
  EXPECT_EQ(reports[0].code, 7);
  EXPECT_EQ(reports[0].out, "from b");
  EXPECT_EQ(reports[1].slot, 0u);
  EXPECT_EQ(reports[1].code, 3);
  EXPECT_EQ(reports[1].out, "from a");
  EXPECT_TRUE(table.running_pids().empty());
  EXPECT_EQ(table.size(), 0u);
}

// A worker that exits while a process it left in its group holds its stdout: the report
// waits for the drain, and 500 ms after the exit the group gets SIGKILL (drain_killed),
// which ends the holder even if it ignores SIGTERM; what both wrote is in the report.
TEST(WorkerTable, APipeHeldInTheGroupIsKilledAfterTheDrainWait) {
  boost::asio::io_context io;
  std::vector<Report> reports;
  std::string out;
  WorkerEvents ev;
  ev.on_output = [&](std::uint32_t, int, std::span<const std::uint8_t> d) {
    out.append(reinterpret_cast<const char*>(d.data()), d.size());
  };
  ev.on_exit = [&](std::uint32_t slot, int pid, int code, int sig) { reports.push_back({slot, pid, code, sig, out}); };
  WorkerTable table(io, ev);
  int po[2], pe[2], pg[2];  // stdout, stderr, and the grandchild's pid for the test
  ASSERT_EQ(::pipe(po), 0);
  ASSERT_EQ(::pipe(pe), 0);
  ASSERT_EQ(::pipe(pg), 0);
  pid_t w = ::fork();
  if (w == 0) {
    ::setpgid(0, 0);
    ::close(po[0]);
    ::close(pe[0]);
    ::close(pg[0]);
    pid_t g = ::fork();
    if (g == 0) {  // the holder: same group, keeps stdout open, deaf to SIGTERM
      ::signal(SIGTERM, SIG_IGN);
      ::write(po[1], "holder ", 7);
      ::sleep(60);
      ::_exit(0);
    }
    ::write(pg[1], &g, sizeof g);
    ::write(po[1], "worker", 6);
    ::_exit(0);
  }
  ::setpgid(w, w);
  ::close(po[1]);
  ::close(pe[1]);
  ::close(pg[1]);
  pid_t g = 0;
  ASSERT_EQ(::read(pg[0], &g, sizeof g), static_cast<ssize_t>(sizeof g));
  ::close(pg[0]);
  table.add(0, w, UniqueFd(po[0]), UniqueFd(pe[0]));
  int status = 0;
  ASSERT_EQ(::waitpid(w, &status, 0), w);
  auto exited_at = std::chrono::steady_clock::now();
  table.exited(w, status);
  auto deadline = exited_at + std::chrono::seconds(5);
  while (reports.empty() && std::chrono::steady_clock::now() < deadline) io.run_for(std::chrono::milliseconds(20));
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_GE(std::chrono::steady_clock::now() - exited_at, std::chrono::milliseconds(450));
  EXPECT_EQ(reports[0].code, 0);
  EXPECT_NE(reports[0].out.find("worker"), std::string::npos) << reports[0].out;
  EXPECT_NE(reports[0].out.find("holder"), std::string::npos) << reports[0].out;
  // The holder got the group's SIGKILL at the drain: it is gone (reaped by whoever
  // adopted it) or a zombie now, not only after the leftovers' grace (SIGTERM, which it
  // ignores, then SIGKILL kLeftoverGrace later).
  bool gone = false;
  for (int i = 0; i < 15 && !gone; ++i) {
    std::ifstream stat("/proc/" + std::to_string(g) + "/stat");
    std::string text;
    std::getline(stat, text);
    gone = !stat || text.empty() || text.substr(text.rfind(')') + 2, 1) == "Z";
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(gone) << "the holder " << g << " outlived the drain kill";
  if (!gone) ::kill(g, SIGKILL);
}

}  // namespace
}  // namespace elasticrun::daemon
