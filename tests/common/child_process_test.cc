// ChildProcess with real programs: its own group, death with its parent, no inherited
// descriptors, reaped by its own pid without zombies.
#include "common/child_process.h"
#include "tests/common/run_until.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

namespace elasticrun {
namespace {

using namespace std::chrono_literals;
namespace asio = boost::asio;

ChildSpec shell(const std::string& script) {
  ChildSpec spec;
  spec.program = "/bin/sh";
  spec.argv = {"sh", "-c", script};
  return spec;
}

// Everything the child writes to the pipe, until it closes it.
std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) out.append(buf, static_cast<std::size_t>(n));
  return out;
}

// Dead: no such process, or a zombie (an orphan's is init's to reap, not ours).
bool gone(int pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'Z';
}

// Waits for `pid` (our child) to end; its status, or -1 after `limit`.
int wait_child(int pid, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(5ms);
  }
  return -1;
}

class ChildProcessTest : public ::testing::Test {
 protected:
  asio::io_context io_;
};

TEST_F(ChildProcessTest, RunsInItsOwnProcessGroupOrOurs) {
  auto child = ChildProcess::start(io_, shell("exec sleep 100"));
  ASSERT_TRUE(child) << child.error();
  EXPECT_EQ(::getpgid((*child)->pid()), (*child)->pid());
  auto spec = shell("exec sleep 100");
  spec.own_group = false;
  auto ours = ChildProcess::start(io_, spec);
  ASSERT_TRUE(ours) << ours.error();
  EXPECT_EQ(::getpgid((*ours)->pid()), ::getpgrp());
}

TEST_F(ChildProcessTest, SignalToTheGroupReachesWhatItStarted) {
  auto spec = shell("sleep 100 & echo $!; wait");
  spec.out = ChildSpec::Stdio::pipe;
  auto child = ChildProcess::start(io_, spec);
  ASSERT_TRUE(child) << child.error();
  UniqueFd out = (*child)->take_pipe(1);
  std::string line;
  char c;
  while (::read(out.get(), &c, 1) == 1 && c != '\n') line += c;
  int grandchild = std::stoi(line);
  (*child)->signal_group(SIGKILL);
  ASSERT_TRUE(testing::run_until(io_, [&] { return (*child)->reaped(); }));
  EXPECT_TRUE(testing::run_until(io_, [&] { return gone(grandchild); }, 3s));
}

TEST_F(ChildProcessTest, DiesWhenItsParentDies) {
  // This test process adopts orphans, so that it sees the grandchild's end itself.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int report[2];
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  pid_t parent = ::fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    asio::io_context io;
    auto child = ChildProcess::start(io, shell("exec sleep 100"));
    int pid = child ? (*child)->pid() : -1;
    [[maybe_unused]] auto n = ::write(report[1], &pid, sizeof pid);
    ::_exit(0);  // no destructor runs: only the death signal can stop the child
  }
  ::close(report[1]);
  int pid = -1;
  ASSERT_EQ(::read(report[0], &pid, sizeof pid), static_cast<ssize_t>(sizeof pid));
  ::close(report[0]);
  ASSERT_GT(pid, 0);
  EXPECT_NE(wait_child(parent, 5s), -1);
  int status = wait_child(pid, 5s);
  if (status == -1) {
    ::kill(pid, SIGKILL);
    wait_child(pid, 5s);
  }
  ASSERT_NE(status, -1) << "the child outlived its parent";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST_F(ChildProcessTest, InheritsOnlyTheDescriptorsNamed) {
  // Two descriptors without close-on-exec: one named (as 7), one not.
  UniqueFd leaked(::open("/dev/null", O_RDONLY)), named(::open("/dev/null", O_RDONLY));
  ASSERT_TRUE(leaked && named);
  std::string leaked_fd = std::to_string(leaked.get()), named_fd = std::to_string(named.get());
  auto spec = shell("[ -e /proc/$$/fd/" + leaked_fd + " ] && echo leaked " + leaked_fd + "; [ -e /proc/$$/fd/" +
                    named_fd + " ] && echo leaked " + named_fd + "; [ -e /proc/$$/fd/7 ] || echo missing 7; true");
  spec.out = ChildSpec::Stdio::pipe;
  spec.fds = {{7, named.get()}};
  auto child = ChildProcess::start(io_, spec);
  ASSERT_TRUE(child) << child.error();
  UniqueFd out = (*child)->take_pipe(1);
  EXPECT_EQ(read_all(out.get()), "");
}

TEST_F(ChildProcessTest, IsReapedWithItsStatusAndLeavesNoZombie) {
  int exit_pid = 0, exit_status = -1;
  auto child = ChildProcess::start(io_, shell("exit 3"), [&](int pid, int status) {
    exit_pid = pid;
    exit_status = status;
  });
  ASSERT_TRUE(child) << child.error();
  int pid = (*child)->pid();
  ASSERT_TRUE(testing::run_until(io_, [&] { return exit_pid != 0; }));
  EXPECT_EQ(exit_pid, pid);
  EXPECT_TRUE(WIFEXITED(exit_status) && WEXITSTATUS(exit_status) == 3) << exit_status;
  EXPECT_TRUE((*child)->reaped());
  errno = 0;
  EXPECT_EQ(::waitpid(pid, nullptr, WNOHANG), -1);  // not a zombie: already reaped
  EXPECT_EQ(errno, ECHILD);
}

TEST_F(ChildProcessTest, DestroyingItKillsAndReapsItWithoutACallback) {
  bool called = false;
  auto child = ChildProcess::start(io_, shell("exec sleep 100"), [&](int, int) { called = true; });
  ASSERT_TRUE(child) << child.error();
  int pid = (*child)->pid();
  child->reset();
  errno = 0;
  EXPECT_EQ(::waitpid(pid, nullptr, WNOHANG), -1);  // neither running nor a zombie
  EXPECT_EQ(errno, ECHILD);
  testing::run_until(io_, [] { return false; }, 100ms);
  EXPECT_FALSE(called);
}

TEST_F(ChildProcessTest, DoesNotReapOtherChildren) {
  pid_t other = ::fork();
  if (other == 0) ::_exit(7);
  bool done = false;
  auto child = ChildProcess::start(io_, shell("exit 0"), [&](int, int) { done = true; });
  ASSERT_TRUE(child) << child.error();
  ASSERT_TRUE(testing::run_until(io_, [&] { return done; }));
  int status = wait_child(other, 5s);
  ASSERT_NE(status, -1);
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

TEST_F(ChildProcessTest, ExecFailureIsAnErrorAndLeavesNoZombie) {
  ChildSpec spec;
  spec.program = "/nonexistent/program";
  int error = 0;
  auto child = ChildProcess::start(io_, spec, {}, &error);
  ASSERT_FALSE(child);
  EXPECT_EQ(child.error(), "execve failed: No such file or directory");
  EXPECT_EQ(error, ENOENT);
  errno = 0;
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST_F(ChildProcessTest, GetsItsEnvironmentLaterEntriesWinning) {
  ChildSpec spec;
  spec.program = "/usr/bin/env";
  spec.env = std::vector<std::string>{"A=1", "B=2", "A=3", "=junk", "junk"};
  spec.out = ChildSpec::Stdio::pipe;
  auto child = ChildProcess::start(io_, spec);
  ASSERT_TRUE(child) << child.error();
  UniqueFd out = (*child)->take_pipe(1);
  EXPECT_EQ(read_all(out.get()), "A=3\nB=2\n");
}

TEST_F(ChildProcessTest, GetsItsDirectoryAndDefaultSignals) {
  // Builtins only: a shell blocks every signal around a fork of its own.
  auto spec = shell("pwd; while read k v; do case $k in SigBlk:|SigIgn:) echo $k $v;; esac; done </proc/$$/status");
  spec.cwd = "/tmp";
  spec.out = ChildSpec::Stdio::pipe;
  std::signal(SIGPIPE, SIG_IGN);  // as elasticrun and elasticrund have it
  // Signals this process inherited as ignored (nohup's SIGHUP, a background shell's
  // SIGINT and SIGQUIT) stay ignored, as exec keeps them; SIGPIPE goes back to default.
  std::ifstream status("/proc/self/status");
  std::string line;
  unsigned long long ignored = 0;
  while (std::getline(status, line))
    if (line.rfind("SigIgn:", 0) == 0) ignored = std::stoull(line.substr(7), nullptr, 16);
  ASSERT_NE(ignored & (1ULL << (SIGPIPE - 1)), 0u);
  auto child = ChildProcess::start(io_, spec);
  std::signal(SIGPIPE, SIG_DFL);
  ASSERT_TRUE(child) << child.error();
  UniqueFd out = (*child)->take_pipe(1);
  EXPECT_EQ(read_all(out.get()), fmt::format("/tmp\nSigBlk: 0000000000000000\nSigIgn: {:016x}\n",
                                             ignored & ~(1ULL << (SIGPIPE - 1))));
}

}  // namespace
}  // namespace elasticrun
