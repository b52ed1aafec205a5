#include "host/shm_collectives.h"

#include "host/reduce.h"
#include "host/schedule.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace elasticrun::collective {

void copy_pieces(std::byte* dst, const std::byte* src, std::size_t n) {
  constexpr std::size_t kPiece = 256 * 1024;
  for (std::size_t o = 0; o < n; o += kPiece) std::memcpy(dst + o, src + o, std::min(kPiece, n - o));
}

void allreduce_shm(ShmGroup& g, const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                   const ShmWait& w) {
  const std::size_t e = size_of(t), bytes = count * e;
  const int n = g.size(), r = g.rank();
  const ReduceOp acc = accumulate_op(op);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  if (bytes == 0) return;
  // Reduces n parts into `res`, left to right in rank order (the lower rank is the
  // left operand, as everywhere in the library).
  auto reduce_parts = [&](std::byte* res, auto part, std::size_t elems) {
    reduce(t, acc, res, part(0), part(1), elems);
    for (int q = 2; q < n; ++q) reduce(t, acc, res, res, part(q), elems);
    if (op == ReduceOp::avg) finalize_avg(t, res, elems, n);
  };

  if (bytes <= std::min(g.small_max(), g.slot_bytes())) {
    int set = g.next_set();
    // A few scalars ride in the flag's cache line: one line moves per peer, not two.
    const bool tiny = bytes <= ShmGroup::kTinyBytes;
    auto slot = [&](int q) -> std::byte* { return tiny ? g.tiny(set, q) : g.input(set, q); };
    std::memcpy(slot(r), src, bytes);
    g.barrier(w.deadline, w.abort, w.what);
    reduce_parts(dst, [&](int q) -> const std::byte* { return slot(q); }, count);
    return;
  }

  const std::size_t per_round = std::max<std::size_t>(g.slot_bytes() / e, 1);
  for (std::size_t o = 0; o < count; o += per_round) {
    const std::size_t len = std::min(per_round, count - o);
    const int set = g.next_set();
    const schedule::Range mine = my_part(g, len);
    const std::byte* s = src + o * e;
    std::byte* d = dst + o * e;
    // Our part is reduced straight into `out` and copied to the result slot for the
    // others while it is still in cache. In place, the passes after the first would
    // read our input after the first pass overwrote it, so reduce into the slot.
    const std::size_t off = mine.offset * e, part = mine.count * e;
    std::byte* res = g.result(set) + off;
    std::byte* first = src == dst ? res : d + off;
    reduce_my_part(g, set, s, len, mine, t, acc, first, w);
    if (part > 0) {
      if (op == ReduceOp::avg) finalize_avg(t, first, mine.count, n);
      copy_pieces(first == res ? d + off : res, first, part);
    }
    g.barrier(w.deadline, w.abort, w.what);
    copy_pieces(d, g.result(set), off);
    copy_pieces(d + off + part, g.result(set) + off + part, len * e - off - part);
  }
}

schedule::Range my_part(const ShmGroup& g, std::size_t len) {
  return schedule::balanced(len, static_cast<std::size_t>(g.size()), static_cast<std::size_t>(g.rank()));
}

void reduce_my_part(ShmGroup& g, int set, const std::byte* s, std::size_t len, schedule::Range mine, DataType t,
                    ReduceOp acc, std::byte* res, const ShmWait& w) {
  const std::size_t e = size_of(t), off = mine.offset * e, after = off + mine.count * e;
  const int n = g.size(), r = g.rank();
  std::byte* slot = g.input(set, r);
  copy_pieces(slot, s, off);
  copy_pieces(slot + after, s + after, len * e - after);
  g.barrier(w.deadline, w.abort, w.what);
  if (mine.count == 0) return;
  auto from = [&](int q) -> const std::byte* { return (q == r ? s : g.input(set, q)) + off; };
  reduce(t, acc, res, from(0), from(1), mine.count);
  for (int q = 2; q < n; ++q) reduce(t, acc, res, res, from(q), mine.count);
}

void broadcast_shm(ShmGroup& g, void* buf, std::size_t bytes, int root, const ShmWait& w) {
  auto* b = static_cast<std::byte*>(buf);
  // Rounds of at most 256 KiB: the root fills the next set while the others copy
  // from the last one, and two copies of a round stay in cache (2 ranks, 1-16 MiB:
  // 256 KiB rounds 1.3x faster than 1 MiB ones, bench/RESULTS.md).
  const std::size_t chunk = std::min<std::size_t>(g.slot_bytes(), 256 * 1024);
  for (std::size_t o = 0; o < bytes; o += chunk) {
    const std::size_t len = std::min(chunk, bytes - o);
    const int set = g.next_set();
    if (g.rank() == root) copy_pieces(g.result(set), b + o, len);
    g.barrier(w.deadline, w.abort, w.what);
    if (g.rank() != root) copy_pieces(b + o, g.result(set), len);
  }
}

void allgatherv_shm(ShmGroup& g, const void* in, void* out, std::span<const std::size_t> counts, std::size_t elem,
                    const ShmWait& w) {
  const int n = g.size(), r = g.rank();
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  std::size_t longest = 0, displ = 0, mine = 0;
  std::vector<std::size_t> displs(n);
  for (int q = 0; q < n; ++q) {
    displs[q] = displ;
    displ += counts[q] * elem;
    longest = std::max(longest, counts[q] * elem);
  }
  mine = counts[r] * elem;
  if (dst + displs[r] != src && mine > 0) std::memmove(dst + displs[r], src, mine);
  const std::size_t chunk = g.slot_bytes();
  for (std::size_t o = 0; o < longest; o += chunk) {
    const int set = g.next_set();
    auto piece = [&](int q) { return o < counts[q] * elem ? std::min(chunk, counts[q] * elem - o) : 0; };
    if (piece(r) > 0) copy_pieces(g.input(set, r), src + o, piece(r));
    g.barrier(w.deadline, w.abort, w.what);
    for (int q = 0; q < n; ++q)
      if (q != r) copy_pieces(dst + displs[q] + o, g.input(set, q), piece(q));
  }
}

void reduce_scatter_shm(ShmGroup& g, const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                        const ShmWait& w) {
  const std::size_t e = size_of(t);
  const int n = g.size(), r = g.rank();
  const ReduceOp acc = accumulate_op(op);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  // A round takes `per_round` elements of every block: n pieces side by side in a slot.
  const std::size_t per_round = std::max<std::size_t>(g.slot_bytes() / (e * static_cast<std::size_t>(n)), 1);
  for (std::size_t o = 0; o < count; o += per_round) {
    const std::size_t len = std::min(per_round, count - o);
    const int set = g.next_set();
    std::byte* slot = g.input(set, r);
    // Our own piece goes in too: in place, `out` is our block of `in`, so the
    // reduction must not read it after writing it.
    for (int q = 0; q < n; ++q) copy_pieces(slot + q * len * e, src + (q * count + o) * e, len * e);
    g.barrier(w.deadline, w.abort, w.what);
    auto part = [&](int q) -> const std::byte* { return g.input(set, q) + r * len * e; };
    std::byte* res = dst + o * e;
    reduce(t, acc, res, part(0), part(1), len);  // the communicator handles a world of one
    for (int q = 2; q < n; ++q) reduce(t, acc, res, res, part(q), len);
    if (op == ReduceOp::avg) finalize_avg(t, res, len, n);
  }
}

void reduce_scatterv_shm(ShmGroup& g, const void* in, void* out, std::span<const std::size_t> counts, DataType t,
                         ReduceOp op, const ShmWait& w) {
  const std::size_t e = size_of(t);
  const int n = g.size(), r = g.rank();
  const ReduceOp acc = accumulate_op(op);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  std::vector<std::size_t> displs(n);
  std::size_t longest = 0;
  for (int q = 0; q < n; ++q) {
    displs[q] = q == 0 ? 0 : displs[q - 1] + counts[q - 1];
    longest = std::max(longest, counts[q]);
  }
  const std::byte* own = src + displs[r] * e;
  const bool in_place = own == dst;  // then our piece goes through the slot too: we overwrite it
  const std::size_t per_round = std::max<std::size_t>(g.slot_bytes() / (e * static_cast<std::size_t>(n)), 1);
  for (std::size_t o = 0; o < longest; o += per_round) {
    auto len = [&](int q) { return o < counts[q] ? std::min(per_round, counts[q] - o) : 0; };
    const int set = g.next_set();
    std::byte* slot = g.input(set, r);
    for (int q = 0; q < n; ++q)
      if (q != r || in_place) copy_pieces(slot + q * per_round * e, src + (displs[q] + o) * e, len(q) * e);
    g.barrier(w.deadline, w.abort, w.what);
    if (len(r) == 0) continue;
    auto part = [&](int q) -> const std::byte* {
      return q == r && !in_place ? own + o * e : g.input(set, q) + r * per_round * e;
    };
    std::byte* res = dst + o * e;
    reduce(t, acc, res, part(0), part(1), len(r));
    for (int q = 2; q < n; ++q) reduce(t, acc, res, res, part(q), len(r));
    if (op == ReduceOp::avg) finalize_avg(t, res, len(r), n);
  }
}

void alltoall_shm(ShmGroup& g, const void* in, void* out, std::size_t block_bytes, const ShmWait& w) {
  const int n = g.size(), r = g.rank();
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  const std::size_t per_round = std::max<std::size_t>(g.slot_bytes() / static_cast<std::size_t>(n), 1);
  for (std::size_t o = 0; o < block_bytes; o += per_round) {
    const std::size_t len = std::min(per_round, block_bytes - o);
    const int set = g.next_set();
    std::byte* slot = g.input(set, r);
    // Everything goes through the slot, our own block too, so that in place works.
    for (int q = 0; q < n; ++q) copy_pieces(slot + q * len, src + q * block_bytes + o, len);
    g.barrier(w.deadline, w.abort, w.what);
    for (int q = 0; q < n; ++q) copy_pieces(dst + q * block_bytes + o, g.input(set, q) + r * len, len);
  }
}

}  // namespace elasticrun::collective
