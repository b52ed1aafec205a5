// Pure schedule math for the collective algorithms: which rank talks to whom,
// and which segment moves, at each step. No I/O, no allocation beyond results;
// tests/collective/schedule_test.cc checks it on its own.
#pragma once

#include <cstddef>
#include <vector>

namespace elasticrun::collective::schedule {

// Half-open element range.
struct Range {
  std::size_t offset = 0, count = 0;
  bool operator==(const Range&) const = default;
};

// Splits `total` into `parts` contiguous ranges whose sizes differ by at most one
// (the first total % parts get one more); returns part i.
Range balanced(std::size_t total, std::size_t parts, std::size_t i);

// Number of pipeline chunks for a block of `bytes` with segments of at most
// `segment` bytes; at least 1 so that every step has one message, even if empty.
std::size_t num_chunks(std::size_t bytes, std::size_t segment);

// The segment of a ring pass of `steps` steps over blocks of `block` bytes: the block
// in kRingChunks segments, or more where the pass has few steps, so that it moves at
// least kRingPassChunks in all; from `least` up to `most` (`least` alone where most <=
// least). Fewer, larger messages where the blocks are large, yet enough of them that
// each step's first segment goes on while the rest still cross, and that the pass's
// last segment, which nothing overlaps, is a small part of it (among 2 ranks behind
// 500 us links a quarter of the block took 1.15-1.4x the time of 32 KiB at 2-4 MiB, a
// sixteenth 0.85-1.09x at 2-16 MiB; bench/RESULTS.md, session 38).
inline constexpr std::size_t kRingChunks = 4;
inline constexpr std::size_t kRingPassChunks = 32;
std::size_t ring_segment(std::size_t block, int steps, std::size_t least, std::size_t most);

inline int mod(long a, int n) { return static_cast<int>(((a % n) + n) % n); }
inline int ring_right(int rank, int size) { return mod(rank + 1, size); }
inline int ring_left(int rank, int size) { return mod(rank - 1, size); }

// Ring reduce-scatter, step s in [0, size-1): rank r sends block (r - s + shift)
// to its right neighbour and receives block (r - s - 1 + shift) from its left one,
// reducing it into its partial. After the last step rank r holds the fully reduced
// block (r + 1 + shift). shift = 0 for allreduce; shift = -1 makes rank r own block r
// (reduce_scatter).
inline int ring_rs_send_block(int r, int size, int s, int shift = 0) { return mod(r - s + shift, size); }
inline int ring_rs_recv_block(int r, int size, int s, int shift = 0) { return mod(r - s - 1 + shift, size); }

// Ring allgather, step s in [0, size-1), when rank r starts owning block (r + own):
// it sends block (r + own - s) and receives block (r + own - s - 1). own = 1 after
// an allreduce reduce-scatter phase, 0 for a plain allgather.
inline int ring_ag_send_block(int r, int size, int s, int own = 0) { return mod(r + own - s, size); }
inline int ring_ag_recv_block(int r, int size, int s, int own = 0) { return mod(r + own - s - 1, size); }

// Recursive doubling for any size. With p the largest power of two <= size and
// rem = size - p, the first 2*rem ranks pair up: each even rank r folds its data
// into r+1 and sits out; r+1 sends the result back at the end. The remaining p
// ranks run log2(p) exchange rounds with partner = vrank ^ 2^k.
struct RecursiveDoubling {
  int pow2 = 1;           // p
  int rounds = 0;         // log2(p): the exchange rounds (none for a folded-out rank)
  int rem = 0;            // size - p
  int vrank = -1;         // rank among the p participants, -1 if folded out
  int fold_peer = -1;     // the partner of a fold pair (-1 if not in one)
  bool folded_out = false;  // true for the even rank of a fold pair
  std::vector<int> partners;  // real rank exchanged with at each round
};
RecursiveDoubling recursive_doubling(int rank, int size);
// Real rank of participant `vrank` in the scheme above.
int rd_real_rank(int vrank, int rem);

// Binomial tree broadcast rooted at `root`, ranks renumbered v = (r - root) mod size.
// A rank receives from parent (v with its lowest set bit cleared) and then sends to
// v + 2^k for each 2^k below that bit, largest first, so the farthest subtree
// starts earliest.
int binomial_parent(int rank, int size, int root);  // -1 for the root
std::vector<int> binomial_children(int rank, int size, int root);

// Dissemination barrier: round k sends to r + 2^k and receives from r - 2^k.
struct Exchange {
  int to = 0, from = 0;
  bool operator==(const Exchange&) const = default;
};
std::vector<Exchange> dissemination(int rank, int size);

// Pairwise exchange for alltoall, step s in [1, size): send to r + s, receive from r - s.
inline Exchange pairwise(int rank, int size, int s) { return {mod(rank + s, size), mod(rank - s, size)}; }

}  // namespace elasticrun::collective::schedule
