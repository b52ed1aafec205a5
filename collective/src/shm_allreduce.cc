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
    if (mine.count > 0) {
      std::size_t off = mine.offset * e;
      reduce_parts(g.result(set) + off,
                   [&](int q) -> const std::byte* { return (q == r ? s : g.input(set, q)) + off; }, mine.count);
    }
    g.barrier(w.deadline, w.abort, w.what);
    std::memcpy(dst + o * e, g.result(set), len * e);
  }
}

}  // namespace elasticrun::collective
