// A child process that cannot outlive us or leak our descriptors.
//
// Every program elasticrun starts (a local daemon, a worker, a job process, a discovery
// script) starts through this type, so that each of them:
//  - runs in its own process group (unless told otherwise), so that a signal to the
//    group also reaches whatever it started;
//  - gets its death signal (PR_SET_PDEATHSIG) when this process dies, even by SIGKILL;
//  - inherits no descriptor but the ones named in its spec (and stdin, stdout, stderr
//    where they are not redirected): a leaked socket or pipe end would keep someone
//    else's connection open or someone else's end-of-file from arriving;
//  - starts with default signal dispositions (but those ignored) and an empty mask;
//  - is reaped by its own pid, never by wait(-1): other parts of the process have
//    children of their own.
//
// Lifetime: the object is owned by its user. It reaps the child itself when SIGCHLD
// comes and then calls on_exit, once, from the io_context (which may destroy the object);
// never after the object is destroyed. Destroying it before the child was reaped kills the child (its group, when
// it has one) with SIGKILL and reaps it, waiting a bounded time.
#pragma once

#include "common/result.h"
#include "common/unique_fd.h"

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <csignal>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace elasticrun {

struct ChildSpec {
  // What the child's stdin, stdout and stderr are, unless `fds` names them.
  enum class Stdio { inherit, null, pipe };

  std::string program;             // given to execve as is: resolve it first
  std::vector<std::string> argv;   // argv[0] first; empty: {program}
  // KEY=VALUE, all of it (a later entry overrides an earlier one); none: ours.
  std::optional<std::vector<std::string>> env;
  std::string cwd;                 // empty: ours
  Stdio in = Stdio::inherit, out = Stdio::inherit, err = Stdio::inherit;
  // Descriptors the child gets, as {its number, our descriptor}; ours stay ours.
  std::vector<std::pair<int, int>> fds;
  bool own_group = true;
  int death_signal = SIGKILL;
  // When the child exits, SIGKILL what it left running in its group before reaping it
  // (while the leader is unreaped, its pid cannot name a stranger's group).
  bool kill_group_on_exit = false;
};

class ChildProcess {
 public:
  // Its pid and raw wait status (WIFEXITED, WEXITSTATUS, WIFSIGNALED, WTERMSIG).
  using OnExit = std::function<void(int pid, int status)>;

  // Starts the child and waits until it has exec'd. On failure, says why ("execve
  // failed: No such file or directory") and, if `error` is given, stores the errno there.
  static Result<std::unique_ptr<ChildProcess>> start(boost::asio::io_context& io, const ChildSpec& spec,
                                                     OnExit on_exit = {}, int* error = nullptr);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  int pid() const { return pid_; }
  bool reaped() const { return status_.has_value(); }
  // Our end of the pipe asked for as its stdin (0), stdout (1) or stderr (2), once.
  UniqueFd take_pipe(int child_fd);
  // Sends `sig` to the child alone; nothing once it has been reaped.
  void signal(int sig) const;
  // Sends `sig` to its process group (to it alone without one). A group can outlive its
  // leader, so this still reaches what the child left after it was reaped.
  void signal_group(int sig) const;
  // Waits at most `limit` for the child to exit; its status, or nothing if it still runs.
  // Reaping it here does not call on_exit.
  std::optional<int> wait_for(std::chrono::milliseconds limit);

 private:
  struct Watch;
  ChildProcess(int pid, const ChildSpec& spec) : pid_(pid), group_(spec.own_group), kill_group_(spec.kill_group_on_exit) {}
  // Reaps the child if it has exited, without blocking; true once reaped.
  bool try_reap();
  void watch(boost::asio::io_context& io, OnExit on_exit);

  int pid_;
  bool group_, kill_group_;
  std::optional<int> status_;
  UniqueFd pipes_[3];
  std::shared_ptr<Watch> watch_;
};

}  // namespace elasticrun
