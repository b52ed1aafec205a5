// Collectives among the ranks of one host, through a ShmGroup's segment.
//
// Each works in rounds of at most one slot per rank. Consecutive rounds (within a
// call and across calls) use the group's two sets of slots alternately, and every
// round has at least one barrier, so a round never writes a slot that some rank may
// still be reading from two rounds before: that rank arrived at a barrier of the
// round in between only after it finished reading.
#pragma once

#include "host/schedule.h"
#include "host/shm_group.h"

#include <elasticrun/types.hpp>

#include <cstddef>
#include <span>

namespace elasticrun::collective {

// memcpy in pieces of 256 KiB: glibc's memcpy of 1 MiB or more from or to a slot is
// several times slower per byte than 512 KiB on this machine (1 MiB is where glibc
// stops using rep movsb here; broadcast 2 ranks, 1 MiB rounds: 160 us per 1 MiB,
// 47 us in 256 KiB pieces).
void copy_pieces(std::byte* dst, const std::byte* src, std::size_t n);

struct ShmWait {
  Clock::time_point deadline;
  const AbortSignal& abort;
  const char* what;
};

// The reduce-scatter half of a round of `len` elements, shared by the one-host and
// the hierarchical allreduce. Each rank owns part my_part(g, len) of the round.
// reduce_my_part copies every part but ours from `s` (our input for the round) into
// our slot of `set`, waits for every rank, then reduces our part over all ranks
// (ours read from `s` itself) into `res`, in rank order, without the avg division.
schedule::Range my_part(const ShmGroup& g, std::size_t len);
void reduce_my_part(ShmGroup& g, int set, const std::byte* s, std::size_t len, schedule::Range mine, DataType t,
                    ReduceOp acc, std::byte* res, const ShmWait& w);

// Vectors up to the group's small_max() bytes (at most one slot): every rank copies its input in,
// one barrier, and every rank reduces all slots itself, in rank order, so all get the
// same bits. Larger ones go in rounds of one slot: copy in, barrier, each rank
// reduces its 1/n of the round (its own part read from `in` directly) into `out`
// and the result slot, barrier, each copies the others' parts out.
void allreduce_shm(ShmGroup& g, const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                   const ShmWait& w);

// The root copies a slot's worth in, barrier, the others copy it out.
void broadcast_shm(ShmGroup& g, void* buf, std::size_t bytes, int root, const ShmWait& w);

// Each rank copies (a slot's worth of) its block in, barrier, each copies the
// others' blocks out. `counts` in elements of `elem` bytes; `in` may be this rank's
// place in `out`.
void allgatherv_shm(ShmGroup& g, const void* in, void* out, std::span<const std::size_t> counts, std::size_t elem,
                    const ShmWait& w);

// `in` holds size() blocks of `count`; rank r gets block r reduced over all ranks.
// Each rank copies its pieces of every block in, barrier, each reduces its own block.
void reduce_scatter_shm(ShmGroup& g, const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                        const ShmWait& w);

// Blocks of unequal sizes laid end to end in `in` (block q `counts[q]` elements, of any
// size): rank r gets block r reduced over all ranks at `out`, in rounds of a piece of
// every block side by side in a slot (each rank copies in the others'
// pieces, barrier, each reduces its own, reading its own piece from `in` unless `out` is
// its block of `in`). avg divides by size(); at least 2 ranks.
void reduce_scatterv_shm(ShmGroup& g, const void* in, void* out, std::span<const std::size_t> counts, DataType t,
                         ReduceOp op, const ShmWait& w);

// `in` and `out` hold size() blocks of `block_bytes`: block q of `in` goes to rank q,
// and `out` block q comes from rank q.
void alltoall_shm(ShmGroup& g, const void* in, void* out, std::size_t block_bytes, const ShmWait& w);

}  // namespace elasticrun::collective
