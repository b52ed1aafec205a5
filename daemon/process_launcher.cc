// Launcher over Boost.Process: async pipes for output, our own SIGCHLD reaping.
#include "daemon/launcher.h"

#include "common/executable.h"
#include "common/log.h"

#include <boost/asio.hpp>
#include <boost/process.hpp>
#include <boost/process/extend.hpp>

#include <fcntl.h>
#include <linux/close_range.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <map>

namespace elasticrun::daemon {
namespace {

namespace bp = boost::process;
namespace asio = boost::asio;

// Marks every descriptor above stderr close-on-exec (Boost.Process's own error pipe
// must stay open until exec, so they are not closed here).
void close_inherited_fds() {
  if (::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC) == 0) return;
  for (int fd = 3; fd < 4096; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // kernels before 5.11
}

// In the child between fork and exec: own process group, die with the daemon.
struct WorkerSetup : bp::extend::handler {
  template <class Executor>
  void on_exec_setup(Executor&) const {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    // Nothing of the daemon's reaches the program: not its control channel (a child
    // left behind by the worker would keep a driver's connection open), not another
    // worker's output pipe (which would then never reach end-of-file).
    close_inherited_fds();
    // The default dispositions a fresh program expects.
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
  }
};

// The worker's whole environment, given to execve as is. (Boost.Process's own
// environment type looks keys up with a compare that reads past shorter entries, which
// AddressSanitizer reports as a heap overflow; this sidesteps it.) A later KEY=VALUE
// overrides an earlier one, as it did through that type.
class WorkerEnvironment : public bp::extend::handler {
 public:
  explicit WorkerEnvironment(const std::vector<std::string>& entries) {
    std::map<std::string, std::size_t> index;
    for (const auto& kv : entries) {
      auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) continue;
      auto [it, fresh] = index.emplace(kv.substr(0, eq), strings_.size());
      if (fresh) strings_.push_back(kv);
      else strings_[it->second] = kv;
    }
    for (auto& e : strings_) pointers_.push_back(e.data());
    pointers_.push_back(nullptr);
  }
  template <class Executor>
  void on_setup(Executor& exec) const {
    exec.env = const_cast<char**>(pointers_.data());
  }

 private:
  std::vector<std::string> strings_;
  std::vector<char*> pointers_;
};

struct Worker {
  std::uint32_t slot = 0;
  int pid = 0;
  std::unique_ptr<bp::async_pipe> out, err;
  std::unique_ptr<bp::child> child;
  std::array<std::uint8_t, 65536> obuf{}, ebuf{};
  int open_pipes = 2;
  bool exited = false;
  int code = 0, sig = 0;
  std::unique_ptr<asio::steady_timer> drain_timer;
};

class ProcessLauncher final : public Launcher {
 public:
  ProcessLauncher(asio::io_context& io, WorkerEvents ev) : io_(io), ev_(std::move(ev)), sigchld_(io, SIGCHLD) {
    wait_children();
  }
  ~ProcessLauncher() override { signal_all(SIGKILL); }

  Result<int> spawn(const WorkerSpec& spec) override;
  void signal(std::uint32_t slot, int sig) override {
    for (auto& [pid, w] : workers_)
      if (w->slot == slot && !w->exited) ::kill(-pid, sig);
  }
  void signal_all(int sig) override {
    for (auto& [pid, w] : workers_)
      if (!w->exited) ::kill(-pid, sig);
  }
  std::size_t running() const override { return workers_.size(); }

 private:
  void read(Worker& w, int stream);
  void wait_children();
  void reap();
  void maybe_finish(int pid);

  asio::io_context& io_;
  WorkerEvents ev_;
  std::map<int, std::unique_ptr<Worker>> workers_;
  asio::signal_set sigchld_;
};

// Reaps our own children on SIGCHLD with waitpid, keeping the raw status so that an
// exit code and a signal are told apart (Boost.Process's on_exit folds them together).
void ProcessLauncher::wait_children() {
  sigchld_.async_wait([this](boost::system::error_code ec, int) {
    if (ec) return;
    reap();
    wait_children();
  });
}

void ProcessLauncher::reap() {
  std::vector<int> done;
  for (auto& [pid, w] : workers_) {
    if (w->exited) continue;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) != pid) continue;
    w->exited = true;
    if (WIFSIGNALED(status)) w->sig = WTERMSIG(status);
    else w->code = WEXITSTATUS(status);
    done.push_back(pid);
  }
  for (int pid : done) maybe_finish(pid);
}

Result<int> ProcessLauncher::spawn(const WorkerSpec& spec) {
  if (spec.argv.empty()) return fail("empty command");
  // A relative program path is relative to the worker's directory, not the daemon's.
  std::string program = spec.argv[0];
  if (program.find('/') != std::string::npos && program[0] != '/' && !spec.cwd.empty()) program = spec.cwd + "/" + program;
  auto exe = resolve_executable(program, spec.env);
  if (!exe) return Failure{exe.error()};
  auto w = std::make_unique<Worker>();
  w->slot = spec.slot;
  w->out = std::make_unique<bp::async_pipe>(io_);
  w->err = std::make_unique<bp::async_pipe>(io_);
  WorkerEnvironment env(spec.env);
  std::vector<std::string> args(spec.argv.begin() + 1, spec.argv.end());
  Worker* raw = w.get();
  try {
    w->child = std::make_unique<bp::child>(
        bp::exe = *exe, bp::args = args, env, bp::start_dir = spec.cwd.empty() ? "." : spec.cwd,
        bp::std_out > *w->out, bp::std_err > *w->err, bp::std_in < bp::null, WorkerSetup{});
  } catch (const std::exception& e) {
    return fail("cannot start '" + spec.argv[0] + "': " + e.what());
  }
  w->pid = w->child->id();
  int pid = w->pid;
  workers_[pid] = std::move(w);
  read(*raw, 1);
  read(*raw, 2);
  reap();  // it may have exited before we watched for it
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
      ::kill(-pid, SIGKILL);  // whatever still holds the pipes belongs to the dead worker
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
  if (done->child) done->child->detach();
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
