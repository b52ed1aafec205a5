// Allreduce across hosts in two levels: the ranks of each host reduce through
// shared memory, the hosts' first ranks (leaders) allreduce the host sums over UCX,
// and each host's ranks copy the result out of shared memory. Across hosts only
// one rank per host sends, so the network carries 1/local_size of what a flat ring
// over every rank would make it carry, and messages between ranks of one host
// never go through UCX.
#pragma once

#include "host/shm_collectives.h"

#include <elasticrun/types.hpp>

#include <cstddef>
#include <functional>

namespace elasticrun::collective {

struct HierAllreduce {
  ShmGroup* host = nullptr;  // this host's ranks; null when this rank is alone on its host
  bool leader = false;       // the host's first rank: it takes part in `across`
  int world = 1;             // ranks in all, the divisor of avg
  std::size_t round_bytes;   // vector bytes per round, the same on every rank (and <= the host's slot)
  // Leaders only: allreduces `count` elements in place among the leaders with the
  // accumulating op, as round number `round` (rounds need distinct message tags).
  std::function<void(std::size_t round, void* buf, std::size_t count)> across;
};

// Rounds of round_bytes: copy in (all but our part), barrier, reduce our part into
// the result slot, barrier, leader allreduces the slot across hosts, barrier, all
// copy the slot out. It takes hier_rounds() rounds, the same on every rank.
void allreduce_hier(const HierAllreduce& h, const void* in, void* out, std::size_t count, DataType t,
                    ReduceOp op, const ShmWait& w);

// How many rounds allreduce_hier takes for `bytes` (none when empty), so that every
// rank can reserve that many sequence numbers before the call.
inline std::size_t hier_rounds(std::size_t bytes, std::size_t elem, std::size_t round_bytes) {
  std::size_t per = std::max<std::size_t>(round_bytes / elem, 1), count = bytes / elem;
  return count == 0 ? 0 : (count + per - 1) / per;
}

}  // namespace elasticrun::collective
