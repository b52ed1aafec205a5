// Elastic membership: which hosts a job may use, and the next epoch's assignment.
//
// Pure logic with the time passed in, so that cool-downs and ordering are unit-tested
// without sleeping. The rules (DESIGN.md, "Elastic semantics"):
//  - surviving hosts keep their relative order, new hosts are appended, slots fill
//    contiguously up to max_np; so rank 0 is a surviving worker holding committed state;
//  - a host whose worker failed is blacklisted, permanently or, with a cool-down range
//    [min, max], for min * 2^(failures-1) capped at max, after which it may come back if
//    discovery still lists it.
#pragma once

#include "discovery/hosts.h"
#include "rendezvous/assignment.h"

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace elasticrun::rendezvous {

using TimePoint = std::chrono::steady_clock::time_point;
using Place = std::pair<std::string, int>;  // (host, slot)

struct MembershipConfig {
  int min_np = 1;
  int max_np = 0;  // 0: no cap
  std::optional<std::pair<std::chrono::milliseconds, std::chrono::milliseconds>> cooldown;
};

// What changes from one epoch to the next.
struct Plan {
  Assignment assignment;
  std::vector<WorkerPlace> spawn;  // places without a live worker: start one
  std::vector<Place> remove;       // live workers not in the new epoch: stop them
  std::vector<Place> keep;         // live workers that re-join
};

class Membership {
 public:
  explicit Membership(MembershipConfig cfg) : cfg_(std::move(cfg)) {}

  // The latest discovered hosts, in discovery order.
  void set_discovered(std::vector<discovery::Host> hosts) { discovered_ = std::move(hosts); }
  const std::vector<discovery::Host>& discovered() const { return discovered_; }
  // Blacklists `host`; returns how long (nullopt: for good).
  std::optional<std::chrono::milliseconds> blacklist(const std::string& host, TimePoint now);
  bool blacklisted(const std::string& host, TimePoint now) const;
  // Usable hosts now: discovered and not blacklisted, in discovery order.
  std::vector<discovery::Host> usable(TimePoint now) const;
  int usable_slots(TimePoint now) const;
  // The next epoch given the current one and the places whose workers are alive.
  // nullopt when fewer than min_np slots are usable. Hosts with a live worker among
  // `holders` (those holding the job's state) come first, so that rank 0 holds it when
  // any survivor does; then the other hosts of the current epoch with a live worker.
  std::optional<Plan> plan(const Assignment& current, const std::set<Place>& alive, TimePoint now,
                           const std::set<Place>& holders = {}) const;
  // Whether plan() would differ from `current` (hosts or slots changed).
  bool changed(const Assignment& current, const std::set<Place>& alive, TimePoint now) const;
  // When the earliest blacklisted host's cool-down ends, if any does.
  std::optional<TimePoint> next_expiry(TimePoint now) const;

 private:
  struct Ban {
    int failures = 0;
    std::optional<TimePoint> until;  // nullopt: for good
  };
  MembershipConfig cfg_;
  std::vector<discovery::Host> discovered_;
  std::map<std::string, Ban> bans_;
};

}  // namespace elasticrun::rendezvous
