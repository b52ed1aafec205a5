// The collective algorithms, written against Transport only.
//
// Each takes a Step context (transport, deadline, sequence number for tags,
// cached scratch memory, pipeline segment size) and raw byte buffers. Argument
// checking and algorithm choice live in the communicator; here the inputs are
// assumed consistent across ranks.
#pragma once

#include "host/schedule.h"
#include "host/transport.h"

#include <elasticrun/types.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <vector>

namespace elasticrun::collective {

// Scratch buffers kept across calls so large collectives do not page-fault fresh
// memory every time. Contents are undefined between calls.
class Workspace {
 public:
  std::byte* tmp(std::size_t bytes) { return grow(tmp_, tmp_cap_, bytes); }
  std::byte* scratch(std::size_t bytes) { return grow(scratch_, scratch_cap_, bytes); }

 private:
  static std::byte* grow(std::unique_ptr<std::byte[]>& buf, std::size_t& cap, std::size_t bytes) {
    if (bytes > cap) {
      buf.reset(new std::byte[bytes]);
      cap = bytes;
    }
    return buf.get();
  }
  std::unique_ptr<std::byte[]> tmp_, scratch_;
  std::size_t tmp_cap_ = 0, scratch_cap_ = 0;
};

struct Step {
  Transport& tp;
  Clock::time_point deadline;
  std::uint64_t seq;        // this collective's sequence number, folded into tags
  Workspace& ws;
  std::size_t segment;      // pipeline chunk size in bytes
  int window;               // receives kept posted ahead in pipelined loops
  const char* what;         // collective name for error messages
  // Added to every step of the tags: a second exchange within the same collective (the
  // tuner's agreement, host/tuner.h) takes steps no algorithm's reach.
  std::uint64_t step_base = 0;
  // Above `segment`: the ring's chunk grows with its blocks up to this (schedule::ring_segment).
  std::size_t segment_max = 0;
  std::uint64_t tag(std::uint64_t step) const { return Transport::make_tag(seq, step_base + step); }
  void wait(std::span<Transport::Request> r) const { tp.wait(r, deadline, what); }
};

// Called before an algorithm first reads `count` elements of its input from `offset` on,
// so that a caller can fill the input while earlier parts are already on the wire (the
// hierarchical allreduce's host sums). The ring asks for each chunk as it needs it, in
// the order allreduce_ring_reads gives; the other algorithms ask for all of it first.
using InputReady = std::function<void(std::size_t offset, std::size_t count)>;

void allreduce_ring(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                    const InputReady* ready = nullptr);
// The blocks of its input, in elements, in the order the ring of `size` reads them on `rank`.
std::vector<schedule::Range> allreduce_ring_reads(int rank, int size, std::size_t count);
void allreduce_rd(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op);
// One exchange: every rank sends its vector to every other and folds all n in rank order.
void allreduce_direct(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op);
void allreduce_rhd(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op);
// Two exchanges: a reduce-scatter by direct sends (rank q reduces block q), then an
// allgather of the reduced blocks by direct sends.
void allreduce_twoshot(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op);
// `count` elements per rank: rank r gets block r of the n x count input, reduced.
// Direct: one exchange (block q of every rank's input goes to rank q), folded in rank order.
void reduce_scatter_direct(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op);
void reduce_scatter_ring(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                         const InputReady* ready = nullptr);
// The blocks of its input (`count` elements each), in the order the ring of `size` reads them on `rank`.
std::vector<schedule::Range> reduce_scatter_ring_reads(int rank, int size, std::size_t count);
// Blocks of unequal sizes: rank q gets block q, counts[q] elements, of the blocks laid end
// to end; the reads as above.
void reduce_scatterv_ring(Step& st, const void* in, void* out, std::span<const std::size_t> counts, DataType t,
                          ReduceOp op, const InputReady* ready = nullptr);
std::vector<schedule::Range> reduce_scatterv_ring_reads(int rank, std::span<const std::size_t> counts);
void reduce_scatterv_direct(Step& st, const void* in, void* out, std::span<const std::size_t> counts, DataType t,
                            ReduceOp op);
void reduce_scatter_halving(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op);
// counts in elements of `elem` bytes; out receives every rank's block in rank order.
void allgatherv_ring(Step& st, const void* in, void* out, std::span<const std::size_t> counts, std::size_t elem);
// One exchange: every rank sends its block to every other.
void allgatherv_direct(Step& st, const void* in, void* out, std::span<const std::size_t> counts, std::size_t elem);
// Every rank's block of `block` bytes, in rank order, in ceil(log2 n) rounds (tags from
// first_tag on).
void allgather_bruck(Step& st, const void* in, void* out, std::size_t block, std::uint64_t first_tag = 0);

// Shared by the algorithms. Reduces a peer's copy into `mine` so that every rank
// computes the same bits: the lower rank's data is always the left operand (matters
// only for NaN min/max).
void combine(DataType t, ReduceOp op, void* mine, const void* theirs, std::size_t n, bool peer_lower);
// A rank folded out of a power-of-two scheme (schedule::RecursiveDoubling): `send`
// goes to its partner with tag 0, and `recv` comes back with `back_tag`, after the
// partner's last round.
void sit_out(Step& st, int partner, const void* send, std::size_t send_bytes, void* recv, std::size_t recv_bytes,
             std::uint64_t back_tag);

// One hop: the root sends to every other rank.
void broadcast_direct(Step& st, void* buf, std::size_t bytes, int root);
void broadcast_binomial(Step& st, void* buf, std::size_t bytes, int root);
// Pipelined tree: counted from the root, rank v's children are fanout*v+1 .. fanout*v+fanout,
// and each forwards every segment to them as it lands. fanout 1 is the chain (each link
// carries the message once, n-1 hops); 2 the binary tree (log2(n) hops, an inner rank's
// link carries it twice).
void broadcast_pipelined(Step& st, void* buf, std::size_t bytes, int root, int fanout);
void broadcast_scatter_allgather(Step& st, void* buf, std::size_t bytes, int root);
void alltoall_pairwise(Step& st, const void* in, void* out, std::size_t block_bytes);
void barrier_dissemination(Step& st);

}  // namespace elasticrun::collective
