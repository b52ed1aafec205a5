#include "cmd/sweep/pool.h"

#include <algorithm>
#include <stdexcept>

namespace elasticrun::sweep {

Pool::Host* Pool::find_host(const std::string& name) {
  for (auto& h : hosts_)
    if (h.name == name) return &h;
  return nullptr;
}

std::vector<Pool::Running*> Pool::by_priority(bool best_first) {
  std::vector<Running*> out;
  for (auto& [id, r] : trials_) out.push_back(&r);
  std::sort(out.begin(), out.end(), [](const Running* a, const Running* b) {
    return a->priority != b->priority ? a->priority < b->priority : a->order < b->order;
  });
  if (!best_first) std::reverse(out.begin(), out.end());
  return out;
}

std::vector<Shrunk> Pool::set_host(const std::string& name, int slots) {
  if (slots < 0) throw std::invalid_argument("pool: host '" + name + "' with " + std::to_string(slots) + " slots");
  Host* h = find_host(name);
  if (!h) {
    if (slots > 0) hosts_.push_back({name, slots, 0});
    return {};
  }
  // Take the excess back from the trials on this host, the worst priority first.
  std::vector<Shrunk> shrunk;
  int excess = h->used - slots;
  for (Running* r : by_priority(false)) {
    if (excess <= 0) break;
    auto it = std::find_if(r->share.begin(), r->share.end(), [&](const Slice& s) { return s.host == name; });
    if (it == r->share.end()) continue;
    const int n = std::min(excess, it->slots);
    give_back(*r, name, n);
    excess -= n;
    shrunk.push_back({r->need.id, r->size, r->size < r->need.min_np});
  }
  h = find_host(name);
  h->slots = slots;
  if (slots == 0) hosts_.erase(hosts_.begin() + (h - hosts_.data()));
  return shrunk;
}

std::vector<std::string> Pool::startable(const std::vector<TrialNeed>& pending) const {
  int free = free_slots();
  std::vector<std::string> out;
  for (const auto& t : pending) {
    if (running(t.id)) continue;
    if (t.min_np > free) break;
    free -= t.min_np;
    out.push_back(t.id);
  }
  return out;
}

bool Pool::start(const TrialNeed& t, int priority) {
  if (t.min_np < 1 || t.max_np < t.min_np)
    throw std::invalid_argument("pool: trial '" + t.id + "' needs 1 <= min_np <= max_np");
  if (running(t.id) || free_slots() < t.min_np) return false;
  Running& r = trials_[t.id];
  r.need = t;
  r.priority = priority;
  r.order = started_++;
  take(r, t.min_np);
  return true;
}

// Compact placement, one host at a time: a host the trial already uses (most free first), else
// the host with the most free slots; ties to the host added first (the earlier in hosts_).
int Pool::take(Running& r, int n) {
  int given = 0;
  while (given < n) {
    Host* best = nullptr;
    bool best_used = false;
    for (auto& h : hosts_) {
      const int free = h.slots - h.used;
      if (free <= 0) continue;
      const bool used = std::any_of(r.share.begin(), r.share.end(), [&](const Slice& s) { return s.host == h.name; });
      if (!best || (used && !best_used) || (used == best_used && free > best->slots - best->used))
        best = &h, best_used = used;
    }
    if (!best) break;
    const int k = std::min(n - given, best->slots - best->used);
    best->used += k;
    auto it = std::find_if(r.share.begin(), r.share.end(), [&](const Slice& s) { return s.host == best->name; });
    if (it == r.share.end()) r.share.push_back({best->name, k});
    else it->slots += k;
    r.size += k;
    given += k;
  }
  return given;
}

void Pool::give_back(Running& r, const std::string& host, int n) {
  auto it = std::find_if(r.share.begin(), r.share.end(), [&](const Slice& s) { return s.host == host; });
  if (it == r.share.end()) return;
  n = std::min(n, it->slots);
  it->slots -= n;
  r.size -= n;
  if (it->slots == 0) r.share.erase(it);
  if (Host* h = find_host(host)) h->used -= n;
}

std::vector<std::string> Pool::allocate() {
  std::vector<Running*> order = by_priority(true);
  std::vector<bool> changed(order.size(), false);
  // First back to min_np (trials a lost host left short), then up to max_np.
  for (int pass = 0; pass < 2; ++pass)
    for (std::size_t i = 0; i < order.size(); ++i) {
      Running& r = *order[i];
      if (r.held) continue;
      const int target = pass == 0 ? r.need.min_np : r.need.max_np;
      if (r.size < target && take(r, target - r.size) > 0) changed[i] = true;
    }
  std::vector<std::string> out;
  for (std::size_t i = 0; i < order.size(); ++i)
    if (changed[i]) out.push_back(order[i]->need.id);
  return out;
}

void Pool::release(const std::string& trial) {
  auto it = trials_.find(trial);
  if (it == trials_.end()) return;
  while (!it->second.share.empty()) {
    const Slice s = it->second.share.front();
    give_back(it->second, s.host, s.slots);
  }
  trials_.erase(it);
}

void Pool::hold(const std::string& trial) {
  if (auto it = trials_.find(trial); it != trials_.end()) it->second.held = true;
}

void Pool::set_priority(const std::string& trial, int priority) {
  if (auto it = trials_.find(trial); it != trials_.end()) it->second.priority = priority;
}

void Pool::set_ranking(const std::vector<std::string>& best_first) {
  for (std::size_t i = 0; i < best_first.size(); ++i) set_priority(best_first[i], static_cast<int>(i));
}

const Share& Pool::share(const std::string& trial) const {
  static const Share none;
  auto it = trials_.find(trial);
  return it == trials_.end() ? none : it->second.share;
}

int Pool::size(const std::string& trial) const {
  auto it = trials_.find(trial);
  return it == trials_.end() ? 0 : it->second.size;
}

int Pool::free_on(const std::string& host) const {
  for (const auto& h : hosts_)
    if (h.name == host) return h.slots - h.used;
  return 0;
}

std::vector<std::string> Pool::hosts() const {
  std::vector<std::string> out;
  for (const auto& h : hosts_) out.push_back(h.name);
  return out;
}

int Pool::total_slots() const {
  int n = 0;
  for (const auto& h : hosts_) n += h.slots;
  return n;
}

int Pool::busy_slots() const {
  int n = 0;
  for (const auto& h : hosts_) n += h.used;
  return n;
}

double Pool::utilisation() const {
  const int total = total_slots();
  return total > 0 ? static_cast<double>(busy_slots()) / total : 0;
}

void UsageMeter::record(double now, int busy, int total, bool trials_waiting) {
  if (started_ && now > last_) {
    const double dt = now - last_;
    busy_ += busy_now_ * dt;
    available_ += total_now_ * dt;
    if (waiting_now_) waiting_busy_ += busy_now_ * dt, waiting_available_ += total_now_ * dt;
  }
  started_ = true;
  last_ = std::max(last_, now);
  busy_now_ = busy, total_now_ = total, waiting_now_ = trials_waiting;
}

}  // namespace elasticrun::sweep
