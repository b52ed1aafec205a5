// Which algorithm a collective runs among a Step's ranks over the transport alone (no
// shared memory, no hierarchy): as ELASTICRUN_ALGORITHM forces, else by size
// (HostCommConfig::Crossover), and where a tuner is given, as its measurements decide among
// the class's candidates (host/tuner.h). Every input is the same on every rank, so every
// rank runs the same algorithm.
#pragma once

#include "host/algorithms.h"
#include "host/host_communicator.h"
#include "host/tuner.h"

#include <cstddef>
#include <span>

namespace elasticrun::collective {

struct Flat {
  const HostCommConfig& cfg;
  const HostCommConfig::Crossover& crossover;
  Tuner* tuner;  // null: the fixed choice
};

// ring, rd, rhd, direct or twoshot as forced; else rd up to rd_max, rhd up to rhd_max, the
// ring above; tuned against Tuner::allreduce_candidates up to ring_tuned_max. `ready`, if
// set, is asked for the input as algorithms.h says.
void allreduce_flat(Step& st, const Flat& f, Algorithm a, const void* in, void* out, std::size_t count, DataType t,
                    ReduceOp op, const InputReady* ready = nullptr);
// direct as forced; else the binomial tree below scatter_min, scatter-allgather up to
// chain_min_bytes, the chain above; tuned against the binomial tree, the pipelined binary
// tree and direct (HostCommConfig::tune).
void broadcast_flat(Step& st, const Flat& f, Algorithm a, void* buf, std::size_t bytes, int root);
// direct as forced; else Bruck's in size classes up to few_rounds_max bytes of result
// (equal blocks), the ring above; equal blocks are tuned up to ring_tuned_max: Bruck's, the ring and, among 3
// to direct_max_ranks, direct. Unequal ones as reduce_scatterv_flat: direct in few rounds,
// the ring above, each tuned against the other.
void allgatherv_flat(Step& st, const Flat& f, Algorithm a, const void* in, void* out,
                     std::span<const std::size_t> counts, std::size_t elem);
// direct as forced; else halving in size classes up to few_rounds_max bytes of input,
// the ring above;
// tuned up to ring_tuned_max: halving, the ring and, among 3 to direct_max_ranks, direct.
// `ready` as for allreduce_flat.
void reduce_scatter_flat(Step& st, const Flat& f, Algorithm a, const void* in, void* out, std::size_t count,
                         DataType t, ReduceOp op, const InputReady* ready = nullptr);

// Blocks of unequal sizes (rank q gets counts[q] elements): direct as forced; else direct
// (among up to direct_max_ranks) in a size class up to few_rounds_max, the ring above;
// tuned (up to ring_tuned_max, among 3 to direct_max_ranks) each against the other;
// equal ones as reduce_scatter_flat. A tuner must see one shape per size class: the hierarchical
// reduce-scatter's leaders do (their blocks are their hosts' sizes times the count).
void reduce_scatterv_flat(Step& st, const Flat& f, Algorithm a, const void* in, void* out,
                          std::span<const std::size_t> counts, DataType t, ReduceOp op,
                          const InputReady* ready = nullptr);

}  // namespace elasticrun::collective
