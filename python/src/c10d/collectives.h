// The process group's collectives that the library has no single call for, composed of
// the ones it has, over raw buffers (no torch here). Each takes its buffers as torch's
// list arguments give them, one per rank, wherever they are in memory, and goes through
// execute(), so that `check` (the ranks agree on count and type first) applies.
//
// They run on the engine's thread, one at a time: the scratch buffers they allocate live
// for one call.
#pragma once

#include "engine.h"

#include <cstddef>
#include <span>

namespace elasticrun::python::c10d {

// One rank's block of an alltoall: `bytes` at `data`.
struct Block {
  const void* data = nullptr;
  std::size_t bytes = 0;
};
struct MutableBlock {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// Each tensor of `bufs` (counts[i] elements each) reduced across ranks, through one
// allreduce of their concatenation.
void allreduce_concatenated(Context& ctx, std::span<void* const> bufs, std::span<const std::size_t> counts,
                         DataType type, ReduceOp op, bool check);
// Rank r's `count` elements land in outs[r].
void allgather_into(Context& ctx, const void* in, std::size_t count, DataType type, std::span<void* const> outs,
                    bool check);
// out = the reduction over ranks of their ins[rank()].
void reduce_scatter_from(Context& ctx, std::span<const void* const> ins, void* out, std::size_t count,
                         DataType type, ReduceOp op, bool check);
// The reduction lands in `buf` on `root`; other ranks' `buf` are left as they were.
void reduce_to(Context& ctx, void* buf, std::size_t count, DataType type, ReduceOp op, int root, bool check);
// On `root`, rank r's `count` elements land in outs[r]; other ranks pass no outs.
void gather_to(Context& ctx, const void* in, std::size_t count, DataType type, std::span<void* const> outs,
               int root, bool check);
// Rank r receives root's ins[r] into `out`; other ranks pass no ins.
void scatter_from(Context& ctx, std::span<const void* const> ins, void* out, std::size_t count, DataType type,
                  int root, bool check);
// in[j] goes to rank j, out[j] comes from rank j, of any sizes (which the ranks must
// agree on pairwise: what i sends j is what j expects from i). Every block is padded to
// the largest block of any rank, agreed in one allreduce first.
void alltoallv(Context& ctx, std::span<const Block> in, std::span<const MutableBlock> out);

}  // namespace elasticrun::python::c10d
