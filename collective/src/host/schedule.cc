#include "host/schedule.h"

#include <algorithm>

namespace elasticrun::collective::schedule {

Range balanced(std::size_t total, std::size_t parts, std::size_t i) {
  std::size_t base = total / parts, extra = total % parts;
  std::size_t offset = i * base + (i < extra ? i : extra);
  return {offset, base + (i < extra ? 1 : 0)};
}

std::size_t num_chunks(std::size_t bytes, std::size_t segment) {
  if (bytes == 0 || segment == 0) return 1;
  return (bytes + segment - 1) / segment;
}

std::size_t ring_segment(std::size_t block, int steps, std::size_t least, std::size_t most) {
  if (most <= least) return least;
  const std::size_t s = static_cast<std::size_t>(std::max(1, steps));
  return std::clamp(block / std::max(kRingChunks, (kRingPassChunks + s - 1) / s), least, most);
}

RecursiveDoubling recursive_doubling(int rank, int size) {
  RecursiveDoubling rd;
  while (rd.pow2 * 2 <= size) {
    rd.pow2 *= 2;
    ++rd.rounds;
  }
  rd.rem = size - rd.pow2;
  if (rank < 2 * rd.rem) {
    rd.fold_peer = rank % 2 == 0 ? rank + 1 : rank - 1;
    rd.folded_out = rank % 2 == 0;
    rd.vrank = rd.folded_out ? -1 : rank / 2;
  } else {
    rd.vrank = rank - rd.rem;
  }
  if (rd.folded_out) return rd;
  for (int mask = 1; mask < rd.pow2; mask <<= 1) rd.partners.push_back(rd_real_rank(rd.vrank ^ mask, rd.rem));
  return rd;
}

int rd_real_rank(int vrank, int rem) { return vrank < rem ? vrank * 2 + 1 : vrank + rem; }

int binomial_parent(int rank, int size, int root) {
  int v = mod(rank - root, size);
  if (v == 0) return -1;
  return mod((v & (v - 1)) + root, size);
}

std::vector<int> binomial_children(int rank, int size, int root) {
  int v = mod(rank - root, size);
  // The children sit at v + 2^k for every 2^k below v's lowest set bit (all bits
  // for the root), as long as they exist.
  int limit = 1;
  while (limit < size) limit <<= 1;
  int low = v == 0 ? limit : (v & -v);
  std::vector<int> children;
  for (int m = low >> 1; m > 0; m >>= 1)
    if (v + m < size) children.push_back(mod(v + m + root, size));
  return children;
}

std::vector<Exchange> dissemination(int rank, int size) {
  std::vector<Exchange> rounds;
  for (int d = 1; d < size; d <<= 1) rounds.push_back({mod(rank + d, size), mod(rank - d, size)});
  return rounds;
}

}  // namespace elasticrun::collective::schedule
