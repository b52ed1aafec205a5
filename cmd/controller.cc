// The epoch controller's worker life cycle: started, joined, exited, lost; daemons
// closing; the job's end.
#include "cmd/controller.h"

#include "cmd/exit_codes.h"
#include "cmd/options.h"
#include "common/env.h"
#include "common/log.h"

#include <fmt/format.h>

#include <csignal>
#include <cstring>

namespace elasticrun::cmd {

namespace {

std::string describe_exit(const msg::Exited& e) {
  if (e.signal != 0) {
    const char* abbrev = sigabbrev_np(e.signal);
    return fmt::format("was killed by signal {} (SIG{})", e.signal, abbrev ? abbrev : "?");
  }
  return fmt::format("exited with code {}", e.code);
}

rendezvous::MembershipConfig membership_config(const ControllerConfig& c) {
  rendezvous::MembershipConfig m;
  m.min_np = c.elastic ? c.min_np : c.np;
  m.max_np = c.elastic ? c.max_np : c.np;
  m.cooldown = c.cooldown;
  return m;
}

}  // namespace

ControllerConfig ControllerConfig::of(const Options& o) {
  ControllerConfig c;
  c.elastic = o.elastic;
  c.np = o.np;
  c.min_np = o.min_np;
  c.max_np = o.max_np;
  c.start_timeout = o.start_timeout;
  c.rendezvous_timeout = o.rendezvous_timeout;
  c.elastic_timeout = o.elastic_timeout;
  c.reset_limit = o.reset_limit;
  c.cooldown = o.blacklist_cooldown;
  c.durable = !o.checkpoint_dir.empty();
  c.max_restarts = o.max_restarts;
  for (const auto& kv : o.env)
    for (const char* k : {env::kTorchMasterAddr, env::kTorchMasterPort, env::kTorchUseAgentStore})
      if (kv.starts_with(std::string(k) + "=")) c.agent_store = false;
  return c;
}

EpochController::EpochController(ControllerConfig cfg) : cfg_(std::move(cfg)), membership_(membership_config(cfg_)) {}

std::optional<Command> EpochController::take() {
  if (out_.empty()) return std::nullopt;
  Command c = std::move(out_.front());
  out_.pop_front();
  return c;
}

void EpochController::emit(std::string event, nlohmann::json fields) {
  out_.push_back(command::Emit{std::move(event), std::move(fields)});
}

void EpochController::say(std::string text) { out_.push_back(command::Say{std::move(text)}); }

EpochController::Worker* EpochController::worker(const Place& p) {
  auto it = workers_.find(p);
  return it == workers_.end() ? nullptr : &it->second;
}

// The place's current worker if it is the process a rendezvous connection came from.
EpochController::Worker* EpochController::worker(const rendezvous::WorkerPlace& p) {
  Worker* w = worker(Place{p.host, p.slot});
  return w && w->started_epoch == p.started_epoch ? w : nullptr;
}

// The worker whose process runs at the place: a retired one still stopping, else the
// current one (its successor waits for it to exit).
const EpochController::Worker* EpochController::process_at(const Place& p) const {
  if (auto it = retired_.find(p); it != retired_.end()) return &it->second;
  auto it = workers_.find(p);
  return it == workers_.end() ? nullptr : &it->second;
}

std::optional<int> EpochController::rank_at(const std::string& host, std::uint32_t slot) const {
  const Worker* w = process_at({host, static_cast<int>(slot)});
  if (!w) return std::nullopt;
  return w->rank;
}

std::string EpochController::describe(const Place& p) const {
  auto it = workers_.find(p);
  int rank = it == workers_.end() ? -1 : it->second.rank;
  int pid = it == workers_.end() ? 0 : it->second.pid;
  return fmt::format("rank {} (host '{}', slot {}, pid {})", rank, p.first, p.second, pid);
}

// Starts a worker for place `w` of the current epoch, or, while the worker stopped
// there before has not exited yet, once it has (see worker_exited).
void EpochController::spawn(const rendezvous::WorkerPlace& w) {
  Place p{w.host, w.slot};
  Worker fresh;
  fresh.rank = w.rank;
  fresh.local_rank = w.local_rank;
  fresh.started_epoch = assignment_.epoch;
  if (auto r = retired_.find(p); r != retired_.end()) {
    ER_LOG(driver, info, "rank {} on host '{}' slot {} starts once the worker stopped there (pid {}) has exited",
           w.rank, w.host, w.slot, r->second.pid);
    fresh.spawn_pending = true;
    workers_[p] = fresh;
    return;
  }
  launch(p, workers_[p] = fresh);
}

// Starts the worker, once the epoch's port is known.
void EpochController::launch(const Place& p, Worker& w) {
  if (port_epoch_ != assignment_.epoch) {
    w.held = true;
    return;
  }
  w.held = false;
  daemon_gone_.erase(p.first);  // the spawn starts a daemon there if it has none
  TorchWorker torch = torch_worker(assignment_, w.rank);
  torch.master_port = master_port_;
  torch.agent_store = agent_store_;
  torch.restart_count = restarts_;
  torch.max_restarts = cfg_.max_restarts.value_or(0);
  out_.push_back(command::Spawn{p, w.rank, assignment_.size(), w.started_epoch, std::move(torch)});
}

// Takes the place's worker out of the job and signals it. One with a process keeps an
// entry in retired_ until its exit is reported; one not started yet, already exited,
// or gone with its daemon is simply dropped. Returns whether it was retired.
bool EpochController::retire(const Place& p, int sig, std::optional<TimePoint> kill_at) {
  auto it = workers_.find(p);
  if (it == workers_.end()) return false;
  Worker w = std::move(it->second);
  workers_.erase(it);
  if (w.spawn_pending || w.held || w.exited || daemon_gone_.count(p.first)) return false;
  out_.push_back(command::Signal{p, sig});
  w.kill_at = kill_at;
  retired_[p] = std::move(w);
  return true;
}

void EpochController::worker_started(const std::string& host, std::uint32_t slot, int pid) {
  Place p{host, static_cast<int>(slot)};
  Worker* w = retired_.count(p) ? &retired_.at(p) : worker(p);
  if (!w || w->spawn_pending || w->held || w->pid != 0) return;
  w->pid = pid;
  started_on_.insert(host);
  emit("worker_started",
       {{"host", host}, {"slot", slot}, {"rank", w->rank}, {"pid", pid}, {"epoch", assignment_.epoch}});
}

void EpochController::worker_joined(const rendezvous::WorkerPlace& p, std::uint64_t epoch) {
  Worker* w = worker(p);
  if (!w) return;
  w->joined_epoch = epoch;
  joined_any_ = true;
  if (epoch != assignment_.epoch) return;
  for (const auto& r : assignment_.workers) {
    Worker* x = worker(Place{r.host, r.slot});
    if (!x || x->joined_epoch != epoch) return;
  }
  // Every member joined: the epoch formed. Its members hold the job's state once their
  // sync reports (worker_synced); until the job's first report, forming is what counts.
  for (const auto& r : assignment_.workers) worker(Place{r.host, r.slot})->formed = true;
  state_formed_ = true;
  emit("epoch_joined", {{"epoch", epoch}, {"size", assignment_.size()}});
}

void EpochController::worker_synced(const rendezvous::WorkerPlace& p, std::uint64_t epoch, std::uint64_t commits) {
  Worker* w = worker(p);
  if (!w) return;
  w->synced = true;
  syncs_reported_ = true;
  state_formed_ = true;
  emit("state_synced",
       {{"host", p.host}, {"slot", p.slot}, {"rank", p.rank}, {"epoch", epoch}, {"commits", commits}});
}

void EpochController::worker_lost(const rendezvous::WorkerPlace& p, TimePoint now) {
  // The exit report from the daemon follows; acting on the lost connection already
  // makes recovery start as soon as the process is gone.
  if (worker(p)) worker_failed({p.host, p.slot}, {Failure::Kind::connection_lost, "lost its rendezvous connection"}, now);
}

void EpochController::worker_silent(const rendezvous::WorkerPlace& p, std::chrono::milliseconds silent,
                                    TimePoint now) {
  if (!worker(p)) return;
  worker_failed({p.host, p.slot},
                {Failure::Kind::worker_timeout,
                 fmt::format("sent nothing for {:.1f} s, not even a heartbeat (--worker-timeout)", silent.count() / 1000.0)},
                now);
}

void EpochController::worker_exited(const std::string& host, const msg::Exited& e, TimePoint now) {
  Place p{host, static_cast<int>(e.slot)};
  bool failure = e.code != 0 || e.signal != 0;
  auto report = [&](const Worker& w, bool removed) {
    out_.push_back(command::CloseOutput{p});
    emit("worker_exited", {{"host", host}, {"slot", e.slot}, {"rank", w.rank}, {"pid", e.pid},
                           {"code", e.code}, {"signal", e.signal}, {"removed", removed}});
  };
  // A worker stopped on purpose (removed, or failed): its exit was expected, and frees
  // the place for a successor that may be waiting.
  if (auto r = retired_.find(p); r != retired_.end() && r->second.pid == static_cast<int>(e.pid)) {
    report(r->second, true);
    // Failed already (its rendezvous connection closed first): its error file says why.
    if (r->second.failed && failure) report_error(host, r->second, e);
    retired_.erase(r);
    auto next = workers_.find(p);
    if (finished() || next == workers_.end() || !next->second.spawn_pending) return;
    next->second.spawn_pending = false;
    return launch(p, next->second);
  }
  auto it = workers_.find(p);
  if (it == workers_.end() || it->second.pid != static_cast<int>(e.pid)) return;
  Worker& w = it->second;
  w.exited = true;
  report(w, false);
  if (finished()) {
    workers_.erase(it);
    return;
  }
  if (failure) {
    Worker was = w;  // failing it may retire it
    worker_failed(p, {Failure::Kind::exited, describe_exit(e)}, now);
    return report_error(host, was, e);
  }
  w.exited_ok = true;
  finishing_ = true;
  if (all_finished()) return end(exit_code::kOk, "");
  // It may have finished the last step while the others were interrupted in it.
  reconcile(now);
}

void EpochController::spawn_failed(const std::string& host, std::uint32_t slot, const std::string& why,
                                   TimePoint now) {
  Worker* w = worker(Place{host, static_cast<int>(slot)});
  // A program that cannot start anywhere is not a host problem: fail at once. Once it
  // has started on another host, an elastic job takes it for this host's (a node whose
  // environment is not ready, a full process table) and goes on without the host.
  bool elsewhere = std::any_of(started_on_.begin(), started_on_.end(), [&](const auto& h) { return h != host; });
  if (w && cfg_.elastic && !cfg_.max_restarts && elsewhere)
    return worker_failed({host, -1}, {Failure::Kind::spawn_failed, fmt::format("could not start rank {}: {}", w->rank, why)},
                         now);
  end(exit_code::kLaunchFailed, fmt::format("cannot start rank {} on host '{}': {}", w ? w->rank : -1, host, why));
}

void EpochController::daemon_closed(const std::string& host, DaemonEnd how, const std::string& why, TimePoint now) {
  // The workers it was stopping went with it (the daemon stops them, or they die with
  // it): none will report an exit.
  std::erase_if(retired_, [&](const auto& r) { return r.first.first == host; });
  daemon_gone_.insert(host);
  if (finished() || how == DaemonEnd::clean) return;
  // A fixed job in restart mode restarts on the same hosts (a new daemon), like after any
  // failure; one that cannot start there ends it.
  if (!cfg_.elastic && !(cfg_.max_restarts && how == DaemonEnd::lost)) {
    if (how == DaemonEnd::not_started)
      return end(exit_code::kLaunchFailed, fmt::format("starting daemon on '{}': {}", host, why));
    return end(exit_code::kWorkerFailed, fmt::format("lost the daemon on host '{}': {}", host, why));
  }
  std::string text = how == DaemonEnd::lost ? "lost its daemon: " + why : "could not start its daemon: " + why;
  worker_failed({host, -1}, {Failure::Kind::daemon_lost, text}, now);
}

void EpochController::finish(int code, const std::string& message) { end(code, message); }

void EpochController::end(int code, const std::string& message) {
  if (finished()) return;
  exit_code_ = code;
  if (!message.empty()) say(message);
  emit("job_finished", {{"status", code}, {"message", message}, {"resets", resets_}, {"restarts", restarts_}});
  elastic_deadline_.reset();
  abandon_deadline_.reset();
  out_.push_back(command::Finish{code, message});
}

}  // namespace elasticrun::cmd
