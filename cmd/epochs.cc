// Elastic membership in the driver: host changes and failures become new epochs.
#include "cmd/exit_codes.h"
#include "cmd/job.h"
#include "common/log.h"

#include <fmt/format.h>

#include <csignal>

namespace elasticrun::cmd {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

void Job::start_watcher() {
  if (opts_.discovery_script.empty()) {
    membership_.set_discovered(opts_.hosts);
    return reconcile();
  }
  discovery::ScriptOptions so;
  so.path = opts_.discovery_script;
  so.timeout = opts_.discovery_timeout;
  so.default_slots = opts_.slots_per_host;
  discovery::HostWatcher::Callbacks cb;
  cb.on_change = [this](const std::vector<discovery::Host>& hosts) { on_hosts(hosts); };
  cb.on_error = [this](const std::string& why) {
    events_.emit("discovery_error", {{"message", why}});  // the watcher logs it, rate-limited
  };
  cb.on_fatal = [this](const std::string& why) {
    finish(exit_code::kLaunchFailed, "host discovery failed on its first run: " + why);
  };
  watcher_ = std::make_unique<discovery::HostWatcher>(io_, discovery::make_script_source(io_, so),
                                                      opts_.discovery_interval, std::move(cb));
  watcher_->start();
}

void Job::on_hosts(const std::vector<discovery::Host>& hosts) {
  std::map<std::string, int> before, after;
  for (const auto& h : membership_.discovered()) before[h.name] = h.slots;
  for (const auto& h : hosts) after[h.name] = h.slots;
  for (const auto& [h, n] : after)
    if (!before.count(h)) events_.emit("host_added", {{"host", h}, {"slots", n}});
  for (const auto& [h, n] : before)
    if (!after.count(h)) events_.emit("host_removed", {{"host", h}});
  membership_.set_discovered(hosts);
  reconcile();
}

std::set<Job::Place> Job::alive() const {
  std::set<Place> out;
  for (const auto& [p, w] : workers_)
    if (!w.exited_ok) out.insert(p);
  return out;
}

bool Job::all_finished() const {
  if (assignment_.size() == 0) return false;
  for (const auto& r : assignment_.workers) {
    auto it = workers_.find({r.host, r.slot});
    if (it == workers_.end() || !it->second.exited_ok) return false;
  }
  return true;
}

// A worker (slot >= 0) or a whole host (slot -1) failed. Outside elastic mode that
// ends the job; in it, the host is blacklisted, its workers stopped, and a new epoch
// formed from what is left.
void Job::on_worker_failed(const Place& p, const std::string& why) {
  if (exit_code_ >= 0) return;
  std::string who = "a daemon";
  if (p.second >= 0) {
    // Not the place's worker any more (failed or removed already): nothing new.
    if (!workers_.count(p)) return;
    if (!opts_.elastic) {
      if (why.find("rendezvous connection") != std::string::npos) return;  // the exit report says more
      return finish(exit_code::kWorkerFailed, describe(p) + " " + why);
    }
    who = describe(p);
    fmt::print(stderr, "elasticrun: {} {}; blacklisting host '{}'\n", who, why, p.first);
    retire(p, SIGKILL);
  } else {
    // A daemon lost after its workers were already failed or removed changes nothing.
    bool live = false;
    for (const auto& [q, w] : workers_) live = live || (q.first == p.first && !w.exited_ok);
    if (!live) return;
    fmt::print(stderr, "elasticrun: host '{}' {}; blacklisting it\n", p.first, why);
  }
  auto cooldown = membership_.blacklist(p.first, Clock::now());
  events_.emit("host_blacklisted", {{"host", p.first}, {"reason", why},
                                    {"cooldown_s", cooldown ? cooldown->count() / 1000.0 : -1.0}});
  std::vector<Place> rest;
  for (const auto& [q, w] : workers_)
    if (q.first == p.first && !w.exited_ok) rest.push_back(q);
  for (const auto& q : rest) remove_worker(q);
  epoch_broken_ = true;
  broken_reason_ = fmt::format("{} on host '{}' {}", who, p.first, why);
  reconcile();
}

// A worker gave up on the current epoch before the driver saw any failure. Usually what
// it saw (a peer's death) reaches the driver within moments as an exit or a lost daemon,
// and that starts the next epoch. If nothing does, the epoch is broken for everyone (a
// collective timed out on a silent peer): start the next one with the members there are,
// rather than leave them waiting in re-join. Nobody is blacklisted for it.
void Job::on_epoch_abandoned(const Place& p, std::uint64_t epoch) {
  if (!opts_.elastic || exit_code_ >= 0 || epoch != assignment_.epoch || abandon_pending_) return;
  abandon_pending_ = true;
  std::string who = describe(p);
  abandon_timer_.expires_after(std::chrono::seconds(2));
  abandon_timer_.async_wait([this, who, epoch](boost::system::error_code ec) {
    abandon_pending_ = false;
    if (ec || exit_code_ >= 0 || epoch != assignment_.epoch || waiting_for_slots_) return;
    fmt::print(stderr, "elasticrun: {} gave up on epoch {} and nothing failed meanwhile; starting a new epoch\n", who,
               epoch);
    epoch_broken_ = true;
    broken_reason_ = fmt::format("{} gave up on epoch {} (a collective failed or timed out)", who, epoch);
    reconcile();
  });
}

// Stops the place's worker: SIGTERM, then SIGKILL after 2 s if it has not exited. The
// kill goes to the slot, which holds this worker's process only: a successor at the
// place starts after it exited.
void Job::remove_worker(const Place& p) {
  if (!retire(p, SIGTERM)) return;
  auto t = std::make_shared<asio::steady_timer>(io_, std::chrono::seconds(2));
  t->async_wait([this, p, t, started = retired_.at(p).started_epoch](boost::system::error_code ec) {
    auto it = retired_.find(p);
    if (!ec && it != retired_.end() && it->second.started_epoch == started) signal_worker(p, SIGKILL);
  });
}

void Job::reconcile() {
  if (exit_code_ >= 0) return;
  // Once a worker of this epoch finished its training (exit 0), the job is ending: the
  // rest follow, and no membership change may start new workers that have no peers.
  for (const auto& [p, w] : workers_)
    if (w.exited_ok) return;
  auto now = Clock::now();
  auto live = alive();
  if (assignment_.epoch > 0 && !epoch_broken_ && !membership_.changed(assignment_, live, now)) return;
  auto plan = membership_.plan(assignment_, live, now);
  if (!plan) return wait_for_slots();
  if (assignment_.epoch > 0 && plan->keep.empty())
    return finish(exit_code::kWorkerFailed,
                  fmt::format("no surviving worker holds committed state (all of epoch {} are gone)", assignment_.epoch));
  if (waiting_for_slots_) events_.emit("slots_available", {{"slots", membership_.usable_slots(now)}});
  waiting_for_slots_ = false;
  elastic_timer_.cancel();
  // The soft notice lets workers finish their step in the running epoch first; an epoch
  // that some worker has not joined yet cannot run a step, and one that joined it would
  // wait in its first collective for a peer that has already moved on to the new epoch.
  bool unformed = assignment_.epoch > 0 && !not_joined().empty();
  bool hard = epoch_broken_ || !plan->remove.empty() || unformed;
  std::string reason = epoch_broken_ ? broken_reason_
                       : unformed    ? fmt::format("hosts changed before epoch {} had formed", assignment_.epoch)
                                     : "hosts changed";
  if (assignment_.epoch > 0) {
    ++resets_;
    events_.emit("reset", {{"count", resets_}, {"reason", reason}});
    if (opts_.reset_limit > 0 && resets_ > opts_.reset_limit)
      return finish(exit_code::kWorkerFailed, fmt::format("reset limit {} reached ({})", opts_.reset_limit, reason));
  }
  begin_epoch(std::move(*plan), hard ? msg::NotifyKind::abort : msg::NotifyKind::hosts_updated, reason);
}

void Job::begin_epoch(rendezvous::Plan plan, msg::NotifyKind kind, const std::string& reason) {
  for (const auto& p : plan.remove) remove_worker(p);
  assignment_ = std::move(plan.assignment);
  // Workers kept keep their process; the rest are started for this epoch.
  for (auto& w : assignment_.workers) {
    auto it = workers_.find({w.host, w.slot});
    if (it != workers_.end()) it->second.rank = w.rank;
    w.started_epoch = it != workers_.end() ? it->second.started_epoch : assignment_.epoch;
  }
  server_->start_epoch(assignment_, kind, reason);
  nlohmann::json places = nlohmann::json::array();
  for (const auto& w : assignment_.workers) places.push_back({{"rank", w.rank}, {"host", w.host}, {"slot", w.slot}});
  events_.emit("epoch_started", {{"epoch", assignment_.epoch}, {"size", assignment_.size()},
                                 {"kind", assignment_.epoch == 1             ? "start"
                                          : kind == msg::NotifyKind::abort ? "abort"
                                                                           : "hosts_updated"},
                                 {"assignment", places}});
  ER_LOG(driver, info, "epoch {}: {} workers ({} new, {} kept, {} removed)", assignment_.epoch, assignment_.size(),
         plan.spawn.size(), plan.keep.size(), plan.remove.size());
  for (const auto& w : plan.spawn) spawn(w);
  // A worker that joined the previous epoch, or is new, gets a whole join timeout (a new
  // one --start-timeout); one that missed the previous epoch too keeps its deadline.
  auto now = Clock::now();
  for (const auto& w : assignment_.workers) {
    auto it = workers_.find({w.host, w.slot});
    if (it == workers_.end()) continue;
    Worker& x = it->second;
    if (x.joined_epoch + 1 >= assignment_.epoch || x.awaited_from_epoch == 0) {
      x.join_limit = x.joined_epoch == 0 || !opts_.elastic ? opts_.start_timeout : opts_.rendezvous_timeout;
      x.join_deadline = now + x.join_limit;
      x.awaited_from_epoch = assignment_.epoch;
    }
  }
  epoch_broken_ = false;
  arm_join_timer();
  if (auto expiry = membership_.next_expiry(Clock::now())) {
    cooldown_timer_.expires_at(*expiry + std::chrono::milliseconds(1));
    cooldown_timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec) reconcile();
    });
  }
}

// The workers of the current epoch that have not joined it (nor exited, nor been removed).
std::vector<Job::Place> Job::not_joined() const {
  std::vector<Place> out;
  for (const auto& r : assignment_.workers) {
    auto it = workers_.find({r.host, r.slot});
    if (it != workers_.end() && !it->second.exited_ok && it->second.joined_epoch < assignment_.epoch)
      out.push_back({r.host, r.slot});
  }
  return out;
}

void Job::arm_join_timer() {
  auto waiting = not_joined();
  if (waiting.empty()) return;
  auto first = workers_.at(waiting.front()).join_deadline;
  for (const auto& p : waiting) first = std::min(first, workers_.at(p).join_deadline);
  join_timer_.expires_at(first);
  join_timer_.async_wait([this, e = assignment_.epoch](boost::system::error_code ec) {
    if (!ec) on_join_timeout(e);
  });
}

// Workers that neither joined the epoch nor exited in time are hung (or SIGSTOPped):
// fail them, which stops them and forms the next epoch without them.
void Job::on_join_timeout(std::uint64_t epoch) {
  if (exit_code_ >= 0 || epoch != assignment_.epoch) return;
  std::vector<Place> late;
  auto now = Clock::now();
  for (const auto& p : not_joined())
    if (workers_.at(p).join_deadline <= now) late.push_back(p);
  if (late.empty()) return arm_join_timer();  // others are due later
  auto limit = workers_.at(late.front()).join_limit;
  if (!opts_.elastic) {
    std::string names;
    for (std::size_t i = 0; i < late.size() && i < 8; ++i)
      names += fmt::format(" {}@{}", workers_[late[i]].rank, late[i].first);
    return finish(exit_code::kTimeout, fmt::format("{} of {} workers did not join within {:.1f} s (rank@host:{})",
                                                   late.size(), assignment_.size(), limit.count() / 1000.0, names));
  }
  for (const auto& p : late) {
    auto it = workers_.find(p);
    if (it == workers_.end()) continue;  // failed with an earlier one's host
    const Worker& w = it->second;
    std::string since = w.awaited_from_epoch < epoch ? fmt::format(" (waiting since epoch {})", w.awaited_from_epoch) : "";
    on_worker_failed(p, fmt::format("did not join epoch {} within {:.1f} s{}", epoch, w.join_limit.count() / 1000.0,
                                    since));
  }
  if (exit_code_ < 0 && epoch == assignment_.epoch) arm_join_timer();  // no new epoch: the rest are still due
}

void Job::wait_for_slots() {
  if (waiting_for_slots_) return;
  waiting_for_slots_ = true;
  int have = membership_.usable_slots(Clock::now());
  int want = opts_.elastic ? opts_.min_np : opts_.np;
  // After a failure the current epoch cannot go on: interrupt it, and let the survivors
  // wait in rejoin. A mere dip in discovered hosts leaves the running epoch alone: if
  // the hosts come back in time, nothing changes.
  if (assignment_.epoch > 0 && epoch_broken_) server_->abort_epoch(broken_reason_);
  ER_LOG(driver, warn, "waiting up to {:.0f} s for {} slots ({} available)", opts_.elastic_timeout.count() / 1000.0,
         want, have);
  events_.emit("waiting_for_slots", {{"available", have}, {"min_np", want}});
  elastic_timer_.expires_after(opts_.elastic_timeout);
  elastic_timer_.async_wait([this, want](boost::system::error_code ec) {
    if (ec || !waiting_for_slots_) return;
    finish(exit_code::kTimeout, fmt::format("fewer than {} slots available for {:.0f} s (--elastic-timeout); {} now",
                                            want, opts_.elastic_timeout.count() / 1000.0,
                                            membership_.usable_slots(Clock::now())));
  });
}

}  // namespace elasticrun::cmd
