// Rank layout: which (host, slot) gets which rank, and the local/cross coordinates.
//
// Pure functions, no I/O. Hosts keep their order; slots fill contiguously, host by
// host, up to np. local_rank is the slot index on its host; cross_rank is how many
// earlier hosts have that local rank; cross_size how many hosts have it at all.
#pragma once

#include "discovery/hosts.h"

#include <cstdint>
#include <map>
#include <utility>
#include <optional>
#include <string>
#include <vector>

namespace elasticrun::rendezvous {

using HostSlots = discovery::Host;

struct WorkerPlace {
  std::string host;
  int slot = 0;
  int rank = 0, local_rank = 0, local_size = 0, cross_rank = 0, cross_size = 0;
  // Which worker process holds the place: the epoch it was started in (its
  // ELASTICRUN_EPOCH, which its join names). A place removed and listed again gets a new
  // worker while the old one may still be stopping; only the one named here may join or
  // re-join it. 0: any (set by the driver, not by assign()).
  std::uint64_t started_epoch = 0;
};

struct Assignment {
  std::uint64_t epoch = 0;
  std::vector<WorkerPlace> workers;  // indexed by rank
  int size() const { return static_cast<int>(workers.size()); }
  const WorkerPlace* find(const std::string& host, int slot) const;

 private:
  friend Assignment assign(const std::vector<HostSlots>&, int, std::uint64_t);
  friend Assignment assign_places(const std::vector<std::pair<std::string, int>>&, std::uint64_t);
  void index();  // cross ranks and the place index, from the ranks and local ranks
  std::map<std::pair<std::string, int>, int> index_;  // (host, slot) -> rank
};

// Fills min(np, total slots) ranks. np <= 0 means every slot.
Assignment assign(const std::vector<HostSlots>& hosts, int np, std::uint64_t epoch);
// Ranks for these places in this order (the survivors of an epoch that cannot complete,
// in their old rank order); a host's local ranks count its places in that order.
Assignment assign_places(const std::vector<std::pair<std::string, int>>& places, std::uint64_t epoch);
int total_slots(const std::vector<HostSlots>& hosts);

}  // namespace elasticrun::rendezvous
