// Launcher over common/child_process.h: each worker's stdout and stderr on pipes read on
// the io_context.
#include "daemon/launcher.h"

#include "common/child_process.h"
#include "common/executable.h"
#include "common/log.h"

#include <boost/asio.hpp>

#include <sys/wait.h>

#include <array>
#include <csignal>
#include <filesystem>
#include <map>

namespace elasticrun::daemon {
namespace {

namespace asio = boost::asio;

struct Worker {
  std::uint32_t slot = 0;
  int pid = 0;
  std::unique_ptr<asio::posix::stream_descriptor> out, err;
  std::unique_ptr<ChildProcess> child;
  std::array<std::uint8_t, 65536> obuf{}, ebuf{};
  int open_pipes = 2;
  bool exited = false;
  int code = 0, sig = 0;
  std::unique_ptr<asio::steady_timer> drain_timer;
};

class ProcessLauncher final : public Launcher {
 public:
  ProcessLauncher(asio::io_context& io, WorkerEvents ev) : io_(io), ev_(std::move(ev)) {}
  ~ProcessLauncher() override { signal_all(SIGKILL); }

  Result<int> spawn(const WorkerSpec& spec) override;
  void signal(std::uint32_t slot, int sig) override {
    for (auto& [pid, w] : workers_)
      if (w->slot == slot && !w->exited) w->child->signal_group(sig);
  }
  void signal_all(int sig) override {
    for (auto& [pid, w] : workers_)
      if (!w->exited) w->child->signal_group(sig);
  }
  std::size_t running() const override { return workers_.size(); }

 private:
  void read(Worker& w, int stream);
  void on_exit(int pid, int status);
  void maybe_finish(int pid);

  asio::io_context& io_;
  WorkerEvents ev_;
  std::map<int, std::unique_ptr<Worker>> workers_;
};

// The raw wait status, so that an exit code and a signal are told apart.
void ProcessLauncher::on_exit(int pid, int status) {
  auto it = workers_.find(pid);
  if (it == workers_.end()) return;
  Worker& w = *it->second;
  w.exited = true;
  if (WIFSIGNALED(status)) w.sig = WTERMSIG(status);
  else w.code = WEXITSTATUS(status);
  maybe_finish(pid);
}

Result<int> ProcessLauncher::spawn(const WorkerSpec& spec) {
  if (spec.argv.empty()) return fail("empty command");
  // A relative program path is relative to the worker's directory, not the daemon's.
  std::string program = spec.argv[0];
  if (program.find('/') != std::string::npos && program[0] != '/' && !spec.cwd.empty()) program = spec.cwd + "/" + program;
  auto exe = resolve_executable(program, spec.env);
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
  auto w = std::make_unique<Worker>();
  w->slot = spec.slot;
  auto started = ChildProcess::start(io_, child, [this](int pid, int status) { on_exit(pid, status); });
  if (!started) return fail("cannot start '" + spec.argv[0] + "': " + started.error());
  w->child = std::move(*started);
  w->pid = w->child->pid();
  w->out = std::make_unique<asio::posix::stream_descriptor>(io_, w->child->take_pipe(1).release());
  w->err = std::make_unique<asio::posix::stream_descriptor>(io_, w->child->take_pipe(2).release());
  int pid = w->pid;
  Worker* raw = w.get();
  workers_[pid] = std::move(w);
  read(*raw, 1);
  read(*raw, 2);
  return pid;
}

void ProcessLauncher::read(Worker& w, int stream) {
  auto& pipe = stream == 1 ? *w.out : *w.err;
  auto& buf = stream == 1 ? w.obuf : w.ebuf;
  int pid = w.pid;
  pipe.async_read_some(asio::buffer(buf), [this, pid, stream](boost::system::error_code ec, std::size_t n) {
    auto it = workers_.find(pid);
    if (it == workers_.end()) return;
    Worker& wk = *it->second;
    if (n > 0 && ev_.on_output) ev_.on_output(wk.slot, stream, {(stream == 1 ? wk.obuf : wk.ebuf).data(), n});
    if (ec) {
      --wk.open_pipes;
      maybe_finish(pid);
      return;
    }
    read(wk, stream);
  });
}

// Reports the exit once both pipes reached EOF, or shortly after the exit if a
// grandchild keeps them open.
void ProcessLauncher::maybe_finish(int pid) {
  auto it = workers_.find(pid);
  if (it == workers_.end() || !it->second->exited) return;
  Worker& w = *it->second;
  if (w.open_pipes > 0 && !w.drain_timer) {
    w.drain_timer = std::make_unique<asio::steady_timer>(io_, std::chrono::milliseconds(500));
    w.drain_timer->async_wait([this, pid](boost::system::error_code ec) {
      if (ec) return;
      auto i = workers_.find(pid);
      if (i == workers_.end()) return;
      i->second->child->signal_group(SIGKILL);  // whatever still holds the pipes belongs to the dead worker
      i->second->open_pipes = 0;
      maybe_finish(pid);
    });
    return;
  }
  if (w.open_pipes > 0) return;
  auto done = std::move(it->second);
  workers_.erase(it);
  boost::system::error_code ec;
  if (done->drain_timer) done->drain_timer->cancel();
  done->out->close(ec);
  done->err->close(ec);
  if (ev_.on_exit) ev_.on_exit(done->slot, pid, done->code, done->sig);
  // Destroying the pipes' pending handlers must wait until they ran; post the release.
  asio::post(io_, [d = std::shared_ptr<Worker>(std::move(done))] {});
}

}  // namespace

Result<std::string> resolve_executable(const std::string& program, const std::vector<std::string>& env) {
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  for (const auto& kv : env)
    if (kv.rfind("PATH=", 0) == 0) path = kv.substr(5);
  return find_executable(program, path);
}

std::unique_ptr<Launcher> make_process_launcher(asio::io_context& io, WorkerEvents events) {
  return std::make_unique<ProcessLauncher>(io, std::move(events));
}

}  // namespace elasticrun::daemon
