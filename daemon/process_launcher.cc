// Launcher over common/child_process.h: each worker exec'd, its stdout and stderr on
// pipes read on the io_context (worker_table.h).
#include "daemon/launcher.h"

#include "common/child_process.h"
#include "common/executable.h"
#include "daemon/worker_table.h"

#include <filesystem>

namespace elasticrun::daemon {
namespace {

namespace asio = boost::asio;

class ProcessLauncher final : public Launcher {
 public:
  ProcessLauncher(asio::io_context& io, WorkerEvents ev) : io_(io), table_(io, std::move(ev)) {}

  void spawn(const WorkerSpec& spec, OnStarted on_started) override { on_started(start(spec)); }
  void signal(std::uint32_t slot, int sig) override { table_.signal(slot, sig); }
  void signal_all(int sig) override { table_.signal_all(sig); }
  void resume_output() override { table_.resume_output(); }
  std::size_t running() const override { return table_.size() + table_.lingering(); }

 private:
  Result<int> start(const WorkerSpec& spec);

  asio::io_context& io_;
  WorkerTable table_;
};

Result<int> ProcessLauncher::start(const WorkerSpec& spec) {
  auto exe = worker_program(spec);
  if (!exe) return Failure{exe.error()};
  ChildSpec child;
  child.program = *exe;
  child.argv = spec.argv;
  child.argv[0] = *exe;
  child.env = spec.env;
  // A directory missing on this host leaves the worker in ours, as it always has (the
  // man page asks for it to exist; failing the spawn instead would be a change of its own).
  if (std::error_code ec; std::filesystem::is_directory(spec.cwd, ec)) child.cwd = spec.cwd;
  child.in = ChildSpec::Stdio::null;
  child.out = child.err = ChildSpec::Stdio::pipe;
  auto started = ChildProcess::start(io_, child, [this](int pid, int status) { table_.exited(pid, status); });
  if (!started) return fail("cannot start '" + spec.argv[0] + "': " + started.error());
  auto& c = *started;
  int pid = c->pid();
  UniqueFd out = c->take_pipe(1), err = c->take_pipe(2);
  table_.add(spec.slot, pid, std::move(out), std::move(err), std::move(c));
  return pid;
}

}  // namespace

Result<std::string> resolve_executable(const std::string& program, const std::vector<std::string>& env) {
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  for (const auto& kv : env)
    if (kv.rfind("PATH=", 0) == 0) path = kv.substr(5);
  return find_executable(program, path);
}

// A relative program path is relative to the worker's directory, not the daemon's.
Result<std::string> worker_program(const WorkerSpec& spec) {
  if (spec.argv.empty()) return fail("empty command");
  std::string program = spec.argv[0];
  if (program.find('/') != std::string::npos && program[0] != '/' && !spec.cwd.empty()) program = spec.cwd + "/" + program;
  return resolve_executable(program, spec.env);
}

std::unique_ptr<Launcher> make_process_launcher(asio::io_context& io, WorkerEvents events) {
  return std::make_unique<ProcessLauncher>(io, std::move(events));
}

}  // namespace elasticrun::daemon
