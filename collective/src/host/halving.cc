// Algorithms in O(log n) rounds that still move only the bandwidth-optimal share of
// the data: recursive halving-doubling allreduce (Rabenseifner's), the halving
// reduce-scatter, Bruck's allgather and the scatter-allgather broadcast built on it. Across hosts they take the middle sizes, where
// the bytes on a link already cost more than the rounds (recursive doubling sends the
// whole vector log2(n) times) but a ring's 2(n-1) rounds still cost more than they save.
//
// Halving, shared by the first two: the p participants of schedule::recursive_doubling
// (ranks beyond the largest power of two fold into partners first) own p parts of the
// vector. Round by round, from the highest bit of the participant index down, a
// participant keeps the half of its current parts on its side of that bit, sends the
// other half to the partner across it, and reduces the partner's copy of the kept half
// into its own. After log2(p) rounds participant v holds part v fully reduced, and
// every part was reduced along one path, so every rank ends with the same bits.
#include "host/algorithms.h"
#include "host/reduce.h"
#include "host/schedule.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

namespace elasticrun::collective {
namespace {

using Request = Transport::Request;
using schedule::Range;

// Parts [lo, hi) as an element range of the vector.
using PartSpan = std::function<Range(std::size_t lo, std::size_t hi)>;

// The halving rounds on `data` (tags first_tag .. first_tag + rounds - 1); `tmp` holds
// at least the first round's kept half. Returns the parts this participant holds.
Range halve(Step& st, const schedule::RecursiveDoubling& plan, std::byte* data, std::byte* tmp, DataType t,
            ReduceOp op, const PartSpan& span, std::uint64_t first_tag) {
  const std::size_t elem = size_of(t);
  const int rounds = static_cast<int>(plan.partners.size());
  const int r = st.tp.rank();
  std::size_t lo = 0, hi = static_cast<std::size_t>(plan.pow2);
  for (int k = rounds - 1; k >= 0; --k) {
    int peer = plan.partners[k];
    std::size_t mid = lo + (hi - lo) / 2;
    bool upper = (plan.vrank >> k) & 1;
    Range keep = upper ? span(mid, hi) : span(lo, mid);
    Range give = upper ? span(lo, mid) : span(mid, hi);
    std::uint64_t tag = st.tag(first_tag + static_cast<std::uint64_t>(rounds - 1 - k));
    Request reqs[2] = {st.tp.irecv(peer, tag, tmp, keep.count * elem),
                       st.tp.isend(peer, tag, data + give.offset * elem, give.count * elem)};
    st.wait(reqs);
    combine(t, op, data + keep.offset * elem, tmp, keep.count, peer < r);
    (upper ? lo : hi) = mid;
  }
  return {lo, hi - lo};
}

}  // namespace

// Halving over p balanced parts, then doubling: each round swaps the parts the two
// partners hold, lowest bit first, until everyone has every part. Each participant
// sends 2(p-1)/p of the vector in 2 log2(p) messages.
void allreduce_rhd(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op) {
  const int r = st.tp.rank(), n = st.tp.size();
  const std::size_t elem = size_of(t);
  const std::size_t bytes = count * elem;
  if (in != out) std::memcpy(out, in, bytes);
  schedule::RecursiveDoubling plan = schedule::recursive_doubling(r, n);
  const int rounds = plan.rounds;
  const std::uint64_t last_tag = 2 * static_cast<std::uint64_t>(rounds) + 1;
  if (plan.folded_out) return sit_out(st, plan.fold_peer, out, bytes, out, bytes, last_tag);
  auto* data = static_cast<std::byte*>(out);
  std::byte* tmp = st.ws.tmp(std::max<std::size_t>(bytes, 1));  // a half can hold a few more than count / 2
  if (plan.fold_peer >= 0) {
    Request recv = st.tp.irecv(plan.fold_peer, st.tag(0), tmp, bytes);
    st.tp.wait(recv, st.deadline, st.what);
    combine(t, op, out, tmp, count, true);
  }
  const std::size_t p = static_cast<std::size_t>(plan.pow2);
  PartSpan span = [&](std::size_t lo, std::size_t hi) {
    std::size_t first = schedule::balanced(count, p, lo).offset;
    std::size_t end = hi == p ? count : schedule::balanced(count, p, hi).offset;
    return Range{first, end - first};
  };
  Range held = halve(st, plan, data, tmp, t, op, span, 1);
  std::size_t lo = held.offset, hi = held.offset + held.count;
  if (op == ReduceOp::avg) {
    Range mine = span(lo, hi);
    finalize_avg(t, data + mine.offset * elem, mine.count, n);
  }
  for (int k = 0; k < rounds; ++k) {  // doubling
    int peer = plan.partners[k];
    std::size_t width = hi - lo;
    bool upper = (plan.vrank >> k) & 1;
    Range mine = span(lo, hi);
    Range theirs = upper ? span(lo - width, lo) : span(hi, hi + width);
    std::uint64_t tag = st.tag(1 + static_cast<std::uint64_t>(rounds + k));
    Request reqs[2] = {st.tp.irecv(peer, tag, data + theirs.offset * elem, theirs.count * elem),
                       st.tp.isend(peer, tag, data + mine.offset * elem, mine.count * elem)};
    st.wait(reqs);
    if (upper) lo -= width;
    else hi += width;
  }
  if (plan.fold_peer >= 0) {
    Request send = st.tp.isend(plan.fold_peer, st.tag(last_tag), out, bytes);
    st.tp.wait(send, st.deadline, st.what);
  }
}

// Halving over the participants' own blocks: participant v's part is the block of its
// rank and, when it took in a folded-out partner, that partner's block too (the pair's
// ranks are consecutive, so a part is one range). The participant then hands its
// partner's block over. (n-1)/n of the input leaves each rank, in log2(p) messages
// (plus the fold).
void reduce_scatter_halving(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op) {
  const int r = st.tp.rank(), n = st.tp.size();
  const std::size_t elem = size_of(t);
  const std::size_t total = static_cast<std::size_t>(n) * count * elem;
  schedule::RecursiveDoubling plan = schedule::recursive_doubling(r, n);
  const std::uint64_t last_tag = static_cast<std::uint64_t>(plan.rounds) + 1;
  if (plan.folded_out) return sit_out(st, plan.fold_peer, in, total, out, count * elem, last_tag);
  std::byte* data = st.ws.scratch(std::max<std::size_t>(total, 1));
  std::byte* tmp = st.ws.tmp(std::max<std::size_t>(total, 1));
  std::memcpy(data, in, total);
  if (plan.fold_peer >= 0) {
    Request recv = st.tp.irecv(plan.fold_peer, st.tag(0), tmp, total);
    st.tp.wait(recv, st.deadline, st.what);
    combine(t, op, data, tmp, total / elem, true);
  }
  // Participant v's first block: v < rem took in the pair 2v, 2v+1; the rest are v + rem.
  auto first_block = [&](std::size_t v) { return v < static_cast<std::size_t>(plan.rem) ? 2 * v : v + plan.rem; };
  PartSpan span = [&](std::size_t lo, std::size_t hi) {
    return Range{first_block(lo) * count, (first_block(hi) - first_block(lo)) * count};
  };
  halve(st, plan, data, tmp, t, op, span, 1);
  std::byte* mine = data + static_cast<std::size_t>(r) * count * elem;
  if (op == ReduceOp::avg) finalize_avg(t, mine, count, n);
  std::memcpy(out, mine, count * elem);
  if (plan.fold_peer >= 0) {
    std::byte* theirs = data + static_cast<std::size_t>(plan.fold_peer) * count * elem;
    if (op == ReduceOp::avg) finalize_avg(t, theirs, count, n);
    Request send = st.tp.isend(plan.fold_peer, st.tag(last_tag), theirs, count * elem);
    st.tp.wait(send, st.deadline, st.what);
  }
}

// Bruck: in round k every rank sends the blocks it has gathered so far (at most 2^k,
// starting with its own) to rank r - 2^k and receives as many from r + 2^k, so after
// ceil(log2 n) rounds it holds the blocks of r, r+1, ..., r+n-1 in that order; one
// rotation puts them in rank order. (n-1)/n of the result arrives at each rank.
// `in` may lie inside `out`.
void allgather_bruck(Step& st, const void* in, void* out, std::size_t block, std::uint64_t first_tag) {
  const int r = st.tp.rank(), n = st.tp.size();
  std::byte* tmp = st.ws.tmp(std::max<std::size_t>(static_cast<std::size_t>(n) * block, 1));
  std::memcpy(tmp, in, block);
  std::uint64_t round = 0;
  for (int d = 1; d < n; d <<= 1, ++round) {
    std::size_t m = static_cast<std::size_t>(std::min(d, n - d));
    std::uint64_t tag = st.tag(first_tag + round);
    Request reqs[2] = {st.tp.irecv(schedule::mod(r + d, n), tag, tmp + d * block, m * block),
                       st.tp.isend(schedule::mod(r - d, n), tag, tmp, m * block)};
    st.wait(reqs);
  }
  auto* dst = static_cast<std::byte*>(out);
  const std::size_t head = static_cast<std::size_t>(n - r) * block;  // ranks r..n-1
  std::memmove(dst + r * block, tmp, head);
  std::memmove(dst, tmp + head, static_cast<std::size_t>(r) * block);
}

// Scatter, then allgather (van de Geijn): the message is cut into n blocks of
// ceil(bytes / n); a binomial tree from the root scatters them (the rank at distance v
// from the root gets block v, and passes on the blocks of its subtree), then Bruck's
// allgather gives everyone every block. The root's link carries 2(n-1)/n of the message
// in 2 log2(n) rounds, against the binomial tree's log2(n) whole copies.
void broadcast_scatter_allgather(Step& st, void* buf, std::size_t bytes, int root) {
  const int r = st.tp.rank(), n = st.tp.size();
  const int v = schedule::mod(r - root, n);
  const std::size_t block = (bytes + n - 1) / n;
  std::byte* blocks = st.ws.scratch(block * static_cast<std::size_t>(n));  // block j: bytes [j*block, ...)
  auto* data = static_cast<std::byte*>(buf);
  auto range_bytes = [&](int lo, int hi) { return static_cast<std::size_t>(hi - lo) * block; };
  if (v == 0) {
    std::memcpy(blocks, data, bytes);
    std::memset(blocks + bytes, 0, block * static_cast<std::size_t>(n) - bytes);
  }
  // The tree of schedule::binomial_*: the subtree of the rank at distance w from the
  // root holds distances [w, w + (w's lowest set bit)), so that is what reaches it.
  auto subtree = [&](int w) { return range_bytes(w, std::min(w + (w & -w), n)); };
  if (v != 0) {
    Request recv = st.tp.irecv(schedule::binomial_parent(r, n, root), st.tag(0), blocks + v * block, subtree(v));
    st.tp.wait(recv, st.deadline, st.what);
  }
  std::vector<Request> sends;
  for (int child : schedule::binomial_children(r, n, root)) {
    int w = schedule::mod(child - root, n);
    sends.push_back(st.tp.isend(child, st.tag(0), blocks + w * block, subtree(w)));
  }
  st.wait(sends);
  // Rank q holds block (q - root) mod n; gathered in rank order (in place), block j sits
  // at rank (j + root) mod n's place.
  allgather_bruck(st, blocks + v * block, blocks, block, 1);
  for (int j = 0; j < n; ++j) {
    std::size_t at = static_cast<std::size_t>(j) * block;
    if (at >= bytes) break;
    std::memcpy(data + at, blocks + static_cast<std::size_t>(schedule::mod(j + root, n)) * block,
                std::min(block, bytes - at));
  }
}

}  // namespace elasticrun::collective
