// The epoch controller's side of programs written for torchrun: the epoch's port
// (MASTER_PORT), a failed worker's error file, and restart mode (--max-restarts).
//
// Restart mode runs programs that keep no state with libelasticrun (torchrun's scripts,
// which resume from their own checkpoint): a generation is an epoch whose workers are
// all new. A failure (a worker exits non-zero or dies, loses its rendezvous connection,
// does not join in time, falls silent; a daemon is lost) stops every worker, SIGTERM then
// SIGKILL after the stop grace, and starts the next generation on the same hosts: the
// failed worker's host is not blacklisted, as torchrun restarts in place; only a lost
// daemon's host is, in an elastic job, as there. Each such restart counts against
// --max-restarts; with none left the job fails naming the cause. A change of hosts
// (discovery) that changes the assignment restarts every worker too, uncounted (as in
// torchrun); hosts added join then. Each place's new worker starts once its old one
// exited (spawn_pending), and once the new generation's port is known.
#include "cmd/controller.h"

#include "cmd/error_report.h"
#include "cmd/exit_codes.h"
#include "common/log.h"

#include <algorithm>
#include <fmt/format.h>

#include <csignal>

namespace elasticrun::cmd {

void EpochController::restart_after(const Place& p, const Failure& why, TimePoint now) {
  std::string who;
  if (p.second >= 0) {
    auto it = workers_.find(p);
    if (it == workers_.end()) return;  // failed or stopped already
    who = describe(p);
    it->second.failed = true;
    retire(p, SIGKILL);  // one that has not exited (hung, silent) is killed at once
  } else {
    bool live = std::any_of(workers_.begin(), workers_.end(),
                            [&](const auto& q) { return q.first.first == p.first && !q.second.exited_ok; });
    if (!live) return;
    who = fmt::format("host '{}'", p.first);
    if (cfg_.elastic) blacklist(p.first, why, now);
  }
  std::string cause = fmt::format("{} {}", who, why.text);
  int most = *cfg_.max_restarts;
  if (restarts_ >= most)
    return end(exit_code::kWorkerFailed, fmt::format("{}; no restart left (--max-restarts {})", cause, most));
  ++restarts_;
  say(fmt::format("{}; restarting every worker (restart {} of {})", cause, restarts_, most));
  stop_generation(now);
  // Whoever had finished runs again with the rest: the generation failed.
  finishing_ = false;
  epoch_broken_ = true;
  broken_reason_ = cause;
  reconcile(now);
}

// Stops every worker of the generation: SIGTERM, then SIGKILL after the stop grace.
void EpochController::stop_generation(TimePoint now) {
  std::vector<Place> all;
  for (const auto& [p, w] : workers_) all.push_back(p);
  for (const auto& p : all) retire(p, SIGTERM, now + cfg_.stop_grace);
}

void EpochController::reconcile_generation(TimePoint now) {
  // A worker finished (exit 0): the others follow, and no change of hosts restarts them.
  if (finishing_) return;
  bool change = assignment_.epoch > 0 && !epoch_broken_;
  if (change && !membership_.changed(assignment_, alive(), now)) return slots_back(now);  // a dip that ended
  // The hosts of the last generation keep their order, new ones come after; every place
  // gets a new worker.
  std::set<Place> before;
  for (const auto& w : assignment_.workers) before.insert({w.host, w.slot});
  auto plan = membership_.plan(assignment_, before, now);
  // Too few slots: a change leaves the running generation alone meanwhile (the hosts may
  // come back); after a failure it is stopped already.
  if (!plan) return wait_for_slots(now);
  plan->spawn = plan->assignment.workers;
  plan->keep.clear();
  plan->remove.clear();
  std::string reason = change ? "hosts changed" : broken_reason_;
  if (change) {
    say("hosts changed; restarting every worker (not counted against --max-restarts)");
    stop_generation(now);
  }
  slots_back(now);
  if (assignment_.epoch > 0) {
    ++resets_;
    emit("restart", {{"generation", assignment_.epoch + 1}, {"cause", change ? "hosts_changed" : "failure"},
                     {"reason", reason}, {"restart_count", restarts_}, {"max_restarts", *cfg_.max_restarts}});
  }
  begin_epoch(std::move(*plan), msg::NotifyKind::abort, reason, now);
}

// The epoch's workers wait for its port when any is to start: the new ones, and those
// kept from an epoch whose port never came (rank 0's host failed first).
void EpochController::reserve_port(const rendezvous::Plan& plan) {
  bool held = std::any_of(workers_.begin(), workers_.end(), [](const auto& w) { return w.second.held; });
  if ((plan.spawn.empty() && !held) || assignment_.size() == 0) return;
  // Restart mode starts every worker of a generation afresh (torchrun's static
  // rendezvous): the store can live beside them, started before them, as torchrun's agent
  // hosts it. An elastic job's survivors keep the environment they started with.
  command::ReservePort r{assignment_.workers.front().host, assignment_.epoch, {},
                         cfg_.max_restarts.has_value() && cfg_.agent_store};
  for (const auto& w : plan.spawn)
    if (std::find(r.hosts.begin(), r.hosts.end(), w.host) == r.hosts.end()) r.hosts.push_back(w.host);
  out_.push_back(std::move(r));
}

void EpochController::port_reserved(const std::string& host, std::uint64_t epoch, int port, const std::string& error,
                                    bool store) {
  if (finished() || epoch != assignment_.epoch || port_epoch_ == epoch || assignment_.size() == 0 ||
      assignment_.workers.front().host != host)
    return;  // an answer for an epoch gone by
  port_epoch_ = epoch;
  master_port_ = port;
  agent_store_ = store && port > 0;
  if (port == 0)
    say(fmt::format("host '{}' could not reserve a port for epoch {} ({}); its workers get no MASTER_PORT", host,
                    epoch, error));
  emit("port_reserved", {{"epoch", epoch}, {"host", host}, {"port", port}, {"store", agent_store_}});
  for (const auto& r : assignment_.workers) {
    auto it = workers_.find({r.host, r.slot});
    if (it != workers_.end() && it->second.held) launch(it->first, it->second);
  }
}

// A failed worker's error file (TORCHELASTIC_ERROR_FILE): the root cause, as torchrun
// prints it, and a worker_error event.
void EpochController::report_error(const std::string& host, const Worker& w, const msg::Exited& e) {
  if (e.error_file_size == 0) return;
  WorkerError err = parse_error_file(e.error_file, e.error_file_size, msg::kMaxErrorFile);
  FailedWorker f{host, w.rank, w.local_rank, static_cast<int>(e.pid), e.code, e.signal};
  say(root_cause(f, err));
  nlohmann::json fields = {{"host", host}, {"slot", e.slot}, {"rank", w.rank}, {"local_rank", w.local_rank},
                           {"pid", e.pid}, {"code", e.code}, {"signal", e.signal}};
  if (!err.problem.empty()) {
    fields["problem"] = err.problem;
  } else {
    fields["message"] = err.message;
    fields["traceback"] = err.traceback;
    if (err.timestamp) fields["timestamp"] = *err.timestamp;
  }
  emit("worker_error", std::move(fields));
}

}  // namespace elasticrun::cmd
