// Ring algorithms: allreduce (reduce-scatter then allgather), reduce_scatter and
// allgather(v), all driven by one pipelined loop.
//
// The data is split into `size` blocks, and each block into the same number of
// chunks of at most one segment. A ring pass is a stream of (step, chunk) pairs in
// order; each rank receives the stream from its left neighbour and sends one to its
// right. The key property: the block a rank sends at step t+1 is exactly the block
// it received at step t, so chunk c can be forwarded as soon as it has been received
// (and, in the reduce-scatter steps, reduced). Receives are posted `window` entries
// ahead into a ring of temporary slots (reduce-scatter) or straight into the output
// (allgather), so the next chunk is already arriving while the current one is being
// reduced, and a rank never copies data that it only forwards.
#include "host/algorithms.h"
#include "host/reduce.h"
#include "host/schedule.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace elasticrun::collective {
namespace {

using schedule::Range;

struct RingJob {
  int rs_steps = 0, ag_steps = 0;
  int shift = 0, own = 0;             // see schedule.h ring_rs_* / ring_ag_*
  std::vector<Range> blocks;          // in elements, into the full layout
  std::size_t elem = 1;
  DataType type = DataType::u8;
  ReduceOp op = ReduceOp::sum;
  const std::byte* in = nullptr;        // full layout: this rank's contribution
  const std::byte* first_src = nullptr; // start of the block sent at step 0
  std::byte* work = nullptr;            // full layout: partials and gathered blocks
  std::byte* final_out = nullptr;       // if set, the last reduce-scatter step lands here
  const InputReady* ready = nullptr;    // if set, asked before `in` is read (algorithms.h)
};

class RingRunner {
 public:
  RingRunner(Step& st, const RingJob& job) : st_(st), job_(job) {
    rank_ = st.tp.rank();
    size_ = st.tp.size();
    left_ = schedule::ring_left(rank_, size_);
    right_ = schedule::ring_right(rank_, size_);
    std::size_t max_block = 0;
    for (const Range& b : job.blocks) max_block = std::max(max_block, b.count);
    steps_ = job.rs_steps + job.ag_steps;
    const std::size_t block = max_block * job.elem;  // the same on every rank: the layout's
    nchunks_ = schedule::num_chunks(block, schedule::ring_segment(block, steps_, st.segment, st.segment_max));
    // Keep every (step, chunk) index inside the tag's step field.
    std::size_t limit = (std::size_t{1} << Transport::kStepBits) / std::max(1, steps_);
    nchunks_ = std::min(nchunks_, limit);
    slot_bytes_ = (max_block + nchunks_ - 1) / nchunks_ * job.elem;
    window_ = static_cast<std::size_t>(std::max(1, st.window));
    if (job.rs_steps > 0) tmp_ = st.ws.tmp(slot_bytes_ * window_);
  }

  void run() {
    if (steps_ == 0) return;  // a world of one has nothing to move
    std::size_t total = static_cast<std::size_t>(steps_) * nchunks_;
    recvs_.assign(window_, {});
    sends_.reserve(total);
    for (std::size_t i = 0; i < std::min(window_, total); ++i) post_recv(i);
    int b0 = send_block(0);
    for (std::size_t c = 0; c < nchunks_; ++c) {
      Range ch = chunk(b0, c);
      if (job_.ready) (*job_.ready)(ch.offset, ch.count);
      const std::byte* src = job_.first_src + (ch.offset - job_.blocks[b0].offset) * job_.elem;
      sends_.push_back(st_.tp.isend(right_, st_.tag(c), src, ch.count * job_.elem));
    }
    for (std::size_t i = 0; i < total; ++i) {
      st_.tp.wait(recvs_[i % window_], st_.deadline, st_.what);
      process(i);
      if (i + window_ < total) post_recv(i + window_);
    }
    st_.wait(sends_);
  }

 private:
  int recv_block(int t) const {
    return t < job_.rs_steps ? schedule::ring_rs_recv_block(rank_, size_, t, job_.shift)
                             : schedule::ring_ag_recv_block(rank_, size_, t - job_.rs_steps, job_.own);
  }
  int send_block(int t) const {
    return t < job_.rs_steps ? schedule::ring_rs_send_block(rank_, size_, t, job_.shift)
                             : schedule::ring_ag_send_block(rank_, size_, t - job_.rs_steps, job_.own);
  }
  // Chunk c of block b, in elements of the full layout.
  Range chunk(int b, std::size_t c) const {
    Range blk = job_.blocks[b];
    Range part = schedule::balanced(blk.count, nchunks_, c);
    return {blk.offset + part.offset, part.count};
  }
  std::byte* slot(std::size_t i) const { return tmp_ + (i % window_) * slot_bytes_; }

  void post_recv(std::size_t i) {
    int t = static_cast<int>(i / nchunks_);
    Range ch = chunk(recv_block(t), i % nchunks_);
    std::byte* buf = t < job_.rs_steps ? slot(i) : job_.work + ch.offset * job_.elem;
    recvs_[i % window_] = st_.tp.irecv(left_, st_.tag(i), buf, ch.count * job_.elem);
  }

  // Reduces (or just accepts) received entry i, then forwards it at the next step.
  void process(std::size_t i) {
    int t = static_cast<int>(i / nchunks_);
    std::size_t c = i % nchunks_;
    int b = recv_block(t);
    Range ch = chunk(b, c);
    std::byte* dst = job_.work + ch.offset * job_.elem;
    if (t < job_.rs_steps) {
      bool last = t == job_.rs_steps - 1;
      if (last && job_.final_out) dst = job_.final_out + (ch.offset - job_.blocks[b].offset) * job_.elem;
      if (job_.ready) (*job_.ready)(ch.offset, ch.count);
      reduce(job_.type, accumulate_op(job_.op), dst, job_.in + ch.offset * job_.elem, slot(i), ch.count);
      if (last && job_.op == ReduceOp::avg) finalize_avg(job_.type, dst, ch.count, size_);
    }
    if (t + 1 < steps_)
      sends_.push_back(st_.tp.isend(right_, st_.tag((t + 1) * nchunks_ + c), dst, ch.count * job_.elem));
  }

  Step& st_;
  const RingJob& job_;
  int rank_ = 0, size_ = 1, left_ = 0, right_ = 0, steps_ = 0;
  std::size_t nchunks_ = 1, slot_bytes_ = 0, window_ = 1;
  std::byte* tmp_ = nullptr;
  std::vector<Transport::Request> recvs_, sends_;
};

}  // namespace

void allreduce_ring(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                    const InputReady* ready) {
  int n = st.tp.size(), r = st.tp.rank();
  RingJob job;
  job.ready = ready;
  job.rs_steps = job.ag_steps = n - 1;
  job.own = 1;
  job.elem = size_of(t);
  job.type = t;
  job.op = op;
  for (int b = 0; b < n; ++b) job.blocks.push_back(schedule::balanced(count, n, b));
  job.in = static_cast<const std::byte*>(in);
  job.first_src = job.in + job.blocks[r].offset * job.elem;
  job.work = static_cast<std::byte*>(out);
  RingRunner(st, job).run();
}

// Step 0 sends block r, and reduce-scatter step s reduces into block r-s-1.
std::vector<Range> allreduce_ring_reads(int rank, int size, std::size_t count) {
  std::vector<Range> order;
  for (int s = 0; s < size; ++s) order.push_back(schedule::balanced(count, size, schedule::mod(rank - s, size)));
  return order;
}

// Step 0 sends block r-1, and step s reduces into block r-s-2.
std::vector<Range> reduce_scatterv_ring_reads(int rank, std::span<const std::size_t> counts) {
  const int n = static_cast<int>(counts.size());
  std::vector<std::size_t> offset(counts.size() + 1, 0);
  for (std::size_t q = 0; q < counts.size(); ++q) offset[q + 1] = offset[q] + counts[q];
  std::vector<Range> order;
  for (int s = 0; s < n; ++s) {
    const int b = schedule::mod(rank - 1 - s, n);
    order.push_back({offset[b], counts[b]});
  }
  return order;
}

std::vector<Range> reduce_scatter_ring_reads(int rank, int size, std::size_t count) {
  return reduce_scatterv_ring_reads(rank, std::vector<std::size_t>(size, count));
}

void reduce_scatterv_ring(Step& st, const void* in, void* out, std::span<const std::size_t> counts, DataType t,
                          ReduceOp op, const InputReady* ready) {
  int n = st.tp.size(), r = st.tp.rank();
  RingJob job;
  job.ready = ready;
  job.rs_steps = n - 1;
  job.shift = -1;  // rank r ends up owning block r
  job.elem = size_of(t);
  job.type = t;
  job.op = op;
  std::size_t total = 0;
  for (std::size_t c : counts) {
    job.blocks.push_back({total, c});
    total += c;
  }
  job.in = static_cast<const std::byte*>(in);
  job.first_src = job.in + job.blocks[schedule::ring_left(r, n)].offset * job.elem;
  // Partials live in scratch until forwarded; only the final block reaches `out`.
  job.work = st.ws.scratch(total * job.elem);
  job.final_out = static_cast<std::byte*>(out);
  RingRunner(st, job).run();
}

void reduce_scatter_ring(Step& st, const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                         const InputReady* ready) {
  reduce_scatterv_ring(st, in, out, std::vector<std::size_t>(st.tp.size(), count), t, op, ready);
}

void allgatherv_ring(Step& st, const void* in, void* out, std::span<const std::size_t> counts, std::size_t elem) {
  int n = st.tp.size(), r = st.tp.rank();
  RingJob job;
  job.ag_steps = n - 1;
  job.elem = elem;
  std::size_t off = 0;
  for (std::size_t c : counts) {
    job.blocks.push_back({off, c});
    off += c;
  }
  job.first_src = static_cast<const std::byte*>(in);  // step 0 sends our block straight from the input
  job.work = static_cast<std::byte*>(out);
  std::byte* mine = job.work + job.blocks[r].offset * elem;
  if (mine != job.first_src && counts[r] > 0) std::memcpy(mine, in, counts[r] * elem);
  RingRunner(st, job).run();
}

}  // namespace elasticrun::collective
