#include "hier_allreduce.h"

#include "reduce.h"
#include "schedule.h"

#include <algorithm>
#include <cstring>

namespace elasticrun::collective {

std::size_t allreduce_hier(const HierAllreduce& h, const void* in, void* out, std::size_t count, DataType t,
                           ReduceOp op, const ShmWait& w) {
  const std::size_t e = size_of(t);
  const ReduceOp acc = accumulate_op(op);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  const std::size_t per_round = std::max<std::size_t>(h.round_bytes / e, 1);
  std::size_t round = 0;
  for (std::size_t o = 0; o < count; o += per_round, ++round) {
    const std::size_t len = std::min(per_round, count - o);
    const std::byte* s = src + o * e;
    std::byte* d = dst + o * e;
    std::byte* sum = d;  // where the host's sum of this round is, for the leader
    int set = 0;
    if (h.host) {
      ShmGroup& g = *h.host;
      const int n = g.size(), r = g.rank();
      set = g.next_set();
      const schedule::Range mine = schedule::balanced(len, static_cast<std::size_t>(n), static_cast<std::size_t>(r));
      const std::size_t off = mine.offset * e, part = mine.count * e, after = off + part;
      std::byte* slot = g.input(set, r);
      copy_pieces(slot, s, off);
      copy_pieces(slot + after, s + after, len * e - after);
      g.barrier(w.deadline, w.abort, w.what);
      if (part > 0) {
        auto from = [&](int q) -> const std::byte* { return (q == r ? s : g.input(set, q)) + off; };
        std::byte* res = g.result(set) + off;
        reduce(t, acc, res, from(0), from(1), mine.count);
        for (int q = 2; q < n; ++q) reduce(t, acc, res, res, from(q), mine.count);
      }
      g.barrier(w.deadline, w.abort, w.what);
      sum = g.result(set);
    } else if (s != d) {
      copy_pieces(d, s, len * e);
    }
    if (h.leader) {
      if (h.across) h.across(round, sum, len);
      if (op == ReduceOp::avg) finalize_avg(t, sum, len, h.world);
    }
    if (h.host) {
      h.host->barrier(w.deadline, w.abort, w.what);
      copy_pieces(d, h.host->result(set), len * e);
    }
  }
  return round;
}

}  // namespace elasticrun::collective
