// Allreduce among the ranks of one host, through a ShmGroup's segment.
#pragma once

#include "shm_group.h"

#include <elasticrun/types.hpp>

#include <cstddef>

namespace elasticrun::collective {

struct ShmWait {
  Clock::time_point deadline;
  const AbortSignal& abort;
  const char* what;
};

// Vectors up to `small_max` bytes (at most one slot): every rank copies its input in,
// one barrier, and every rank reduces all slots itself, in rank order, so all get the
// same bits. Larger ones go in rounds of one slot: copy in, barrier, each rank
// reduces its 1/n of the round (its own part read from `in` directly) into `out`
// and the result slot, barrier, each copies the others' parts out.
void allreduce_shm(ShmGroup& g, const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                   std::size_t small_max, const ShmWait& w);

}  // namespace elasticrun::collective
