// The epoch controller's membership: host changes and failures become new epochs, and
// every wait ends at a deadline.
#include "cmd/controller.h"

#include "cmd/exit_codes.h"
#include "common/log.h"

#include <algorithm>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <csignal>

namespace elasticrun::cmd {

void EpochController::use_hosts(std::vector<discovery::Host> hosts, TimePoint now) {
  fixed_hosts_ = true;
  membership_.set_discovered(std::move(hosts));
  reconcile(now);
}

void EpochController::hosts_changed(const std::vector<discovery::Host>& hosts, TimePoint now) {
  if (finished()) return;
  fixed_hosts_ = false;
  std::map<std::string, int> before, after;
  for (const auto& h : membership_.discovered()) before[h.name] = h.slots;
  for (const auto& h : hosts) after[h.name] = h.slots;
  for (const auto& [h, n] : after)
    if (!before.count(h)) emit("host_added", {{"host", h}, {"slots", n}});
  for (const auto& [h, n] : before)
    if (!after.count(h)) emit("host_removed", {{"host", h}});
  membership_.set_discovered(hosts);
  reconcile(now);
}

std::set<Place> EpochController::alive() const {
  std::set<Place> out;
  for (const auto& [p, w] : workers_)
    if (!w.exited_ok) out.insert(p);
  return out;
}

bool EpochController::all_finished() const {
  if (assignment_.size() == 0) return false;
  for (const auto& r : assignment_.workers) {
    auto it = workers_.find({r.host, r.slot});
    if (it == workers_.end() || !it->second.exited_ok) return false;
  }
  return true;
}

// A worker (slot >= 0) or a whole host (slot -1) failed. Outside elastic mode that
// ends the job; in it, the host is blacklisted, its workers stopped, and a new epoch
// formed from what is left. Restart mode has rules of its own (restart_after).
void EpochController::worker_failed(const Place& p, const Failure& why, TimePoint now) {
  if (finished()) return;
  if (cfg_.max_restarts) return restart_after(p, why, now);
  std::string who = "a daemon";
  if (p.second >= 0) {
    // Not the place's worker any more (failed or removed already): nothing new.
    if (!workers_.count(p)) return;
    if (!cfg_.elastic) {
      // One death arrives twice, and the daemon's exit report says more.
      if (why.kind == Failure::Kind::connection_lost) return;
      return end(exit_code::kWorkerFailed, describe(p) + " " + why.text);
    }
    who = describe(p);
    say(fmt::format("{} {}; blacklisting host '{}'", who, why.text, p.first));
    workers_.at(p).failed = true;
    retire(p, SIGKILL);
  } else {
    // A daemon lost after its workers were already failed or removed changes nothing.
    bool live = false;
    for (const auto& [q, w] : workers_) live = live || (q.first == p.first && !w.exited_ok);
    if (!live) return;
    say(fmt::format("host '{}' {}; blacklisting it", p.first, why.text));
  }
  blacklist(p.first, why, now);
  std::vector<Place> rest;
  for (const auto& [q, w] : workers_)
    if (q.first == p.first && !w.exited_ok) rest.push_back(q);
  for (const auto& q : rest) remove_worker(q, now);
  epoch_broken_ = true;
  broken_reason_ = fmt::format("{} on host '{}' {}", who, p.first, why.text);
  reconcile(now);
}

void EpochController::blacklist(const std::string& host, const Failure& why, TimePoint now) {
  auto cooldown = membership_.blacklist(host, now);
  cooldown_end_ = membership_.next_expiry(now);
  ban_reasons_[host] = why.text;
  static constexpr const char* kCause[] = {"exited", "connection_lost", "join_timeout", "daemon_lost",
                                           "worker_timeout", "spawn_failed"};
  emit("host_blacklisted", {{"host", host}, {"reason", why.text}, {"cause", kCause[static_cast<int>(why.kind)]},
                            {"cooldown_s", cooldown ? cooldown->count() / 1000.0 : -1.0}});
}

// A worker gave up on the current epoch before the driver saw any failure. Usually what
// it saw (a peer's death) reaches the driver within moments as an exit or a lost daemon,
// and that starts the next epoch. If nothing does within abandon_grace, the epoch is
// broken for everyone (a collective timed out on a silent peer): start the next one with
// the members there are, rather than leave them waiting in re-join. Nobody is
// blacklisted for it.
//
// In restart mode nothing is done: whatever made the worker give up ends a process or a
// wait (it fails), and that restarts the generation.
void EpochController::epoch_abandoned(const rendezvous::WorkerPlace& p, std::uint64_t epoch, TimePoint now) {
  if (!worker(p) || !cfg_.elastic || cfg_.max_restarts || finished() || epoch != assignment_.epoch ||
      abandon_deadline_)
    return;
  abandon_deadline_ = now + cfg_.abandon_grace;
  abandoned_by_ = describe({p.host, p.slot});
  abandoned_epoch_ = epoch;
}

// Stops the place's worker: SIGTERM, then SIGKILL after stop_grace if it has not exited.
// The kill goes to the slot, which holds this worker's process only: a successor at the
// place starts after it exited.
void EpochController::remove_worker(const Place& p, TimePoint now) { retire(p, SIGTERM, now + cfg_.stop_grace); }

void EpochController::reconcile(TimePoint now) {
  if (finished()) return;
  if (cfg_.max_restarts) return reconcile_generation(now);
  // Once a worker finished its training (exit 0), the job is ending: the rest follow,
  // and no membership change may start new workers that would have no peers.
  if (finishing_) return cfg_.elastic && cannot_complete() ? finish_with_survivors(now) : void();
  auto live = alive();
  // Nothing to change: the running epoch's hosts are all there (again, after a dip in
  // discovered hosts that left it alone), so nothing waits for slots any more.
  if (assignment_.epoch > 0 && !epoch_broken_ && !membership_.changed(assignment_, live, now)) return slots_back(now);
  std::set<Place> holders;
  for (const auto& [p, w] : workers_)
    if (holds_state(w) && live.count(p)) holders.insert(p);
  auto plan = membership_.plan(assignment_, live, now, holders);
  if (!plan) return wait_for_slots(now);
  // The workers kept may all be ones that never joined an epoch that formed (started
  // for one that a second failure broke before it formed): they hold no state either.
  bool kept_state = std::any_of(plan->keep.begin(), plan->keep.end(), [&](const Place& p) { return holders.count(p); });
  // Before any epoch formed nobody trained: there is no state to lose (workers of a new
  // run still restore a durable checkpoint by themselves).
  bool from_checkpoint = assignment_.epoch > 0 && state_formed_ && !kept_state;
  if (from_checkpoint && !cfg_.durable)
    return end(exit_code::kWorkerFailed,
               plan->keep.empty()
                   ? fmt::format("no surviving worker holds committed state (all of epoch {} are gone)", assignment_.epoch)
                   : fmt::format("no surviving worker holds committed state (those left were started for epoch {}, "
                                 "which never formed, and the workers that held it are gone)",
                                 assignment_.epoch));
  slots_back(now);
  // The soft notice lets workers finish their step in the running epoch first; an epoch
  // that some worker has not joined yet cannot run a step, and one that joined it would
  // wait in its first collective for a peer that has already moved on to the new epoch.
  bool unformed = assignment_.epoch > 0 && !not_joined().empty();
  bool hard = epoch_broken_ || !plan->remove.empty() || unformed;
  std::string reason = epoch_broken_ ? broken_reason_
                       : unformed    ? fmt::format("hosts changed before epoch {} had formed", assignment_.epoch)
                                     : "hosts changed";
  if (from_checkpoint) {
    reason = fmt::format("{}; every worker holding the job's state is gone", reason);
    say(fmt::format("{}: epoch {} restores from the newest durable checkpoint", reason, assignment_.epoch + 1));
  }
  if (assignment_.epoch > 0) {
    ++resets_;
    emit("reset", {{"count", resets_}, {"reason", reason}, {"from_checkpoint", from_checkpoint}});
    if (cfg_.reset_limit > 0 && resets_ > cfg_.reset_limit)
      return end(exit_code::kWorkerFailed, fmt::format("reset limit {} reached ({})", cfg_.reset_limit, reason));
  }
  begin_epoch(std::move(*plan), hard ? msg::NotifyKind::abort : msg::NotifyKind::hosts_updated, reason, now);
}

// Whether the current epoch, in a job that is ending, can no longer run its steps: a
// member failed, or finished (exit 0) without joining it. The latter happens when a
// new epoch starts during the last step: a worker whose part of the last collective
// completed commits it and exits, while a peer interrupted by the new epoch restores
// the commit before and waits for an epoch that the finished one will never join.
bool EpochController::cannot_complete() const {
  if (epoch_broken_) return true;
  for (const auto& r : assignment_.workers) {
    auto it = workers_.find({r.host, r.slot});
    if (it == workers_.end() || !it->second.exited_ok) continue;
    // One that never joined any epoch does not use the library: nothing to say.
    if (it->second.joined_epoch > 0 && it->second.joined_epoch < assignment_.epoch) return true;
  }
  return false;
}

// The survivors holding the job's state run the remaining steps among themselves, in
// their old rank order (so rank 0 holds committed state), without new workers: the
// job is ending. Members that never held state are stopped.
void EpochController::finish_with_survivors(TimePoint now) {
  std::vector<Place> keep, stop;
  for (const auto& r : assignment_.workers) {
    auto it = workers_.find({r.host, r.slot});
    if (it == workers_.end() || it->second.exited_ok) continue;
    (holds_state(it->second) ? keep : stop).push_back({r.host, r.slot});
  }
  std::string reason = epoch_broken_ ? broken_reason_
                                     : fmt::format("a worker finished before epoch {} formed", assignment_.epoch);
  if (keep.empty() && !epoch_broken_) {
    // Nothing failed: every worker that held the job's state finished it, as a new epoch
    // formed around them (a host added during the last step). Those started for that
    // epoch never held any state and have nothing to finish.
    for (const auto& p : stop) remove_worker(p, now);
    say(fmt::format("{}: every worker holding the job's state finished; {} that joined late stopped", reason,
                    stop.size()));
    return end(exit_code::kOk, "");
  }
  if (keep.empty())
    return end(exit_code::kWorkerFailed,
               fmt::format("no surviving worker holds committed state to finish the job ({})", reason));
  ++resets_;
  emit("reset", {{"count", resets_}, {"reason", reason}});
  if (cfg_.reset_limit > 0 && resets_ > cfg_.reset_limit)
    return end(exit_code::kWorkerFailed, fmt::format("reset limit {} reached ({})", cfg_.reset_limit, reason));
  say(fmt::format("{}; the {} remaining worker{} finish the job", reason, keep.size(), keep.size() == 1 ? "" : "s"));
  rendezvous::Plan plan;
  plan.assignment = rendezvous::assign_places(keep, assignment_.epoch + 1);
  plan.keep = keep;
  plan.remove = stop;
  begin_epoch(std::move(plan), msg::NotifyKind::abort, reason, now);
}

void EpochController::begin_epoch(rendezvous::Plan plan, msg::NotifyKind kind, const std::string& reason,
                                  TimePoint now) {
  for (const auto& p : plan.remove) remove_worker(p, now);
  assignment_ = std::move(plan.assignment);
  // Workers kept keep their process; the rest are started for this epoch.
  for (auto& w : assignment_.workers) {
    auto it = workers_.find({w.host, w.slot});
    if (it != workers_.end()) it->second.rank = w.rank, it->second.local_rank = w.local_rank;
    w.started_epoch = it != workers_.end() ? it->second.started_epoch : assignment_.epoch;
  }
  out_.push_back(command::StartEpoch{assignment_, kind, reason});
  nlohmann::json places = nlohmann::json::array();
  for (const auto& w : assignment_.workers) places.push_back({{"rank", w.rank}, {"host", w.host}, {"slot", w.slot}});
  emit("epoch_started", {{"epoch", assignment_.epoch}, {"size", assignment_.size()},
                         {"kind", assignment_.epoch == 1             ? "start"
                                  : kind == msg::NotifyKind::abort ? "abort"
                                                                   : "hosts_updated"},
                         {"assignment", places}});
  ER_LOG(driver, info, "epoch {}: {} workers ({} new, {} kept, {} removed)", assignment_.epoch, assignment_.size(),
         plan.spawn.size(), plan.keep.size(), plan.remove.size());
  reserve_port(plan);
  for (const auto& w : plan.spawn) spawn(w);
  // A worker that joined the previous epoch, or is new, gets a whole join timeout (a new
  // one --start-timeout); one that missed the previous epoch too keeps its deadline.
  for (const auto& w : assignment_.workers) {
    auto it = workers_.find({w.host, w.slot});
    if (it == workers_.end()) continue;
    Worker& x = it->second;
    if (x.joined_epoch + 1 >= assignment_.epoch || x.awaited_from_epoch == 0) {
      x.join_limit = x.joined_epoch == 0 || !cfg_.elastic ? cfg_.start_timeout : cfg_.rendezvous_timeout;
      x.join_deadline = now + x.join_limit;
      x.awaited_from_epoch = assignment_.epoch;
    }
  }
  epoch_broken_ = false;
}

// The workers of the current epoch that have not joined it (nor exited, nor been removed).
std::vector<Place> EpochController::not_joined() const {
  std::vector<Place> out;
  for (const auto& r : assignment_.workers) {
    auto it = workers_.find({r.host, r.slot});
    if (it != workers_.end() && !it->second.exited_ok && it->second.joined_epoch < assignment_.epoch)
      out.push_back({r.host, r.slot});
  }
  return out;
}

// Workers that neither joined the epoch nor exited in time are hung (or SIGSTOPped):
// fail them, which stops them and forms the next epoch without them.
void EpochController::join_timeout(TimePoint now) {
  std::uint64_t epoch = assignment_.epoch;
  std::vector<Place> late;
  for (const auto& p : not_joined())
    if (workers_.at(p).join_deadline <= now) late.push_back(p);
  if (late.empty()) return;
  if (!cfg_.elastic && !cfg_.max_restarts) {
    std::string names;
    for (std::size_t i = 0; i < late.size() && i < 8; ++i)
      names += fmt::format(" {}@{}", workers_.at(late[i]).rank, late[i].first);
    return end(exit_code::kTimeout,
               fmt::format("{} of {} workers did not join within {:.1f} s (rank@host:{})", late.size(),
                           assignment_.size(), workers_.at(late.front()).join_limit.count() / 1000.0, names));
  }
  for (const auto& p : late) {
    auto it = workers_.find(p);
    if (it == workers_.end() || finished()) continue;  // failed with an earlier one's host
    const Worker& w = it->second;
    std::string since = w.awaited_from_epoch < epoch ? fmt::format(" (waiting since epoch {})", w.awaited_from_epoch) : "";
    worker_failed(p, {Failure::Kind::join_timeout, fmt::format("did not join epoch {} within {:.1f} s{}", epoch,
                                                               w.join_limit.count() / 1000.0, since)},
                  now);
  }
}

// Why the slots an elastic job waits for can never come: no blacklisted host's cool-down
// is pending (none was given, --blacklist-cooldown-range), and the host list is fixed or
// discovery lists only hosts blacklisted for good. "" while a cool-down or discovery may
// still bring slots (discovery listing nothing, or a usable host, may list more later).
// Horovod ends such a job at once too; waiting --elastic-timeout would only delay it.
std::string EpochController::beyond_recovery(TimePoint now) const {
  if (!cfg_.elastic || cfg_.max_restarts || membership_.next_expiry(now)) return "";
  const auto& listed = membership_.discovered();
  std::vector<std::string> banned;
  for (const auto& h : listed) {
    if (!membership_.blacklisted(h.name, now)) {
      if (!fixed_hosts_) return "";
      continue;
    }
    auto why = ban_reasons_.find(h.name);
    banned.push_back(fmt::format("'{}': {}", h.name, why == ban_reasons_.end() ? "failed" : why->second));
  }
  if (banned.empty()) return "";
  std::string hosts = fmt::format("{}", fmt::join(banned, "; "));
  if (!fixed_hosts_)
    return fmt::format("every host discovery lists is blacklisted and none can come back (no "
                       "--blacklist-cooldown-range): {}",
                       hosts);
  return fmt::format("the fixed host list has {} usable slots of the {} needed, and its blacklisted hosts cannot "
                     "come back (no --blacklist-cooldown-range): {}",
                     membership_.usable_slots(now), cfg_.min_np, hosts);
}

void EpochController::wait_for_slots(TimePoint now) {
  if (auto why = beyond_recovery(now); !why.empty()) return end(exit_code::kWorkerFailed, why);
  // After a failure the current epoch cannot go on: interrupt it (once), and let the
  // survivors wait in rejoin; also when the failure comes while the job already waits
  // for a dip in discovered hosts to end. A mere dip leaves the running epoch alone: if
  // the hosts come back in time, nothing changes.
  if (assignment_.epoch > 0 && epoch_broken_ && aborted_epoch_ != assignment_.epoch) {
    aborted_epoch_ = assignment_.epoch;
    out_.push_back(command::AbortEpoch{broken_reason_});
  }
  if (elastic_deadline_) return;
  elastic_deadline_ = now + cfg_.elastic_timeout;
  int have = membership_.usable_slots(now);
  int want = cfg_.elastic ? cfg_.min_np : cfg_.np;
  ER_LOG(driver, warn, "waiting up to {:.0f} s for {} slots ({} available)", cfg_.elastic_timeout.count() / 1000.0,
         want, have);
  emit("waiting_for_slots", {{"available", have}, {"min_np", want}});
}

// Enough slots again: the wait for them (--elastic-timeout) is over.
void EpochController::slots_back(TimePoint now) {
  if (!elastic_deadline_) return;
  emit("slots_available", {{"slots", membership_.usable_slots(now)}});
  elastic_deadline_.reset();
}

std::optional<TimePoint> EpochController::next_deadline(TimePoint now) const {
  std::optional<TimePoint> first;
  auto consider = [&](std::optional<TimePoint> t) {
    if (t && (!first || *t < *first)) first = t;
  };
  for (const auto& [p, w] : retired_) consider(w.kill_at);
  if (finished()) return first;
  consider(abandon_deadline_);
  consider(elastic_deadline_);
  // One past the cool-down's end: at its end the host is still blacklisted.
  if (cooldown_end_) consider(std::max(*cooldown_end_ + std::chrono::milliseconds(1), now));
  if (joins_awaited())
    for (const auto& p : not_joined()) consider(workers_.at(p).join_deadline);
  return first;
}

// Whether workers that do not join in time are late. A program that never links
// libelasticrun (a torchrun script) never joins, and runs to its end.
bool EpochController::joins_awaited() const { return joined_any_ || (cfg_.elastic && !cfg_.max_restarts); }

void EpochController::tick(TimePoint now) {
  for (auto& [p, w] : retired_)
    if (w.kill_at && *w.kill_at <= now) {
      w.kill_at.reset();
      out_.push_back(command::Signal{p, SIGKILL});
    }
  if (finished()) return;
  if (abandon_deadline_ && *abandon_deadline_ <= now) {
    abandon_deadline_.reset();
    if (abandoned_epoch_ == assignment_.epoch && !elastic_deadline_) {
      say(fmt::format("{} gave up on epoch {} and nothing failed meanwhile; starting a new epoch", abandoned_by_,
                      abandoned_epoch_));
      epoch_broken_ = true;
      broken_reason_ =
          fmt::format("{} gave up on epoch {} (a collective failed or timed out)", abandoned_by_, abandoned_epoch_);
      reconcile(now);
    }
  }
  if (!finished() && joins_awaited()) join_timeout(now);
  if (!finished() && elastic_deadline_ && *elastic_deadline_ <= now) {
    int want = cfg_.elastic ? cfg_.min_np : cfg_.np;
    end(exit_code::kTimeout, fmt::format("fewer than {} slots available for {:.0f} s (--elastic-timeout); {} now",
                                         want, cfg_.elastic_timeout.count() / 1000.0, membership_.usable_slots(now)));
  }
  if (!finished() && cooldown_end_ && *cooldown_end_ < now) {
    cooldown_end_ = membership_.next_expiry(now);
    reconcile(now);
  }
}

}  // namespace elasticrun::cmd
