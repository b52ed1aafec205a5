#include "host/hierarchical.h"

#include "host/reduce.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace elasticrun::collective {
namespace {

// A round of host sums: elements [offset, offset + len) of each of the blocks [first,
// first + blocks) of the input (the reduce-scatter's blocks; the allreduce's vector is
// one block).
struct SumRound {
  std::size_t first, blocks, offset, len;
};

// Whether any of r's pieces (in elements of the whole input, blocks of `count`) meets [a, a + n).
bool meets(const SumRound& r, std::size_t count, std::size_t a, std::size_t n) {
  for (std::size_t j = 0; j < r.blocks; ++j) {
    const std::size_t p = (r.first + j) * count + r.offset;
    if (p < a + n && a < p + r.len) return true;
  }
  return false;
}

// The leader's InputReady: sums rounds from `done` on, through the last that meets [a, a + n).
template <class Sum>
void sum_through(const std::vector<SumRound>& rounds, std::size_t& done, std::size_t count, std::size_t a,
                 std::size_t n, Sum&& sum_round) {
  std::size_t last = done;
  for (std::size_t k = done; k < rounds.size(); ++k)
    if (meets(rounds[k], count, a, n)) last = k + 1;
  while (done < last) sum_round(rounds[done++]);
}

}  // namespace

void allreduce_hier(const HierAllreduce& h, const void* in, void* out, std::size_t count, DataType t,
                    ReduceOp op, const ShmWait& w) {
  const std::size_t e = size_of(t);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  std::vector<SumRound> rounds;  // the host sum's, in the order they run
  if (h.host) {
    const std::size_t per = std::max<std::size_t>(h.round_bytes / e, 1);
    for (const schedule::Range& b : count <= per ? std::vector<schedule::Range>{{0, count}}
                                                 : allreduce_ring_reads(h.index, h.hosts, count))
      for (std::size_t o = 0; o < b.count; o += per) rounds.push_back({0, 1, b.offset + o, std::min(per, b.count - o)});
  } else if (src != dst) {
    copy_pieces(dst, src, count * e);
  }
  auto sum_round = [&](const SumRound& k) {
    ShmGroup& g = *h.host;
    const int set = g.next_set();
    const schedule::Range mine = my_part(g, k.len);
    reduce_my_part(g, set, src + k.offset * e, k.len, mine, t, accumulate_op(op), g.result(set) + mine.offset * e, w);
    g.barrier(w.deadline, w.abort, w.what);
    if (h.leader) copy_pieces(dst + k.offset * e, g.result(set), k.len * e);
  };
  std::size_t done = 0;
  if (h.leader && h.across)
    h.across(dst, count, [&](std::size_t a, std::size_t n) { sum_through(rounds, done, count, a, n, sum_round); });
  while (done < rounds.size()) sum_round(rounds[done++]);
  if (h.leader && op == ReduceOp::avg) finalize_avg(t, dst, count, h.world);
  if (h.host) broadcast_shm(*h.host, dst, count * e, 0, w);
}

void broadcast_hier(const HierBroadcast& h, void* buf, std::size_t bytes, const ShmWait& w) {
  // A root that is not its host's leader hands the data to its host first; a leader root
  // sends at once, and its host's ranks take the data with every other host's.
  const bool hand_first = h.host && h.root_host && h.local_root != 0;
  if (hand_first) broadcast_shm(*h.host, buf, bytes, h.local_root, w);
  if (h.leader && h.across) h.across(buf, bytes);
  if (h.host && !hand_first) broadcast_shm(*h.host, buf, bytes, 0, w);
}

void allreduce_rails(const HierRails& h, const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                     const ShmWait& w) {
  ShmGroup& g = *h.host;
  const std::size_t e = size_of(t), L = static_cast<std::size_t>(g.size());
  std::vector<std::size_t> parts(L);
  for (std::size_t j = 0; j < L; ++j) parts[j] = schedule::balanced(count, L, j).count;
  std::byte* part = static_cast<std::byte*>(out) + my_part(g, count).offset * e;
  const std::size_t mine = parts[static_cast<std::size_t>(g.rank())];
  reduce_scatterv_shm(g, in, part, parts, t, accumulate_op(op), w);
  h.across(part, mine);
  if (op == ReduceOp::avg) finalize_avg(t, part, mine, h.world);
  allgatherv_shm(g, part, out, parts, e, w);
}

void allgather_hier(const HierAllgather& h, const void* in, void* out, std::span<const std::size_t> counts,
                    std::size_t elem, const ShmWait& w) {
  const int mine = h.host ? h.host->size() : 1;
  std::size_t before = 0, total = 0;
  for (std::size_t q = 0; q < counts.size(); ++q) (q < static_cast<std::size_t>(h.first) ? before : total) += counts[q];
  total += before;
  std::byte* part = static_cast<std::byte*>(out) + before * elem;  // this host's
  if (h.host) allgatherv_shm(*h.host, in, part, counts.subspan(h.first, mine), elem, w);
  else if (counts[h.first] > 0 && in != part) std::memcpy(part, in, counts[h.first] * elem);
  if (h.leader) {
    std::vector<std::size_t> parts(h.hosts.size(), 0);
    for (std::size_t i = 0, q = 0; i < h.hosts.size(); ++i)
      for (int j = 0; j < h.hosts[i]; ++j) parts[i] += counts[q++];
    h.across(part, out, parts);
  }
  if (h.host) broadcast_shm(*h.host, out, total * elem, 0, w);
}

void reduce_scatter_hier(const HierReduceScatter& h, const void* in, void* out, std::size_t count, DataType t,
                         ReduceOp op, const ShmWait& w) {
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  std::vector<std::size_t> parts;  // each host's, in elements
  for (int ranks : h.hosts) parts.push_back(static_cast<std::size_t>(ranks) * count);
  if (!h.host) {  // alone: the leaders' reduce-scatter takes the input as it is
    h.across(src, dst, parts, nullptr);
    if (op == ReduceOp::avg) finalize_avg(t, dst, count, h.world);
    return;
  }
  const std::size_t e = size_of(t), n = static_cast<std::size_t>(h.world);
  const ReduceOp acc = accumulate_op(op);
  ShmGroup& g = *h.host;
  const int L = g.size(), r = g.rank();
  std::vector<SumRound> rounds;
  if (count > 0 && n * count * e <= h.round_bytes) {
    rounds.push_back({0, n, 0, count});
  } else {
    for (const schedule::Range& b : reduce_scatterv_ring_reads(h.index, parts)) {
      const std::size_t m = b.count / count, per = hier_rs_piece(e, static_cast<int>(m), h.round_bytes);
      for (std::size_t o = 0; o < count; o += per) rounds.push_back({b.offset / count, m, o, std::min(per, count - o)});
    }
  }
  // A round: the pieces this rank reduces, the others copy into their slots; it reads
  // its own from `in`, as it does the pieces it does not reduce into its slot.
  auto sum_round = [&](const SumRound& k) {
    const std::size_t bytes = k.len * e;
    const schedule::Range mine = schedule::balanced(k.blocks, static_cast<std::size_t>(L), static_cast<std::size_t>(r));
    const int set = g.next_set();
    auto piece = [&](std::size_t j) { return src + ((k.first + j) * count + k.offset) * e; };
    std::byte* slot = g.input(set, r);
    for (std::size_t j = 0; j < k.blocks; ++j)
      if (j < mine.offset || j >= mine.offset + mine.count) copy_pieces(slot + j * bytes, piece(j), bytes);
    g.barrier(w.deadline, w.abort, w.what);
    for (std::size_t j = mine.offset; j < mine.offset + mine.count; ++j) {
      auto from = [&](int p) -> const std::byte* { return p == r ? piece(j) : g.input(set, p) + j * bytes; };
      std::byte* res = g.result(set) + j * bytes;
      reduce(t, acc, res, from(0), from(1), k.len);
      for (int p = 2; p < L; ++p) reduce(t, acc, res, res, from(p), k.len);
    }
    g.barrier(w.deadline, w.abort, w.what);
    if (h.leader)
      for (std::size_t j = 0; j < k.blocks; ++j)
        copy_pieces(h.sums + ((k.first + j) * count + k.offset) * e, g.result(set) + j * bytes, bytes);
  };
  // Across the hosts: this host's L blocks, from the first of its ranks on.
  std::byte* ours = h.sums + static_cast<std::size_t>(h.first) * count * e;
  std::size_t done = 0;
  const InputReady ready = [&](std::size_t a, std::size_t m) { sum_through(rounds, done, count, a, m, sum_round); };
  if (h.leader) h.across(h.sums, ours, parts, &ready);
  while (done < rounds.size()) sum_round(rounds[done++]);
  // Each rank's block, through the result slots.
  const std::size_t each = std::max<std::size_t>(h.round_bytes / e / static_cast<std::size_t>(L), 1);
  for (std::size_t o = 0; o < count; o += each) {
    const std::size_t len = std::min(each, count - o), bytes = len * e;
    const int set = g.next_set();
    if (h.leader)
      for (int q = 1; q < L; ++q) copy_pieces(g.result(set) + q * bytes, ours + (q * count + o) * e, bytes);
    g.barrier(w.deadline, w.abort, w.what);
    copy_pieces(dst + o * e, h.leader ? ours + o * e : g.result(set) + static_cast<std::size_t>(r) * bytes, bytes);
  }
  if (op == ReduceOp::avg) finalize_avg(t, dst, count, h.world);
}

}  // namespace elasticrun::collective
