// The running workers of a Launcher: each one's stdout and stderr pipes read on the
// io_context and handed to WorkerEvents::on_output, and its end reported once, by
// on_exit, after its output was drained.
//
// A worker's exit comes from whoever can reap it: the launcher that started it (a
// ChildProcess the table holds), or the fork server that forked it (reported by pid).
// The report waits until both pipes reached end of file, or 500 ms after the exit if
// something the worker started still holds them: that is then killed with the
// worker's process group. While WorkerEvents::hold_output says so, the pipes are not
// read (a worker that writes blocks once its pipe is full), and they are not given up
// until reading goes on.
//
// Entries are keyed by a number of the table's own, not by pid: once a worker is reaped
// its pid is free, and a new worker may get it while the old one's pipes are still being
// drained or its leftovers stopped. A pid names the running worker that has it (live_)
// only until that worker's exit.
//
// No orphans: what a worker leaves running in its process group when it exits (a
// helper it started with its output sent elsewhere, so that no pipe shows it) gets
// SIGTERM when the worker's end is reported, and SIGKILL kLeftoverGrace later if it is
// still there. Until then it counts in lingering(), so that a daemon that is stopping
// waits for it.
#pragma once

#include "common/child_process.h"
#include "common/unique_fd.h"
#include "daemon/launcher.h"

#include <boost/asio.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>

namespace elasticrun::daemon {

class WorkerTable {
 public:
  static constexpr std::chrono::milliseconds kLeftoverGrace{2000};

  WorkerTable(boost::asio::io_context& io, WorkerEvents events) : io_(io), ev_(std::move(events)) {}
  // Kills every worker's group that is still there, and what exited workers left.
  ~WorkerTable() { signal_all(SIGKILL); }
  WorkerTable(const WorkerTable&) = delete;
  WorkerTable& operator=(const WorkerTable&) = delete;

  // A worker that started: its pid (its process group's id too), our ends of its
  // stdout and stderr pipes, and the ChildProcess that reaps it when we started it
  // (null when another process reaps it and reports to exited()).
  void add(std::uint32_t slot, int pid, UniqueFd out, UniqueFd err, std::unique_ptr<ChildProcess> child = nullptr);
  // Its raw wait status (WIFEXITED, WEXITSTATUS, WIFSIGNALED, WTERMSIG), so that an exit
  // code and a signal are told apart. Unknown pids are ignored.
  void exited(int pid, int status);
  // Sends `sig` to the process groups of the workers of `slot`, or of all, that have not
  // exited yet; signal_all also to what exited workers left that is being stopped.
  void signal(std::uint32_t slot, int sig);
  void signal_all(int sig);
  // Reads again the pipes that hold_output stopped.
  void resume_output();
  // Workers whose end was not reported yet.
  std::size_t size() const { return workers_.size(); }
  // Process groups of reported workers whose leftovers are being stopped; each one's
  // end calls WorkerEvents::on_settled.
  std::size_t lingering() const { return leftovers_.size(); }
  // Pids of the workers that have not exited.
  std::vector<int> running_pids() const;

 private:
  struct Worker {
    std::uint32_t slot = 0;
    int pid = 0;
    std::unique_ptr<boost::asio::posix::stream_descriptor> out, err;
    std::unique_ptr<ChildProcess> child;
    std::array<std::uint8_t, 65536> obuf{}, ebuf{};
    int open_pipes = 2;
    std::array<bool, 2> held{};  // stdout, stderr: not read, by hold_output
    bool exited = false;
    int code = 0, sig = 0;
    std::unique_ptr<boost::asio::steady_timer> drain_timer;
    bool drain_killed = false;  // its group got the drain timer's SIGKILL (once is enough)

    void signal_group(int s) const;
  };
  using Id = std::uint64_t;
  void read(Id id, int stream);
  void maybe_finish(Id id);
  void wait_for_drain(Id id);
  void stop_leftovers(Id id, int pgid);
  void poll_leftovers_later(Id id);
  void poll_leftovers(Id id);

  // The group of a reported worker (its pid) while what is left in it is stopped.
  struct Leftover {
    int pgid = 0;
    std::unique_ptr<boost::asio::steady_timer> timer;
    std::chrono::steady_clock::time_point kill_at;
  };

  boost::asio::io_context& io_;
  WorkerEvents ev_;
  Id next_id_ = 1;
  std::map<Id, std::unique_ptr<Worker>> workers_;
  std::map<int, Id> live_;  // pid -> the worker that has it, until its exit
  std::map<Id, Leftover> leftovers_;
};

}  // namespace elasticrun::daemon
