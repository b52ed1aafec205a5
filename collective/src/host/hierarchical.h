// Collectives across hosts in two levels. The allreduce: the ranks of each host reduce
// through shared memory, the hosts' first ranks (leaders) allreduce the host sums over
// UCX, and each host's ranks copy the result out of shared memory. Across hosts only
// one rank per host sends, so the network carries 1/local_size of what a flat ring
// over every rank would make it carry, and messages between ranks of one host
// never go through UCX. The reduce-scatter works the same way, with a reduce-scatter
// among the leaders, the allgather with an allgather, and the broadcast with a broadcast.
#pragma once

#include "host/algorithms.h"
#include "host/shm_collectives.h"

#include <elasticrun/types.hpp>

#include <cstddef>
#include <functional>
#include <span>

namespace elasticrun::collective {

struct HierAllreduce {
  ShmGroup* host = nullptr;  // this host's ranks; null when this rank is alone on its host
  bool leader = false;       // the host's first rank: it takes part in `across`
  int world = 1;             // ranks in all, the divisor of avg
  int hosts = 1;             // hosts (leaders) in all
  int index = 0;             // this host's place among them (its leader's rank in `across`)
  std::size_t round_bytes;   // vector bytes per round, the same on every rank (and <= the host's slot)
  // Leaders only: allreduces `count` elements in place among the leaders with the
  // accumulating op, asking `ready` before it reads a part of `buf` (algorithms.h).
  std::function<void(void* buf, std::size_t count, const InputReady& ready)> across;
};

// The host's sum in rounds of round_bytes (copy in all but our part, barrier, reduce our
// part into the result slot, barrier, the leader copies the slot into its `out`); the
// leader allreduces its `out` across hosts in one call (one pipeline for the whole
// vector: a call per round took a round trip per round), then broadcasts it to its
// host's ranks through the segment. Vectors of more than a round are summed in the order
// the leaders' ring reads them (allreduce_ring_reads), and the leader sums each round
// only when the ring asks for it, so the first parts are on the wire while the host
// still sums the rest.
void allreduce_hier(const HierAllreduce& h, const void* in, void* out, std::size_t count, DataType t,
                    ReduceOp op, const ShmWait& w);

// The allreduce in rails, on hosts that all hold the same L >= 2 ranks: the host's ranks
// reduce-scatter the vector through shared memory (rank j gets part j, a balanced 1/L of
// it, summed over the host), the hosts' j-th ranks allreduce part j among themselves
// (rail j: L allreduces across the hosts at once, each of 1/L of the vector, where the
// leaders' form has one of all of it), and the host's ranks allgather their parts
// through shared memory. The host sums all come first, not as a rail asks for them: a
// rank waiting in a host barrier for another that waits on its rail, whose peer on
// another host waits in its own host barrier, could wait for ever.
struct HierRails {
  ShmGroup* host = nullptr;  // this host's L ranks
  int world = 1;             // ranks in all, the divisor of avg
  // Allreduces `count` elements in place over this rank's rail with the accumulating op.
  std::function<void(void* buf, std::size_t count)> across;
};

void allreduce_rails(const HierRails& h, const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                     const ShmWait& w);

// The allgather in two levels, on any hosts (the ranks laid out host by host, so a host's
// blocks are consecutive in `out`): each host's ranks gather theirs through shared memory
// into the host's part of `out`, the leader exchanges the hosts' parts among the leaders,
// and hands the whole result to its host's ranks.
struct HierAllgather {
  ShmGroup* host = nullptr;  // null when this rank is alone on its host
  bool leader = false;
  int first = 0;                // this host's first rank
  std::span<const int> hosts;   // each host's ranks, in rank order
  // Leaders only: allgathers this host's part (at `part`) among the leaders into `out`,
  // host i's part `parts[i]` elements.
  std::function<void(const void* part, void* out, std::span<const std::size_t> parts)> across;
};

void allgather_hier(const HierAllgather& h, const void* in, void* out, std::span<const std::size_t> counts,
                    std::size_t elem, const ShmWait& w);

// The broadcast in two levels, on any hosts (the ranks laid out host by host): a root
// that is not its host's leader hands the data to its host's ranks through shared memory,
// the leaders broadcast it among themselves from the root's host (one copy into each
// host), and each leader hands it to its host's ranks that lack it through shared memory.
struct HierBroadcast {
  ShmGroup* host = nullptr;  // null when this rank is alone on its host
  bool leader = false;
  bool root_host = false;    // this rank's host holds the root
  int local_root = 0;        // the root's place among its host's ranks (where root_host)
  // Leaders only: broadcasts `bytes` at `buf` among the leaders from the root host's leader.
  std::function<void(void* buf, std::size_t bytes)> across;
};

void broadcast_hier(const HierBroadcast& h, void* buf, std::size_t bytes, const ShmWait& w);

// The reduce-scatter in two levels, on any hosts (the ranks laid out host by host, so that
// host i's blocks are consecutive: its L_i ranks' blocks, from its first rank's on). First
// the host sums, in rounds: each rank copies the pieces others reduce into its slot,
// barrier, each reduces its own pieces (its input read in place) into the result slot,
// barrier, and the leader copies them into `sums`. An input that fits one round goes in
// one, each of the host's L ranks reducing n/L of the blocks; a larger one goes host by
// host in the order the leaders' ring reads them (reduce_scatterv_ring_reads), each round
// a piece of each of that host's L_i blocks, shared out among the L ranks, and the leader
// sums a round only when the ring asks for it, so that the first parts are on the wire
// while the host sums the rest. The leader reduce-scatters `sums` among the leaders in
// one call, which pipelines the whole vector (rounds that each crossed the network once
// took a round trip each: behind 500 us links 1.3x the flat ring's time at 2-8 MiB).
// Last, in rounds, the leader copies its ranks' blocks into the result slot, barrier,
// and each copies its own out. A rank alone on its host has no sums to make: the leaders'
// reduce-scatter reads its input and writes its output.
struct HierReduceScatter {
  ShmGroup* host = nullptr;  // this host's L ranks; null when this rank is alone on its host
  bool leader = false;
  int first = 0;             // this host's first rank
  int world = 1;             // ranks in all, the divisor of avg
  int index = 0;             // this host's place among the hosts (its leader's rank in `across`)
  std::span<const int> hosts;  // each host's ranks, in rank order
  std::size_t round_bytes;   // the slot bytes a round may fill, the same on every rank
  std::byte* sums = nullptr; // leaders of several ranks: room for the whole input (world blocks)
  // Leaders only: reduce-scatters `input` (world blocks) among the leaders with the
  // accumulating op, host i's part (its L_i blocks, `parts[i]` elements) to leader i:
  // this host's lands at `ours`. `ready`, if set, is asked before a part of `input` is
  // read (algorithms.h).
  std::function<void(const std::byte* input, std::byte* ours, std::span<const std::size_t> parts,
                     const InputReady* ready)>
      across;
};

void reduce_scatter_hier(const HierReduceScatter& h, const void* in, void* out, std::size_t count, DataType t,
                         ReduceOp op, const ShmWait& w);

// Elements of each block a round of reduce_scatter_hier's host sums takes where it goes
// host by host, for a host of `blocks` ranks: its pieces fill at most a slot (0: a piece
// of one element of each does not fit in `round_bytes`, and it cannot run).
inline std::size_t hier_rs_piece(std::size_t elem, int blocks, std::size_t round_bytes) {
  return round_bytes / elem / static_cast<std::size_t>(blocks);
}

}  // namespace elasticrun::collective
