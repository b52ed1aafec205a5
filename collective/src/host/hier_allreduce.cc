#include "host/hier_allreduce.h"

#include "host/reduce.h"

#include <algorithm>
#include <cstring>

namespace elasticrun::collective {

void allreduce_hier(const HierAllreduce& h, const void* in, void* out, std::size_t count, DataType t,
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
      set = g.next_set();
      const schedule::Range mine = my_part(g, len);
      reduce_my_part(g, set, s, len, mine, t, acc, g.result(set) + mine.offset * e, w);
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
}

}  // namespace elasticrun::collective
