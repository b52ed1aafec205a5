// Launcher for a job with modules to preload (elasticrun --preload): a worker that is a
// Python run the fork server can make (common/python_command.h) is forked by the
// job's fork server (fork_server.h), started with the first such worker's interpreter,
// options, directory and environment; every other worker is exec'd by a process
// launcher. If the server cannot start, gives up, or dies, that is logged once and
// every later worker is exec'd: a worker never fails to start because the optimisation
// did. The server's workers that were running die with it, reported killed by SIGKILL.
#include "daemon/launcher.h"

#include "common/env.h"
#include "common/log.h"
#include "common/python_command.h"
#include "daemon/fork_server.h"
#include "daemon/worker_table.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <map>

namespace elasticrun::daemon {
namespace {

namespace asio = boost::asio;

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

class ForkServerLauncher final : public Launcher {
 public:
  ForkServerLauncher(asio::io_context& io, WorkerEvents ev, std::vector<std::string> preload)
      : io_(io), preload_(std::move(preload)), table_(io, ev), plain_(make_process_launcher(io, ev)) {}

  void spawn(const WorkerSpec& spec, OnStarted on_started) override;
  void signal(std::uint32_t slot, int sig) override {
    plain_->signal(slot, sig);
    table_.signal(slot, sig);
    for (auto& [id, p] : pending_)
      if (p.spec.slot == slot) p.signals.push_back(sig);
  }
  void signal_all(int sig) override {
    plain_->signal_all(sig);
    table_.signal_all(sig);
    for (auto& [id, p] : pending_) p.signals.push_back(sig);
  }
  std::size_t running() const override { return plain_->running() + table_.size() + pending_.size(); }

 private:
  // A worker asked of the server and not answered yet: what it needs to start, or to be
  // exec'd instead, and the signals sent to it meanwhile.
  struct Pending {
    WorkerSpec spec;
    OnStarted on_started;
    UniqueFd out, err;  // our ends of its pipes
    std::vector<int> signals;
  };
  // The server for this worker, started if need be; null: exec it.
  ForkServer* server_for(const WorkerSpec& spec, const PythonCommand& py, const std::string& program);
  ForkServer::Events server_events();
  void started(std::uint64_t id, int pid);
  void refused(std::uint64_t id, const std::string& why);
  void give_up(const std::string& why);
  void exec_instead(Pending p);

  asio::io_context& io_;
  std::vector<std::string> preload_;
  WorkerTable table_;  // the server's workers
  std::unique_ptr<Launcher> plain_;
  std::unique_ptr<ForkServer> server_;
  std::string server_key_;  // the interpreter and options it runs
  std::string interpreter_;
  bool failed_ = false;
  std::map<std::uint64_t, Pending> pending_;
  std::uint64_t next_id_ = 0;
  std::chrono::steady_clock::time_point started_at_;
};

void ForkServerLauncher::spawn(const WorkerSpec& spec, OnStarted on_started) {
  auto py = parse_python_command(spec.argv);
  auto program = worker_program(spec);
  ForkServer* server = py && program && !failed_ ? server_for(spec, *py, *program) : nullptr;
  int out[2], err[2];
  if (!server || ::pipe2(out, O_CLOEXEC) != 0) return plain_->spawn(spec, std::move(on_started));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]), ::close(out[1]);
    return plain_->spawn(spec, std::move(on_started));
  }
  fork::Spawn request;
  request.id = ++next_id_;
  request.mode = static_cast<std::uint8_t>(py->mode);
  request.target = py->target;
  request.args = py->args;
  request.argv = spec.argv;
  request.argv[0] = *program;  // as the process launcher execs it: sys.orig_argv[0], the title
  request.env = spec.env;
  request.cwd = spec.cwd;
  pending_[request.id] = Pending{spec, std::move(on_started), UniqueFd(out[0]), UniqueFd(err[0]), {}};
  server->spawn(request, UniqueFd(out[1]), UniqueFd(err[1]));
}

ForkServer* ForkServerLauncher::server_for(const WorkerSpec& spec, const PythonCommand& py, const std::string& program) {
  std::string key = program;
  for (const auto& o : py.options) key += '\0' + o;
  if (server_) return key == server_key_ ? server_.get() : nullptr;
  interpreter_ = program;
  ForkServer::Setup setup{program, py.options, preload_, {}, spec.cwd};
  // Each worker's own OMP_NUM_THREADS: OpenMP reads it when it loads, in the server
  // (fork_server.py sets the worker's thread count from it).
  std::string omp = std::string(env::kOmpNumThreads) + "=";
  for (const auto& kv : spec.env)
    if (!kv.starts_with(omp)) setup.env.push_back(kv);
  auto s = ForkServer::start(io_, setup, server_events());
  if (!s) {
    give_up(s.error());
    return nullptr;
  }
  server_ = std::move(*s);
  server_key_ = key;
  started_at_ = std::chrono::steady_clock::now();
  ER_LOG(daemon, debug, "fork server (pid {}) started for {}: importing {}", server_->pid(), program, joined(preload_));
  return server_.get();
}

ForkServer::Events ForkServerLauncher::server_events() {
  ForkServer::Events ev;
  ev.on_ready = [this] {
    ER_LOG(daemon, info, "fork server (pid {}) ready: {} imported in {:.2f} s", server_->pid(), joined(preload_),
           std::chrono::duration<double>(std::chrono::steady_clock::now() - started_at_).count());
  };
  ev.on_started = [this](std::uint64_t id, int pid) { started(id, pid); };
  ev.on_refused = [this](std::uint64_t id, const std::string& why) { refused(id, why); };
  ev.on_exited = [this](int pid, int status) { table_.exited(pid, status); };
  ev.on_gone = [this](const std::string& why) { give_up(why); };
  return ev;
}

void ForkServerLauncher::started(std::uint64_t id, int pid) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  Pending p = std::move(it->second);
  pending_.erase(it);
  table_.add(p.spec.slot, pid, std::move(p.out), std::move(p.err));
  p.on_started(pid);
  for (int sig : p.signals) ::kill(-pid, sig);  // the server made the group before it answered
}

// A worker the server would not reproduce exactly (fork_server.py says why): exec'd.
void ForkServerLauncher::refused(std::uint64_t id, const std::string& why) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  Pending p = std::move(it->second);
  pending_.erase(it);
  ER_LOG(daemon, info, "slot {}: the fork server did not fork it ({}); starting it by exec", p.spec.slot, why);
  exec_instead(std::move(p));
}

void ForkServerLauncher::exec_instead(Pending p) {
  std::uint32_t slot = p.spec.slot;
  plain_->spawn(p.spec, std::move(p.on_started));
  for (int sig : p.signals) plain_->signal(slot, sig);
}

// Said once, at warn level: the job goes on, each worker slower to start than it could be.
void ForkServerLauncher::give_up(const std::string& why) {
  if (failed_) return;
  failed_ = true;
  ER_LOG(daemon, warn, "fork server of {} (--preload {}) failed: {}; this job's workers start without it",
         interpreter_, joined(preload_), why);
  // Its workers die with it (PR_SET_PDEATHSIG); nobody can tell us how they ended.
  for (int pid : table_.running_pids()) {
    ::kill(-pid, SIGKILL);
    table_.exited(pid, SIGKILL);
  }
  auto waiting = std::move(pending_);
  pending_.clear();
  // Destroyed later: this may run inside one of its callbacks.
  asio::post(io_, [s = std::shared_ptr<ForkServer>(std::move(server_))] {});
  for (auto& [id, p] : waiting) exec_instead(std::move(p));
}

}  // namespace

std::unique_ptr<Launcher> make_launcher(asio::io_context& io, WorkerEvents events, std::vector<std::string> preload) {
  if (preload.empty()) return make_process_launcher(io, std::move(events));
  return std::make_unique<ForkServerLauncher>(io, std::move(events), std::move(preload));
}

}  // namespace elasticrun::daemon
