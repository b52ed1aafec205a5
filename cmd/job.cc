#include "cmd/job.h"

#include "cmd/exit_codes.h"
#include "common/env.h"
#include "common/executable.h"
#include "common/log.h"
#include "cmd/ssh_daemon.h"
#include "cmd/tcp_daemon.h"
#include "discovery/local_host.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <csignal>
#include <cstring>
#include <filesystem>

namespace elasticrun::cmd {

namespace asio = boost::asio;

namespace {

std::string describe_exit(const msg::Exited& e) {
  if (e.signal != 0) {
    const char* abbrev = sigabbrev_np(e.signal);
    return fmt::format("was killed by signal {} (SIG{})", e.signal, abbrev ? abbrev : "?");
  }
  return fmt::format("exited with code {}", e.code);
}

rendezvous::MembershipConfig membership_config(const Options& o) {
  rendezvous::MembershipConfig c;
  c.min_np = o.elastic ? o.min_np : o.np;
  c.max_np = o.elastic ? o.max_np : o.np;
  c.cooldown = o.blacklist_cooldown;
  return c;
}

}  // namespace

Job::Job(Options opts)
    : opts_(std::move(opts)), secret_(auth::random_secret()), membership_(membership_config(opts_)),
      output_(opts_.output_dir), signals_(io_, SIGINT, SIGTERM, SIGHUP), join_timer_(io_), elastic_timer_(io_),
      stop_timer_(io_), cooldown_timer_(io_), abandon_timer_(io_),
      heartbeat_timer_(io_) {}

Job::~Job() = default;

Result<std::string> Job::daemon_path() const {
  if (!opts_.daemon_path.empty()) {
    if (auto p = find_executable(opts_.daemon_path, ""); !p)
      return fail(fmt::format("--daemon-path: {}", p.error()));
    return opts_.daemon_path;
  }
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  for (auto cand : {self / "elasticrund", self / "../daemon/elasticrund", self / "../sbin/elasticrund"})
    if (find_executable(cand.string(), "")) return std::filesystem::weakly_canonical(cand, ec).string();
  const char* path = std::getenv("PATH");
  if (auto p = find_executable("elasticrund", path ? path : ""); p) return p;
  return fail("cannot find elasticrund beside elasticrun or in PATH (use --daemon-path)");
}

Result<void> Job::start() {
  if (!events_.open(opts_.events_file))
    return fail(fmt::format("cannot open --events file '{}': {}", opts_.events_file, std::strerror(errno)));
  // Remote hosts (or hosts a discovery script may name) must reach the rendezvous
  // server over the network; a job on this machine alone keeps it on loopback.
  bool remote = !opts_.discovery_script.empty();
  for (const auto& h : opts_.hosts) remote = remote || !discovery::is_local_host(h.name);
  if (opts_.daemon_port > 0) {
    auto s = auth::read_secret_file(opts_.daemon_secret_file);
    if (!s) return fail(s.error() + " (--daemon-secret-file)");
    cluster_secret_ = *s;
  } else {
    auto dpath = daemon_path();
    if (!dpath) return Failure{dpath.error()};
    daemon_path_ = *dpath;
  }
  char cwd[PATH_MAX] = {};
  if (!::getcwd(cwd, sizeof cwd)) return fail("cannot read the working directory");
  cwd_ = cwd;
  rendezvous::Server::Callbacks cb;
  // Each concerns the worker the connection came from: not the place's worker now if
  // that is a successor of it (the place was removed and listed again).
  cb.on_worker_joined = [this](const rendezvous::WorkerPlace& p, std::uint64_t e) { on_joined(p, e); };
  cb.on_epoch_abandoned = [this](const rendezvous::WorkerPlace& p, std::uint64_t e) {
    if (worker(p)) on_epoch_abandoned({p.host, p.slot}, e);
  };
  cb.on_worker_lost = [this](const rendezvous::WorkerPlace& p, std::uint64_t) {
    // The exit report from the daemon follows; acting on the lost connection already
    // makes recovery start as soon as the process is gone.
    if (worker(p)) on_worker_failed({p.host, p.slot}, "lost its rendezvous connection");
  };
  try {
    server_ = std::make_unique<rendezvous::Server>(
        io_, secret_, asio::ip::tcp::endpoint(asio::ip::make_address(remote ? "0.0.0.0" : "127.0.0.1"), 0),
        std::move(cb), rendezvous::ServerLimits{.keep_alive = opts_.host_timeout});
  } catch (const std::exception& e) {
    return fail(std::string("cannot start the rendezvous server: ") + e.what());
  }
  rendezvous_addr_ = fmt::format("127.0.0.1:{}", server_->port());
  ER_LOG(driver, info, "rendezvous server on {}", rendezvous_addr_);
  start_watcher();
  return {};
}

DaemonEvents Job::daemon_events() {
  DaemonEvents ev;
  ev.on_started = [this](const std::string& host, const msg::Started& s) { on_started(host, s); };
  ev.on_output = [this](const std::string& host, const msg::Output& o) {
    Worker* w = process_at(host, o.slot);
    if (!w || (o.stream != 1 && o.stream != 2)) return;
    if (auto ok = output_.write(w->rank, o.stream, o.data); !ok) finish(exit_code::kLaunchFailed, ok.error());
  };
  ev.on_exited = [this](const std::string& host, const msg::Exited& e) { on_exited(host, e); };
  ev.on_spawn_failed = [this](const std::string& host, const msg::SpawnFailed& f) {
    Worker* w = worker(host, f.slot);
    std::string why = fmt::format("cannot start rank {} on host '{}': {}", w ? w->rank : -1, host, f.message);
    // A program that cannot start anywhere is not a host problem: fail at once.
    finish(exit_code::kLaunchFailed, why);
  };
  ev.on_closed = [this](const std::string& host, bool clean, const std::string& why) {
    on_daemon_closed(host, clean, why);
  };
  return ev;
}

DaemonLink* Job::ensure_daemon(const std::string& host) {
  auto it = daemons_.find(host);
  if (it != daemons_.end() && !it->second->closed()) return it->second.get();
  std::unique_ptr<DaemonLink> link;
  std::string addr = rendezvous_addr_;
  bool local = discovery::is_local_host(host);
  if (!local) {
    // The remote workers reach us at the address our traffic to that host leaves from.
    std::string self = discovery::local_address_towards(host);
    if (self.empty()) {
      on_daemon_closed(host, false, "cannot resolve or route to the host");
      return nullptr;
    }
    addr = fmt::format("{}:{}", self, server_->port());
  }
  if (cluster_secret_) {
    link = connect_daemon(io_, host, static_cast<std::uint16_t>(opts_.daemon_port), *cluster_secret_,
                          opts_.ssh.connect_timeout, opts_.host_timeout, daemon_events());
  } else if (local) {
    auto started = launch_local_daemon(io_, host, daemon_path_, opts_.log_level, daemon_events());
    if (!started) {
      finish(exit_code::kLaunchFailed, fmt::format("starting daemon on '{}': {}", host, started.error()));
      return nullptr;
    }
    link = std::move(*started);
  } else {
    link = launch_ssh_daemon(io_, host, daemon_path_, opts_.log_level, opts_.ssh, daemon_events());
  }
  link->send(msg::Config{wire::Bytes(secret_.begin(), secret_.end()), addr, host, cwd_,
                        static_cast<std::uint32_t>(heartbeat_interval().count()),
                        static_cast<std::uint32_t>(opts_.host_timeout.count())});
  DaemonLink* raw = link.get();
  daemons_[host] = std::move(link);
  return raw;
}

// Starts a worker for place `w` of the current epoch, or, while the worker stopped
// there before has not exited yet, once it has (spawn_deferred).
void Job::spawn(const rendezvous::WorkerPlace& w) {
  Place p{w.host, w.slot};
  Worker fresh;
  fresh.rank = w.rank;
  fresh.started_epoch = assignment_.epoch;
  if (retired_.count(p)) {
    ER_LOG(driver, info, "rank {} on host '{}' slot {} starts once the worker stopped there (pid {}) has exited",
           w.rank, w.host, w.slot, retired_.at(p).pid);
    fresh.spawn_pending = true;
    workers_[p] = fresh;
    return;
  }
  DaemonLink* d = ensure_daemon(w.host);
  if (!d) return;
  workers_[p] = fresh;
  send_spawn(*d, p, fresh);
}

void Job::spawn_deferred(const Place& p) {
  auto it = workers_.find(p);
  if (exit_code_ >= 0 || it == workers_.end() || !it->second.spawn_pending) return;
  DaemonLink* d = ensure_daemon(p.first);
  it = workers_.find(p);  // a daemon that cannot start fails the host's workers
  if (!d || it == workers_.end()) return;
  it->second.spawn_pending = false;
  send_spawn(*d, p, it->second);
}

void Job::send_spawn(DaemonLink& d, const Place& p, const Worker& w) {
  auto env = opts_.env;
  auto rejoin = opts_.elastic_timeout + opts_.rendezvous_timeout;
  env.push_back(fmt::format("{}={:.3f}", env::kRejoinTimeout, rejoin.count() / 1000.0));
  env.push_back(fmt::format("{}={:.3f}", env::kHostTimeout, opts_.host_timeout.count() / 1000.0));
  d.send(msg::Spawn{static_cast<std::uint32_t>(p.second), w.started_epoch, w.rank, assignment_.size(),
                    opts_.command, env});
}

// Takes the place's worker out of the job and signals it. One with a process keeps an
// entry in retired_ until its exit is reported; one not started yet, already exited,
// or gone with its daemon is simply dropped. Returns whether it was retired.
bool Job::retire(const Place& p, int sig) {
  auto it = workers_.find(p);
  if (it == workers_.end()) return false;
  Worker w = std::move(it->second);
  workers_.erase(it);
  auto d = daemons_.find(p.first);
  if (w.spawn_pending || w.exited || d == daemons_.end() || d->second->closed()) return false;
  signal_worker(p, sig);
  retired_[p] = std::move(w);
  return true;
}

void Job::signal_worker(const Place& p, int sig) {
  auto it = daemons_.find(p.first);
  if (it != daemons_.end() && !it->second->closed())
    it->second->send(msg::Kill{static_cast<std::uint32_t>(p.second), sig});
}

Job::Worker* Job::worker(const std::string& host, std::uint32_t slot) {
  auto it = workers_.find({host, static_cast<int>(slot)});
  return it == workers_.end() ? nullptr : &it->second;
}

// The place's current worker if it is the one a rendezvous connection came from.
Job::Worker* Job::worker(const rendezvous::WorkerPlace& p) {
  Worker* w = worker(p.host, static_cast<std::uint32_t>(p.slot));
  return w && w->started_epoch == p.started_epoch ? w : nullptr;
}

// The worker whose process runs at the place: a retired one still stopping, else the
// current one (its successor waits for it to exit).
Job::Worker* Job::process_at(const std::string& host, std::uint32_t slot) {
  auto it = retired_.find({host, static_cast<int>(slot)});
  return it != retired_.end() ? &it->second : worker(host, slot);
}

std::string Job::describe(const Place& p) const {
  auto it = workers_.find(p);
  int rank = it == workers_.end() ? -1 : it->second.rank;
  int pid = it == workers_.end() ? 0 : it->second.pid;
  return fmt::format("rank {} (host '{}', slot {}, pid {})", rank, p.first, p.second, pid);
}

void Job::on_started(const std::string& host, const msg::Started& s) {
  Worker* w = process_at(host, s.slot);
  if (!w || w->spawn_pending || w->pid != 0) return;
  w->pid = static_cast<int>(s.pid);
  events_.emit("worker_started", {{"host", host}, {"slot", s.slot}, {"rank", w->rank}, {"pid", s.pid},
                                  {"epoch", assignment_.epoch}});
}

void Job::on_joined(const rendezvous::WorkerPlace& p, std::uint64_t epoch) {
  Worker* w = worker(p);
  if (!w) return;
  w->joined_epoch = epoch;
  if (epoch != assignment_.epoch) return;
  for (const auto& r : assignment_.workers) {
    Worker* x = worker(r.host, static_cast<std::uint32_t>(r.slot));
    if (!x || x->joined_epoch != epoch) return;
  }
  join_timer_.cancel();
  events_.emit("epoch_joined", {{"epoch", epoch}, {"size", assignment_.size()}});
}

void Job::on_exited(const std::string& host, const msg::Exited& e) {
  Place p{host, static_cast<int>(e.slot)};
  auto emit = [&](const Worker& w, bool removed) {
    output_.finish(w.rank);
    events_.emit("worker_exited", {{"host", host}, {"slot", e.slot}, {"rank", w.rank}, {"pid", e.pid},
                                   {"code", e.code}, {"signal", e.signal}, {"removed", removed}});
  };
  // A worker stopped on purpose (removed, or failed): its exit was expected, and frees
  // the place for a successor that may be waiting.
  if (auto r = retired_.find(p); r != retired_.end() && r->second.pid == static_cast<int>(e.pid)) {
    emit(r->second, true);
    retired_.erase(r);
    spawn_deferred(p);
    return maybe_done();
  }
  auto it = workers_.find(p);
  if (it == workers_.end() || it->second.pid != static_cast<int>(e.pid)) return;
  Worker& w = it->second;
  w.exited = true;
  emit(w, false);
  if (exit_code_ >= 0) {
    workers_.erase(it);
    return maybe_done();
  }
  if (e.code != 0 || e.signal != 0) return on_worker_failed(p, describe_exit(e));
  w.exited_ok = true;
  if (all_finished()) finish(exit_code::kOk, "");
}

void Job::on_daemon_closed(const std::string& host, bool clean, const std::string& why) {
  // The workers it was stopping went with it (the daemon stops them, or they die with
  // it): none will report an exit.
  std::erase_if(retired_, [&](const auto& r) { return r.first.first == host; });
  if (exit_code_ >= 0 || clean) return maybe_done();
  auto it = daemons_.find(host);
  bool started = it != daemons_.end() && it->second->ready();
  if (!opts_.elastic) {
    if (!started) return finish(exit_code::kLaunchFailed, fmt::format("starting daemon on '{}': {}", host, why));
    return finish(exit_code::kWorkerFailed, fmt::format("lost the daemon on host '{}': {}", host, why));
  }
  on_worker_failed({host, -1}, started ? "lost its daemon: " + why : "could not start its daemon: " + why);
}

void Job::finish(int code, const std::string& message) {
  if (exit_code_ >= 0) return;
  exit_code_ = code;
  if (!message.empty()) fmt::print(stderr, "elasticrun: {}\n", message);
  events_.emit("job_finished", {{"status", code}, {"message", message}, {"resets", resets_}});
  for (auto* t : {&join_timer_, &elastic_timer_, &cooldown_timer_, &abandon_timer_, &heartbeat_timer_}) t->cancel();
  if (watcher_) watcher_->stop();
  if (server_) server_->notify_all(msg::NotifyKind::shutdown, message.empty() ? "job finished" : message);
  for (auto& [h, d] : daemons_) d->shutdown(std::chrono::milliseconds(2000));
  // The daemons kill stragglers after 2 s; if one does not report back by then, cut it off.
  stop_timer_.expires_after(std::chrono::milliseconds(4000));
  stop_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    ER_LOG(driver, warn, "daemons did not stop in time; closing their links");
    for (auto& [h, d] : daemons_) d->close();
    io_.stop();
  });
  maybe_done();
}

// Four beats per --host-timeout (at most 5 s apart), both ways.
std::chrono::milliseconds Job::heartbeat_interval() const {
  return std::clamp(opts_.host_timeout / 4, std::chrono::milliseconds(msg::kMinHeartbeatMs),
                    std::chrono::milliseconds(5000));
}

// Sends every daemon a heartbeat every heartbeat_interval(), and gives up a daemon that
// has sent nothing (not even its own heartbeats) for --host-timeout: a host behind a cut
// link, powered off, or a stopped daemon, none of which closes a connection. The timer
// ticks more often than it beats, so that the silence is caught soon after the timeout.
void Job::heartbeat() {
  using namespace std::chrono;
  auto tick = std::clamp(heartbeat_interval() / 5, milliseconds(10), milliseconds(250));
  heartbeat_timer_.expires_after(tick);
  heartbeat_timer_.async_wait([this, tick](boost::system::error_code ec) {
    if (ec || exit_code_ >= 0) return;
    auto now = steady_clock::now();
    // A tick far behind its time means this loop itself stalled (the machine swapped,
    // the driver was stopped): the daemons' frames wait unread in the sockets, and
    // their silence proves nothing.
    bool stalled = now - last_tick_ > tick + std::min(milliseconds(500), opts_.host_timeout / 4);
    last_tick_ = now;
    bool beat = now - last_beat_ >= heartbeat_interval() - tick / 2;
    if (beat) last_beat_ = now;
    std::vector<std::string> silent;
    for (auto& [h, d] : daemons_) {
      if (d->closed()) continue;
      if (beat) d->send(msg::Heartbeat{});
      if (stalled) d->heard_now();
      else if (d->ready() && now - d->last_heard() > opts_.host_timeout) silent.push_back(h);
    }
    // Failing a host can start an epoch and launch daemons: look each one up afresh.
    for (const auto& h : silent) {
      auto it = daemons_.find(h);
      if (it == daemons_.end() || it->second->closed() || exit_code_ >= 0) continue;
      it->second->lost(fmt::format("heard nothing from it for {:.1f} s (--host-timeout)",
                                   duration<double>(now - it->second->last_heard()).count()));
    }
    heartbeat();
  });
}

void Job::maybe_done() {
  if (exit_code_ < 0) return;
  for (auto& [h, d] : daemons_)
    if (!d->closed()) return;
  stop_timer_.cancel();
  signals_.cancel();
  if (server_) server_->stop();
  io_.stop();
}

int Job::run() {
  signals_.async_wait([this](boost::system::error_code ec, int sig) {
    if (ec) return;
    finish(128 + sig, fmt::format("interrupted by SIG{}; stopping all workers", sigabbrev_np(sig)));
  });
  if (auto ok = start(); !ok) {
    finish(exit_code::kLaunchFailed, ok.error());
  } else {
    last_tick_ = last_beat_ = std::chrono::steady_clock::now();
    heartbeat();
  }
  io_.run();
  daemons_.clear();
  return exit_code_ < 0 ? exit_code::kLaunchFailed : exit_code_;
}

}  // namespace elasticrun::cmd
