// Latency-oriented and exchange algorithms: the recursive-doubling allreduce, the direct,
// binomial and chain broadcasts, pairwise alltoall and the dissemination barrier. The ring
// family is in ring.cc, the halving and Bruck ones in halving.cc, the allreduce,
// reduce-scatter and allgather of one exchange each (direct, two-shot) in direct.cc.
#include "host/algorithms.h"
#include "host/reduce.h"
#include "host/schedule.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace elasticrun::collective {
namespace {

using Request = Transport::Request;

}  // namespace

void combine(DataType t, ReduceOp op, void* mine, const void* theirs, std::size_t n, bool peer_lower) {
  ReduceOp acc = accumulate_op(op);
  if (peer_lower) reduce(t, acc, mine, theirs, mine, n);
  else reduce(t, acc, mine, mine, theirs, n);
}

void sit_out(Step& st, int partner, const void* send, std::size_t send_bytes, void* recv, std::size_t recv_bytes,
             std::uint64_t back_tag) {
  Request out = st.tp.isend(partner, st.tag(0), send, send_bytes);
  st.tp.wait(out, st.deadline, st.what);
  Request back = st.tp.irecv(partner, st.tag(back_tag), recv, recv_bytes);
  st.tp.wait(back, st.deadline, st.what);
}

// Recursive doubling: in round k every participant swaps its whole vector with the
// rank whose index differs in bit k and reduces, so after log2(p) rounds all hold
// the full result. It costs log2(p) messages of the full size, which wins for small
// messages where latency dominates. A non-power-of-two world first folds its extra
// ranks into partners (schedule::recursive_doubling) and hands them the result at the end.
void allreduce_rd(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op) {
  int r = st.tp.rank(), n = st.tp.size();
  std::size_t bytes = count * size_of(t);
  if (in != out) std::memcpy(out, in, bytes);
  schedule::RecursiveDoubling plan = schedule::recursive_doubling(r, n);
  // The hand-back tag follows every round's (folded-out ranks count them too).
  const std::uint64_t last_tag = static_cast<std::uint64_t>(plan.rounds) + 1;
  if (plan.folded_out) return sit_out(st, plan.fold_peer, out, bytes, out, bytes, last_tag);
  std::byte* tmp = st.ws.tmp(std::max<std::size_t>(bytes, 1));
  if (plan.fold_peer >= 0) {
    Request recv = st.tp.irecv(plan.fold_peer, st.tag(0), tmp, bytes);
    st.tp.wait(recv, st.deadline, st.what);
    combine(t, op, out, tmp, count, true);
  }
  for (std::size_t k = 0; k < plan.partners.size(); ++k) {
    int peer = plan.partners[k];
    Request reqs[2] = {st.tp.irecv(peer, st.tag(k + 1), tmp, bytes), st.tp.isend(peer, st.tag(k + 1), out, bytes)};
    st.wait(reqs);
    combine(t, op, out, tmp, count, peer < r);
  }
  if (op == ReduceOp::avg) finalize_avg(t, out, count, n);
  if (plan.fold_peer >= 0) {
    Request send = st.tp.isend(plan.fold_peer, st.tag(last_tag), out, bytes);
    st.tp.wait(send, st.deadline, st.what);
  }
}

// Direct broadcast: the root sends the message to every other rank itself. One hop,
// where the binomial tree needs log2(n); the root's link carries n-1 copies.
void broadcast_direct(Step& st, void* buf, std::size_t bytes, int root) {
  const int r = st.tp.rank(), n = st.tp.size();
  if (r != root) {
    Request recv = st.tp.irecv(root, st.tag(0), buf, bytes);
    st.tp.wait(recv, st.deadline, st.what);
    return;
  }
  std::vector<Request> sends;
  for (int s = 1; s < n; ++s) sends.push_back(st.tp.isend(schedule::mod(root + s, n), st.tag(0), buf, bytes));
  st.wait(sends);
}

// Binomial tree: the data reaches 2^k ranks after k rounds, so a small message
// arrives everywhere after ceil(log2(size)) latencies.
void broadcast_binomial(Step& st, void* buf, std::size_t bytes, int root) {
  int r = st.tp.rank(), n = st.tp.size();
  int parent = schedule::binomial_parent(r, n, root);
  if (parent >= 0) {
    Request recv = st.tp.irecv(parent, st.tag(0), buf, bytes);
    st.tp.wait(recv, st.deadline, st.what);
  }
  std::vector<Request> sends;
  for (int child : schedule::binomial_children(r, n, root)) sends.push_back(st.tp.isend(child, st.tag(0), buf, bytes));
  st.wait(sends);
}

// Pipelined tree (algorithms.h): for large messages every link streams at once, and the
// time approaches the busiest link's bytes plus one segment time per hop. Receives are
// posted `window` segments ahead; a segment goes on to the children as soon as it lands.
void broadcast_pipelined(Step& st, void* buf, std::size_t bytes, int root, int fanout) {
  const int n = st.tp.size(), v = schedule::mod(st.tp.rank() - root, n);
  auto rank_of = [&](int u) { return schedule::mod(u + root, n); };
  std::vector<int> children;
  for (int k = 1; k <= fanout && fanout * v + k < n; ++k) children.push_back(rank_of(fanout * v + k));
  std::size_t nchunks = std::min(schedule::num_chunks(bytes, st.segment), std::size_t{1} << Transport::kStepBits);
  auto* base = static_cast<std::byte*>(buf);
  auto range = [&](std::size_t c) { return schedule::balanced(bytes, nchunks, c); };
  std::vector<Request> sends;
  auto forward = [&](std::size_t c) {
    for (int child : children) sends.push_back(st.tp.isend(child, st.tag(c), base + range(c).offset, range(c).count));
  };
  if (v == 0) {
    for (std::size_t c = 0; c < nchunks; ++c) forward(c);
    st.wait(sends);
    return;
  }
  const int parent = rank_of((v - 1) / fanout);
  std::size_t window = static_cast<std::size_t>(std::max(1, st.window));
  std::vector<Request> recvs(window);
  auto post = [&](std::size_t c) { recvs[c % window] = st.tp.irecv(parent, st.tag(c), base + range(c).offset, range(c).count); };
  for (std::size_t c = 0; c < std::min(window, nchunks); ++c) post(c);
  for (std::size_t c = 0; c < nchunks; ++c) {
    st.tp.wait(recvs[c % window], st.deadline, st.what);
    if (c + window < nchunks) post(c + window);
    forward(c);
  }
  st.wait(sends);
}

// Pairwise exchange: at step s rank r sends its block for r+s and receives the
// block from r-s, so every step is a perfect matching and no rank is a hotspot.
// All receives are posted first (they land in disjoint parts of `out`).
void alltoall_pairwise(Step& st, const void* in, void* out, std::size_t block_bytes) {
  int r = st.tp.rank(), n = st.tp.size();
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  std::size_t total = block_bytes * static_cast<std::size_t>(n);
  if (src == dst) {
    // In place: send from a copy so incoming blocks cannot overwrite unsent ones.
    std::byte* copy = st.ws.scratch(total);
    std::memcpy(copy, src, total);
    src = copy;
  }
  std::vector<Request> reqs;
  for (int s = 1; s < n; ++s) {
    int from = schedule::pairwise(r, n, s).from;
    reqs.push_back(st.tp.irecv(from, st.tag(0), dst + block_bytes * from, block_bytes));
  }
  for (int s = 1; s < n; ++s) {
    int to = schedule::pairwise(r, n, s).to;
    reqs.push_back(st.tp.isend(to, st.tag(0), src + block_bytes * to, block_bytes));
  }
  if (src + block_bytes * r != dst + block_bytes * r) std::memcpy(dst + block_bytes * r, src + block_bytes * r, block_bytes);
  st.wait(reqs);
}

// Dissemination: in round k each rank signals r + 2^k and waits for r - 2^k; after
// ceil(log2(size)) rounds every rank has heard, transitively, from all others.
void barrier_dissemination(Step& st) {
  int r = st.tp.rank(), n = st.tp.size();
  std::byte dummy[1];
  std::uint64_t round = 0;
  for (const schedule::Exchange& ex : schedule::dissemination(r, n)) {
    Request reqs[2] = {st.tp.irecv(ex.from, st.tag(round), dummy, 0), st.tp.isend(ex.to, st.tag(round), dummy, 0)};
    st.wait(reqs);
    ++round;
  }
}

}  // namespace elasticrun::collective
