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
#include "daemon/port_reservation.h"
#include "daemon/worker_table.h"

#include <boost/asio/steady_timer.hpp>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <map>
#include <optional>
#include <set>

namespace elasticrun::daemon {
namespace {

namespace asio = boost::asio;

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

// torch's store for a generation's workers (host_store): its server on the port given,
// in a fork of the server, until it is killed. Workers with TORCHELASTIC_USE_AGENT_STORE
// connect to it as clients, under a prefix of their restart count.
constexpr const char* kStoreCode =
    "import datetime, signal, sys\n"
    "import torch.distributed as dist\n"
    "store = dist.TCPStore('localhost', int(sys.argv[1]), None, True, datetime.timedelta(seconds=300),\n"
    "                      wait_for_workers=False)\n"
    "while True:\n"
    "    signal.pause()\n";

// How long the store may take to listen (it imports torch.distributed if the server has
// not), and how often the daemon looks.
constexpr std::chrono::seconds kStoreLimit{10};
constexpr std::chrono::milliseconds kStorePoll{5};

class ForkServerLauncher final : public Launcher {
 public:
  ForkServerLauncher(asio::io_context& io, WorkerEvents ev, std::vector<std::string> preload)
      : io_(io), preload_(std::move(preload)), table_(io, ev), plain_(make_process_launcher(io, ev)), timer_(io) {}
  ~ForkServerLauncher() override {
    if (store_ && store_->pid > 0) ::kill(-store_->pid, SIGKILL);
  }

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
    drop_store();
  }
  // A server still importing may take up to kReadyLimit: a stopping daemon does not
  // wait for it to fork workers that would only be killed.
  void abandon_starting() override {
    auto waiting = std::move(pending_);
    pending_.clear();
    for (auto& [id, p] : waiting) {
      unwanted_.insert(id);
      p.on_started(fail("stopped before it started"));
    }
  }
  void resume_output() override {
    plain_->resume_output();
    table_.resume_output();
  }
  std::size_t running() const override {
    return plain_->running() + table_.size() + table_.lingering() + pending_.size();
  }
  void host_store(std::uint16_t port, OnStore done) override;
  void drop_store() override;

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
  // The store: until it listens, polled every kStorePoll; then done with its pid.
  struct Store {
    std::uint64_t id = 0;
    int pid = 0;  // 0 until the server forked it
    std::uint16_t port = 0;
    OnStore done;  // empty once called
    std::chrono::steady_clock::time_point since;
  };
  void poll_store();
  void store_failed(const std::string& why);
  Store end_store();  // with store_ set

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
  bool ready_ = false;                   // the server has imported the modules
  std::vector<std::string> server_env_;  // what it started with, for the store's request
  std::string server_cwd_;
  std::optional<Store> store_;
  // Requests no longer wanted (stores ended, workers abandoned) before the server said
  // their pid: killed when it does.
  std::set<std::uint64_t> unwanted_;
  asio::steady_timer timer_;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);  // for the timer's handler
};

void ForkServerLauncher::host_store(std::uint16_t port, OnStore done) {
  drop_store();
  if (!server_ || failed_ || !ready_) {
    done(fail(failed_ ? "the fork server failed" : "the fork server is not ready yet"));
    return;
  }
  UniqueFd out(::open("/dev/null", O_WRONLY | O_CLOEXEC)), err(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  if (!out || !err) {
    done(fail("/dev/null: cannot open"));
    return;
  }
  fork::Spawn request;
  request.id = ++next_id_;
  request.mode = static_cast<std::uint8_t>(PythonCommand::Mode::code);
  request.target = kStoreCode;
  request.args = {std::to_string(port)};
  request.argv = {interpreter_, "-c", kStoreCode, std::to_string(port)};
  request.env = server_env_;
  request.cwd = server_cwd_;
  store_ = Store{request.id, 0, port, std::move(done), std::chrono::steady_clock::now()};
  server_->spawn(request, std::move(out), std::move(err));
}

void ForkServerLauncher::drop_store() {
  if (!store_) return;
  Store s = end_store();
  if (s.done) s.done(fail("replaced before it listened"));
}

// Takes the store out, its polling stopped and its process killed: its exit, reported
// later, is an unknown pid's; one not forked yet is killed once it is.
ForkServerLauncher::Store ForkServerLauncher::end_store() {
  Store s = std::move(*store_);
  store_.reset();
  timer_.cancel();
  if (s.pid > 0) ::kill(-s.pid, SIGKILL);
  else unwanted_.insert(s.id);
  return s;
}

void ForkServerLauncher::store_failed(const std::string& why) {
  if (!store_) return;
  Store s = end_store();
  if (s.done) return s.done(fail(why));
  // The workers were told it is up: those that have not reached it would wait for it
  // until torch's timeout (30 minutes). Ending them makes it a failure the driver
  // handles (restart mode: a new generation, with a new store).
  ER_LOG(daemon, error, "torch's store on port {} (pid {}) ended: {}; stopping this host's workers", s.port, s.pid,
         why);
  table_.signal_all(SIGKILL);
  plain_->signal_all(SIGKILL);
}

void ForkServerLauncher::poll_store() {
  if (!store_ || !store_->done) return;
  if (port_listening(store_->port)) {
    auto done = std::move(store_->done);
    store_->done = nullptr;
    ER_LOG(daemon, debug, "torch's store (pid {}) listens on port {} after {:.3f} s", store_->pid, store_->port,
           std::chrono::duration<double>(std::chrono::steady_clock::now() - store_->since).count());
    done(store_->pid);
    return;
  }
  if (std::chrono::steady_clock::now() - store_->since > kStoreLimit)
    return store_failed(fmt::format("not listening after {} s", kStoreLimit.count()));
  timer_.expires_after(kStorePoll);
  timer_.async_wait([this, alive = std::weak_ptr<int>(alive_)](boost::system::error_code ec) {
    if (!ec && alive.lock()) poll_store();
  });
}

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
  server_env_ = setup.env;
  server_cwd_ = spec.cwd;
  started_at_ = std::chrono::steady_clock::now();
  ER_LOG(daemon, debug, "fork server (pid {}) started for {}: importing {}", server_->pid(), program, joined(preload_));
  return server_.get();
}

ForkServer::Events ForkServerLauncher::server_events() {
  ForkServer::Events ev;
  ev.on_ready = [this] {
    ready_ = true;
    ER_LOG(daemon, info, "fork server (pid {}) ready: {} imported in {:.2f} s", server_->pid(), joined(preload_),
           std::chrono::duration<double>(std::chrono::steady_clock::now() - started_at_).count());
  };
  ev.on_started = [this](std::uint64_t id, int pid) { started(id, pid); };
  ev.on_refused = [this](std::uint64_t id, const std::string& why) { refused(id, why); };
  ev.on_exited = [this](int pid, int status) {
    if (store_ && store_->pid == pid) return store_failed(fmt::format("exited (wait status {})", status));
    table_.exited(pid, status);
  };
  ev.on_gone = [this](const std::string& why) { give_up(why); };
  return ev;
}

void ForkServerLauncher::started(std::uint64_t id, int pid) {
  if (store_ && store_->id == id) {
    store_->pid = pid;
    return poll_store();
  }
  if (unwanted_.erase(id)) {
    ::kill(-pid, SIGKILL);
    return;
  }
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
  if (store_ && store_->id == id) return store_failed("the fork server refused it: " + why);
  if (unwanted_.erase(id)) return;
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
  store_failed("the fork server is gone");
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
