#include "rendezvous/assignment.h"

#include <algorithm>
#include <map>

namespace elasticrun::rendezvous {

const WorkerPlace* Assignment::find(const std::string& host, int slot) const {
  auto it = index_.find({host, slot});
  return it == index_.end() ? nullptr : &workers[it->second];
}

int total_slots(const std::vector<HostSlots>& hosts) {
  int n = 0;
  for (const auto& h : hosts) n += std::max(0, h.slots);
  return n;
}

Assignment assign(const std::vector<HostSlots>& hosts, int np, std::uint64_t epoch) {
  Assignment a;
  a.epoch = epoch;
  int want = np <= 0 ? total_slots(hosts) : std::min(np, total_slots(hosts));
  std::vector<int> used;  // slots used on each host
  for (const auto& h : hosts) {
    int take = std::min(std::max(0, h.slots), want - a.size());
    used.push_back(take);
    for (int s = 0; s < take; ++s)
      a.workers.push_back(WorkerPlace{h.name, s, a.size(), s, take, 0, 0});
  }
  a.index();
  return a;
}

Assignment assign_places(const std::vector<std::pair<std::string, int>>& places, std::uint64_t epoch) {
  Assignment a;
  a.epoch = epoch;
  std::map<std::string, int> on_host;
  for (const auto& [host, slot] : places) {
    WorkerPlace w{host, slot, a.size(), on_host[host]++, 0, 0, 0};
    a.workers.push_back(w);
  }
  for (auto& w : a.workers) w.local_size = on_host[w.host];
  a.index();
  return a;
}

void Assignment::index() {
  // cross_rank: earlier hosts with that local rank; cross_size: hosts with it at all.
  std::map<int, int> seen;
  for (auto& w : workers) w.cross_rank = seen[w.local_rank]++;
  for (auto& w : workers) w.cross_size = seen[w.local_rank];
  for (const auto& w : workers) index_[{w.host, w.slot}] = w.rank;
}

}  // namespace elasticrun::rendezvous
