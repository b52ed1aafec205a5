// The collectives of one exchange among all ranks: each rank sends to every other at once
// and waits for one message from each. The direct allreduce (whole vectors), the direct
// reduce-scatter and allgather (a block each), and the two-shot allreduce, which is those
// two in a row. Where a message takes longer to cross a link than a rank takes to send
// n-1 of them (a millisecond of latency), one exchange beats the log2(n) of recursive
// doubling and the n-1 of a ring; the reduce-scatter and allgather also move the
// bandwidth-optimal (n-1)/n of the data per rank, as the ring does. They cost n-1
// messages in flight per rank, so the communicator offers them to small worlds only.
// Every send goes in pairwise order (to r+1, r+2, ...) so that no rank is everyone's first.
#include "host/algorithms.h"
#include "host/reduce.h"
#include "host/schedule.h"

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace elasticrun::collective {
namespace {

using Request = Transport::Request;

// Block q of a collective's vector, in bytes.
struct Block {
  std::size_t offset = 0, bytes = 0;
};

// Where each of `counts`' blocks starts, in bytes, and (last) where they end.
std::vector<std::size_t> byte_offsets(std::span<const std::size_t> counts, std::size_t elem) {
  std::vector<std::size_t> offset(counts.size() + 1, 0);
  for (std::size_t q = 0; q < counts.size(); ++q) offset[q + 1] = offset[q] + counts[q] * elem;
  return offset;
}

bool overlap(const std::byte* a, std::size_t a_bytes, const std::byte* b, std::size_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

// A reduce-scatter by direct sends: block q of `src` (src_bytes in all; block(q), `count`
// elements for this rank's) goes to rank q, and this rank folds its own block from the n
// copies in rank order (x0 op x1 op ... op x(n-1)) into `result`, so that the bits do not
// depend on arrival order. `result` may lie in src (in place): the fold then goes to
// scratch and is copied there once the sends have read src. Tags on `step`.
template <class BlockOf>
void reduce_scatter_sends(Step& st, const std::byte* src, std::size_t src_bytes, std::byte* result, BlockOf block,
                          std::size_t count, DataType t, ReduceOp op, std::uint64_t step) {
  const int r = st.tp.rank(), n = st.tp.size();
  const Block mine = block(r);
  const bool aliased = overlap(result, mine.bytes, src, src_bytes);
  // Slot q holds rank q's copy of this rank's block; slot n the fold, where it is aliased.
  std::byte* slots = st.ws.tmp(mine.bytes * static_cast<std::size_t>(n + (aliased ? 1 : 0)));
  auto slot = [&](int q) { return slots + mine.bytes * static_cast<std::size_t>(q); };
  std::byte* fold = aliased ? slot(n) : result;
  std::vector<Request> recvs(n), sends;
  if (mine.bytes > 0)
    for (int s = 1; s < n; ++s) {
      const int from = schedule::pairwise(r, n, s).from;
      recvs[from] = st.tp.irecv(from, st.tag(step), slot(from), mine.bytes);
    }
  for (int s = 1; s < n; ++s) {
    const int to = schedule::pairwise(r, n, s).to;
    const Block b = block(to);
    if (b.bytes > 0) sends.push_back(st.tp.isend(to, st.tag(step), src + b.offset, b.bytes));
  }
  auto copy_of = [&](int q) -> const void* {
    if (q == r) return src + mine.offset;
    st.tp.wait(recvs[q], st.deadline, st.what);
    return slot(q);
  };
  if (mine.bytes > 0) {
    const ReduceOp acc = accumulate_op(op);
    if (n == 1) std::memmove(fold, copy_of(0), mine.bytes);
    else reduce(t, acc, fold, copy_of(0), copy_of(1), count);
    for (int q = 2; q < n; ++q) reduce(t, acc, fold, fold, copy_of(q), count);
    if (op == ReduceOp::avg) finalize_avg(t, fold, count, n);
  }
  st.wait(sends);
  if (aliased) std::memcpy(result, fold, mine.bytes);
}

// An allgather by direct sends: this rank's block (`mine`, block(r).bytes) goes to every
// other rank, and rank q's lands at dst + block(q).offset (this rank's too, copied unless
// `mine` is already there). Tags on `step`.
template <class BlockOf>
void allgather_sends(Step& st, const std::byte* mine, std::byte* dst, BlockOf block, std::uint64_t step) {
  const int r = st.tp.rank(), n = st.tp.size();
  const Block own = block(r);
  std::vector<Request> reqs;
  for (int s = 1; s < n; ++s) {
    const int from = schedule::pairwise(r, n, s).from;
    const Block b = block(from);
    if (b.bytes > 0) reqs.push_back(st.tp.irecv(from, st.tag(step), dst + b.offset, b.bytes));
  }
  if (own.bytes > 0)
    for (int s = 1; s < n; ++s) reqs.push_back(st.tp.isend(schedule::pairwise(r, n, s).to, st.tag(step), mine, own.bytes));
  if (own.bytes > 0 && mine != dst + own.offset) std::memcpy(dst + own.offset, mine, own.bytes);
  st.wait(reqs);
}

}  // namespace

// Direct: every rank sends its whole vector to every other and folds the n vectors
// itself, in rank order, so that every rank computes the same bits. One exchange, where
// recursive doubling needs log2(n), at the price of n-1 messages and (n-1) x bytes of
// traffic and of scratch per rank: for small vectors and worlds.
void allreduce_direct(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op) {
  const int r = st.tp.rank(), n = st.tp.size();
  const std::size_t bytes = count * size_of(t);
  if (bytes == 0) return;  // every rank has nothing (the buffers may be null)
  // Slot q (of `bytes`) holds rank q's vector; this rank's own holds its input when it must
  // be copied: in place, the sends read it while the fold writes out.
  std::byte* slots = st.ws.tmp(bytes * static_cast<std::size_t>(n));
  auto slot = [&](int q) { return slots + bytes * static_cast<std::size_t>(q); };
  const void* mine = in;
  if (in == out) mine = std::memcpy(slot(r), in, bytes);
  std::vector<Request> recvs(n), sends;
  for (int s = 1; s < n; ++s) {
    const int from = schedule::pairwise(r, n, s).from;
    recvs[from] = st.tp.irecv(from, st.tag(0), slot(from), bytes);
  }
  for (int s = 1; s < n; ++s) sends.push_back(st.tp.isend(schedule::pairwise(r, n, s).to, st.tag(0), mine, bytes));
  auto vector_of = [&](int q) -> const void* {
    if (q == r) return mine;
    st.tp.wait(recvs[q], st.deadline, st.what);
    return slot(q);
  };
  const ReduceOp acc = accumulate_op(op);
  const void* x0 = vector_of(0);
  reduce(t, acc, out, x0, vector_of(1), count);
  for (int q = 2; q < n; ++q) reduce(t, acc, out, out, vector_of(q), count);
  if (op == ReduceOp::avg) finalize_avg(t, out, count, n);
  st.wait(sends);
}

// Two-shot: the direct reduce-scatter of block q (schedule::balanced) to rank q, then the
// direct allgather of the reduced blocks. Two exchanges, where recursive doubling needs
// log2(n) and halving-doubling 2 log2(n), and each rank sends 2(n-1)/n of the vector, the
// bandwidth-optimal share (direct sends it n-1 times whole), in 2(n-1) messages: for small
// worlds on links where each exchange costs a round trip and the bytes cost too.
void allreduce_twoshot(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op) {
  const int r = st.tp.rank(), n = st.tp.size();
  const std::size_t elem = size_of(t);
  if (count == 0) return;  // every rank has nothing (the buffers may be null)
  auto block = [&](int q) {
    const schedule::Range b = schedule::balanced(count, static_cast<std::size_t>(n), static_cast<std::size_t>(q));
    return Block{b.offset * elem, b.count * elem};
  };
  auto* dst = static_cast<std::byte*>(out);
  std::byte* result = dst + block(r).offset;
  reduce_scatter_sends(st, static_cast<const std::byte*>(in), count * elem, result, block, block(r).bytes / elem, t,
                       op, 0);
  allgather_sends(st, result, dst, block, 1);
}

void reduce_scatter_direct(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op) {
  const std::size_t bytes = count * size_of(t);
  if (bytes == 0) return;
  const std::size_t n = static_cast<std::size_t>(st.tp.size());
  auto block = [&](int q) { return Block{bytes * static_cast<std::size_t>(q), bytes}; };
  reduce_scatter_sends(st, static_cast<const std::byte*>(in), n * bytes, static_cast<std::byte*>(out), block, count,
                       t, op, 0);
}

void reduce_scatterv_direct(Step& st, const void* in, void* out, std::span<const std::size_t> counts, DataType t,
                            ReduceOp op) {
  const std::size_t elem = size_of(t);
  const std::vector<std::size_t> offset = byte_offsets(counts, elem);
  if (offset.back() == 0) return;
  auto block = [&](int q) { return Block{offset[q], counts[q] * elem}; };
  reduce_scatter_sends(st, static_cast<const std::byte*>(in), offset.back(), static_cast<std::byte*>(out), block,
                       counts[st.tp.rank()], t, op, 0);
}

void allgatherv_direct(Step& st, const void* in, void* out, std::span<const std::size_t> counts, std::size_t elem) {
  const std::vector<std::size_t> offset = byte_offsets(counts, elem);
  auto block = [&](int q) { return Block{offset[q], counts[q] * elem}; };
  allgather_sends(st, static_cast<const std::byte*>(in), static_cast<std::byte*>(out), block, 0);
}

}  // namespace elasticrun::collective
