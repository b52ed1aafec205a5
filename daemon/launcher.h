// How the daemon starts and stops training processes.
//
// Each worker runs in its own process group, with its stdout/stderr on pipes the
// daemon reads, and dies with the daemon (PR_SET_PDEATHSIG, directly or through the
// fork server that forked it) so that nothing can outlive its supervisor even if the
// supervisor is SIGKILLed.
//
// Two implementations: the process launcher execs every worker (process_launcher.cc);
// the fork-server launcher (fork_server_launcher.cc, elasticrun --preload) forks Python
// workers from an interpreter that has imported the job's modules already, and hands
// every other worker, or every worker once its server failed, to a process launcher.
#pragma once

#include "common/result.h"

#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace elasticrun::daemon {

struct WorkerSpec {
  std::uint32_t slot = 0;
  std::vector<std::string> argv;
  std::vector<std::string> env;  // KEY=VALUE, the whole environment
  std::string cwd;
};

struct WorkerEvents {
  // stream: 1 stdout, 2 stderr.
  std::function<void(std::uint32_t slot, int stream, std::span<const std::uint8_t>)> on_output;
  // Called once per worker, after its output has been drained.
  std::function<void(std::uint32_t slot, int pid, int code, int signal)> on_exit;
  // What an exited worker left in its process group is gone (Launcher::running() went
  // down without an on_exit).
  std::function<void()> on_settled;
  // Asked after each piece of output: true stops reading the workers' pipes (they block
  // when theirs fill) until Launcher::resume_output(). Unset: never.
  std::function<bool()> hold_output;
};

class Launcher {
 public:
  // The worker's pid, or why it could not start. Called once per spawn(), from inside it
  // or later from the io_context (a fork server answers when it can), never after the
  // launcher is destroyed, and before any other event of that worker.
  using OnStarted = std::function<void(Result<int>)>;

  virtual ~Launcher() = default;
  virtual void spawn(const WorkerSpec& spec, OnStarted on_started) = 0;
  // Sends `sig` to the worker's process group (a worker still starting gets it once it
  // has started); unknown slots are ignored.
  virtual void signal(std::uint32_t slot, int sig) = 0;
  virtual void signal_all(int sig) = 0;
  // Gives up the workers still starting (a fork server has not forked them yet): each
  // one's on_started gets an error now, and one started later is killed at once.
  virtual void abandon_starting() {}
  // Reads the output that WorkerEvents::hold_output stopped again.
  virtual void resume_output() = 0;
  // Workers starting or started whose end was not reported yet, and the process groups
  // of reported ones whose leftovers are still being stopped (worker_table.h).
  virtual std::size_t running() const = 0;

  // Starts torch's TCPStore server (torch.distributed.TCPStore, is_master) on `port`, in
  // a process of its own, as torchrun's agent hosts the store for its workers. `done`
  // gets its pid once it listens there, or why it does not; called once, from inside
  // the call or later from the io_context, never after the launcher is destroyed. Only
  // the fork-server launcher can, once its server has imported the job's modules: the
  // store is one more fork of it (no interpreter to start, nothing to import). A new
  // store, drop_store() and signal_all() end the one before.
  using OnStore = std::function<void(Result<int>)>;
  virtual void host_store(std::uint16_t port, OnStore done) {
    (void)port;
    done(fail("no fork server (elasticrun --preload) runs here"));
  }
  virtual void drop_store() {}
};

std::unique_ptr<Launcher> make_process_launcher(boost::asio::io_context& io, WorkerEvents events);
// With modules to preload, the fork-server launcher; without, the process launcher.
std::unique_ptr<Launcher> make_launcher(boost::asio::io_context& io, WorkerEvents events,
                                        std::vector<std::string> preload);

// The worker's program: argv[0], relative to the worker's directory when it is a
// relative path, else looked up in the worker's PATH.
Result<std::string> worker_program(const WorkerSpec& spec);

// Resolves argv[0] against PATH (from `env`) unless it contains a '/'; checks that the
// result is an executable regular file.
Result<std::string> resolve_executable(const std::string& program, const std::vector<std::string>& env);

}  // namespace elasticrun::daemon
