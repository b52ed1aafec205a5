#include "shm_allreduce.h"

#include "reduce.h"
#include "schedule.h"

#include <algorithm>
#include <cstring>

namespace elasticrun::collective {

void allreduce_shm(ShmGroup& g, const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                   std::size_t small_max, const ShmWait& w) {
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

  if (bytes <= std::min(small_max, g.slot_bytes())) {
    int set = g.next_set();
    std::memcpy(g.input(set, r), src, bytes);
    g.barrier(w.deadline, w.abort, w.what);
    reduce_parts(dst, [&](int q) -> const std::byte* { return g.input(set, q); }, count);
    return;
  }

  const std::size_t per_round = std::max<std::size_t>(g.slot_bytes() / e, 1);
  for (std::size_t o = 0; o < count; o += per_round) {
    const std::size_t len = std::min(per_round, count - o);
    const int set = g.next_set();
    const schedule::Range mine = schedule::balanced(len, static_cast<std::size_t>(n), static_cast<std::size_t>(r));
    const std::byte* s = src + o * e;
    std::byte* slot = g.input(set, r);
    // Every part but our own: that one we read from `in` while reducing.
    std::size_t after = (mine.offset + mine.count) * e;
    std::memcpy(slot, s, mine.offset * e);
    std::memcpy(slot + after, s + after, len * e - after);
    g.barrier(w.deadline, w.abort, w.what);
    // Our part is reduced straight into `out` and copied to the result slot for the
    // others while it is still in cache. In place, the passes after the first would
    // read our input after the first pass overwrote it, so reduce into the slot.
    std::byte* d = dst + o * e;
    std::size_t off = mine.offset * e, part = mine.count * e;
    if (part > 0) {
      std::byte* res = g.result(set) + off;
      std::byte* first = src == dst ? res : d + off;
      reduce_parts(first, [&](int q) -> const std::byte* { return (q == r ? s : g.input(set, q)) + off; },
                   mine.count);
      std::memcpy(first == res ? d + off : res, first, part);
    }
    g.barrier(w.deadline, w.abort, w.what);
    std::memcpy(d, g.result(set), off);
    std::memcpy(d + off + part, g.result(set) + off + part, len * e - off - part);
  }
}

}  // namespace elasticrun::collective
