// The fork server of one job on this host (elasticrun --preload): the job's Python
// interpreter, started with the job's interpreter options as `PYTHON [options] -c
// <fork_server.py> 3 MODULE...`, which imports the job's modules once and then forks
// one worker per request, so that a worker costs a fork instead of an interpreter's
// start and the modules' import. Its side: fork_server.py; the messages between us:
// fork_protocol.h, over a Unix socket pair (its end is its descriptor 3).
//
// No orphans: the daemon starts the server as a ChildProcess (PR_SET_PDEATHSIG: it
// dies with the daemon, even a SIGKILLed one), and each worker it forks sets
// PR_SET_PDEATHSIG itself before anything else (it dies with the server). Destroying
// a ForkServer kills the server, and so its workers.
//
// Events come from the io_context; a callback may destroy the ForkServer. After
// on_gone (the server exited, closed its socket, gave up, sent what does not decode,
// or was not ready within kReadyLimit) no event follows and the server is killed:
// requests not yet answered are not answered, and its workers die with it.
#pragma once

#include "common/child_process.h"
#include "common/frame.h"
#include "common/result.h"
#include "common/unique_fd.h"
#include "daemon/fork_protocol.h"

#include <boost/asio.hpp>

#include <array>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace elasticrun::daemon {

class ForkServer {
 public:
  // How long the imports may take: a cold start of torch on a busy host takes seconds,
  // an import that hangs must not hold the job's workers forever.
  static constexpr std::chrono::seconds kReadyLimit{60};

  struct Setup {
    std::string interpreter;           // its path
    std::vector<std::string> options;  // interpreter options, before -c
    std::vector<std::string> preload;  // module names
    std::vector<std::string> env;      // KEY=VALUE, the server's whole environment
    std::string cwd;                   // empty or missing: the daemon's
  };
  struct Events {
    std::function<void()> on_ready;
    std::function<void(std::uint64_t id, int pid)> on_started;
    std::function<void(std::uint64_t id, const std::string& why)> on_refused;
    std::function<void(int pid, int status)> on_exited;  // the raw wait status
    std::function<void(const std::string& why)> on_gone;
  };

  static Result<std::unique_ptr<ForkServer>> start(boost::asio::io_context& io, const Setup& setup, Events events);
  ~ForkServer();
  ForkServer(const ForkServer&) = delete;
  ForkServer& operator=(const ForkServer&) = delete;

  // Asks for a worker; our ends of its stdout and stderr go with the request (the
  // server's copies are closed once it forked or refused).
  void spawn(const fork::Spawn& request, UniqueFd out, UniqueFd err);
  int pid() const { return child_->pid(); }

 private:
  struct Outgoing {
    wire::Bytes bytes;
    std::vector<UniqueFd> fds;  // sent with the first byte
    std::size_t sent = 0;
  };
  ForkServer(boost::asio::io_context& io, int fd, Events events);
  void read();
  void handle(const Frame& f);
  void flush();
  void gone(const std::string& why);

  boost::asio::posix::stream_descriptor sock_;
  Events ev_;
  std::unique_ptr<ChildProcess> child_;
  boost::asio::steady_timer ready_timer_;
  FrameParser parser_;
  // Shared with the read in flight, which may complete after *this is gone.
  std::shared_ptr<std::array<std::uint8_t, 65536>> buf_ = std::make_shared<std::array<std::uint8_t, 65536>>();
  std::deque<Outgoing> queue_;
  bool waiting_to_write_ = false, gone_ = false;
  // Handlers check it before touching the object: a callback may have destroyed it.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace elasticrun::daemon
