// How the daemon starts and stops training processes.
//
// Each worker runs in its own process group, with its stdout/stderr on pipes the
// daemon reads, and dies with the daemon (PR_SET_PDEATHSIG) so that nothing can
// outlive its supervisor even if the supervisor is SIGKILLed.
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
};

class Launcher {
 public:
  virtual ~Launcher() = default;
  // The worker's pid, or why it could not start.
  virtual Result<int> spawn(const WorkerSpec& spec) = 0;
  // Sends `sig` to the worker's process group; unknown slots are ignored.
  virtual void signal(std::uint32_t slot, int sig) = 0;
  virtual void signal_all(int sig) = 0;
  virtual std::size_t running() const = 0;
};

std::unique_ptr<Launcher> make_process_launcher(boost::asio::io_context& io, WorkerEvents events);

// Resolves argv[0] against PATH (from `env`) unless it contains a '/'; checks that the
// result is an executable regular file.
Result<std::string> resolve_executable(const std::string& program, const std::vector<std::string>& env);

}  // namespace elasticrun::daemon
