// The running workers of a Launcher: each one's stdout and stderr pipes read on the
// io_context and handed to WorkerEvents::on_output, and its end reported once, by
// on_exit, after its output was drained.
//
// A worker's exit comes from whoever can reap it: the launcher that started it (a
// ChildProcess the table holds), or the fork server that forked it (reported by pid).
// The report waits until both pipes reached end of file, or 500 ms after the exit if
// something the worker started still holds them: that is then killed with the
// worker's process group.
#pragma once

#include "common/child_process.h"
#include "common/unique_fd.h"
#include "daemon/launcher.h"

#include <boost/asio.hpp>

#include <array>
#include <cstdint>
#include <map>
#include <memory>

namespace elasticrun::daemon {

class WorkerTable {
 public:
  WorkerTable(boost::asio::io_context& io, WorkerEvents events) : io_(io), ev_(std::move(events)) {}
  // Kills every worker's group that is still there.
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
  // exited yet.
  void signal(std::uint32_t slot, int sig);
  void signal_all(int sig);
  // Workers whose end was not reported yet.
  std::size_t size() const { return workers_.size(); }
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
    bool exited = false;
    int code = 0, sig = 0;
    std::unique_ptr<boost::asio::steady_timer> drain_timer;

    void signal_group(int s) const;
  };
  void read(Worker& w, int stream);
  void maybe_finish(int pid);

  boost::asio::io_context& io_;
  WorkerEvents ev_;
  std::map<int, std::unique_ptr<Worker>> workers_;
};

}  // namespace elasticrun::daemon
