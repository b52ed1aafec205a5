#include "rendezvous/membership.h"

#include <algorithm>

namespace elasticrun::rendezvous {

std::optional<std::chrono::milliseconds> Membership::blacklist(const std::string& host, TimePoint now) {
  Ban& b = bans_[host];
  ++b.failures;
  if (!cfg_.cooldown) {
    b.until.reset();
    return std::nullopt;
  }
  auto [lo, hi] = *cfg_.cooldown;
  auto d = lo;
  for (int i = 1; i < b.failures && d < hi; ++i) d *= 2;
  d = std::min(d, hi);
  b.until = now + d;
  return d;
}

bool Membership::blacklisted(const std::string& host, TimePoint now) const {
  auto it = bans_.find(host);
  if (it == bans_.end() || it->second.failures == 0) return false;
  return !it->second.until || now < *it->second.until;
}

std::vector<discovery::Host> Membership::usable(TimePoint now) const {
  std::vector<discovery::Host> out;
  for (const auto& h : discovered_)
    if (!blacklisted(h.name, now)) out.push_back(h);
  return out;
}

int Membership::usable_slots(TimePoint now) const {
  int n = 0;
  for (const auto& h : usable(now)) n += h.slots;
  return n;
}

std::optional<Plan> Membership::plan(const Assignment& current, const std::set<Place>& alive, TimePoint now,
                                     const std::set<Place>& holders) const {
  auto hosts = usable(now);
  // Order: hosts of the current epoch that still have a live worker holding the state,
  // then those with any live worker, each in their old order; then every other usable
  // host in discovery order.
  std::vector<discovery::Host> ordered;
  std::set<std::string> placed;
  for (bool holding : {true, false}) {
    for (const auto& w : current.workers) {
      Place p{w.host, w.slot};
      if (placed.count(w.host) || !alive.count(p) || (holding && !holders.count(p))) continue;
      auto it = std::find_if(hosts.begin(), hosts.end(), [&](const auto& h) { return h.name == w.host; });
      if (it == hosts.end()) continue;
      ordered.push_back(*it);
      placed.insert(w.host);
    }
  }
  for (const auto& h : hosts)
    if (!placed.count(h.name)) ordered.push_back(h);
  int slots = total_slots(ordered);
  if (slots < cfg_.min_np || slots == 0) return std::nullopt;
  Plan p;
  p.assignment = assign(ordered, cfg_.max_np > 0 ? cfg_.max_np : 0, current.epoch + 1);
  std::set<Place> next;
  for (const auto& w : p.assignment.workers) {
    next.insert({w.host, w.slot});
    if (alive.count({w.host, w.slot})) p.keep.push_back({w.host, w.slot});
    else p.spawn.push_back(w);
  }
  for (const auto& a : alive)
    if (!next.count(a)) p.remove.push_back(a);
  return p;
}

bool Membership::changed(const Assignment& current, const std::set<Place>& alive, TimePoint now) const {
  auto p = plan(current, alive, now);
  if (!p) return true;
  if (!p->spawn.empty() || !p->remove.empty()) return true;
  if (p->assignment.size() != current.size()) return true;
  for (int r = 0; r < current.size(); ++r)
    if (p->assignment.workers[r].host != current.workers[r].host || p->assignment.workers[r].slot != current.workers[r].slot)
      return true;
  return false;
}

std::optional<TimePoint> Membership::next_expiry(TimePoint now) const {
  std::optional<TimePoint> best;
  for (const auto& [host, b] : bans_)
    if (b.until && *b.until > now && (!best || *b.until < *best)) best = b.until;
  return best;
}

}  // namespace elasticrun::rendezvous
