#include "host/schedule.h"

#include <gtest/gtest.h>

#include <set>

namespace elasticrun::collective::schedule {
namespace {

TEST(Schedule, BalancedCoversEverythingOnce) {
  for (std::size_t total : {0u, 1u, 7u, 100u, 1023u})
    for (std::size_t parts : {1u, 2u, 3u, 5u, 8u}) {
      std::size_t next = 0;
      for (std::size_t i = 0; i < parts; ++i) {
        Range r = balanced(total, parts, i);
        EXPECT_EQ(r.offset, next);
        EXPECT_LE(r.count, total / parts + 1);
        EXPECT_GE(r.count, total / parts);
        next += r.count;
      }
      EXPECT_EQ(next, total);
    }
}

TEST(Schedule, NumChunks) {
  EXPECT_EQ(num_chunks(0, 256), 1u);
  EXPECT_EQ(num_chunks(1, 256), 1u);
  EXPECT_EQ(num_chunks(256, 256), 1u);
  EXPECT_EQ(num_chunks(257, 256), 2u);
}

TEST(Schedule, RingSegmentGrowsWithTheBlockBetweenItsBounds) {
  constexpr std::size_t K = 1024;
  // An allreduce among 8 (14 steps): a quarter of the block, from 32 KiB to 512 KiB.
  EXPECT_EQ(ring_segment(0, 14, 32 * K, 512 * K), 32 * K);
  EXPECT_EQ(ring_segment(128 * K, 14, 32 * K, 512 * K), 32 * K);
  EXPECT_EQ(ring_segment(1024 * K, 14, 32 * K, 512 * K), 256 * K);
  EXPECT_EQ(ring_segment(1024 * K + 7, 14, 32 * K, 512 * K), 256 * K + 1);
  EXPECT_EQ(ring_segment(2048 * K, 14, 32 * K, 512 * K), 512 * K);
  EXPECT_EQ(ring_segment(64 * K * K, 14, 32 * K, 512 * K), 512 * K);  // and no more than the most
  EXPECT_EQ(num_chunks(1024 * K, ring_segment(1024 * K, 14, 32 * K, 512 * K)), kRingChunks);
  // Fewer steps, more segments a block: at least kRingPassChunks in the pass.
  EXPECT_EQ(ring_segment(1024 * K, 8, 32 * K, 512 * K), 256 * K);  // 5 ranks: 32 already
  EXPECT_EQ(ring_segment(1024 * K, 4, 32 * K, 512 * K), 128 * K);  // 3 ranks: 8 a block
  EXPECT_EQ(ring_segment(1024 * K, 2, 32 * K, 512 * K), 64 * K);   // 2 ranks' allreduce: 16
  EXPECT_EQ(ring_segment(4096 * K, 1, 32 * K, 512 * K), 128 * K);  // 2 ranks' allgather: 32
  EXPECT_EQ(ring_segment(1024 * K, 3, 32 * K, 512 * K), 1024 * K / 11);
  EXPECT_EQ(ring_segment(4096 * K, 0, 32 * K, 512 * K), 128 * K);  // no steps: as one
  for (int steps = 1; steps <= 14; ++steps)
    EXPECT_GE(steps * num_chunks(4096 * K, ring_segment(4096 * K, steps, 32 * K, 512 * K)), kRingPassChunks) << steps;
  // Fixed.
  EXPECT_EQ(ring_segment(64 * K * K, 14, 32 * K, 0), 32 * K);
  EXPECT_EQ(ring_segment(64 * K * K, 2, 32 * K, 32 * K), 32 * K);
}

// Simulates the ring allreduce on block ownership: after the reduce-scatter steps
// each block must have been combined exactly once from every rank, and after the
// allgather every rank must hold every block.
TEST(Schedule, RingAllreduceSimulation) {
  for (int n = 1; n <= 7; ++n) {
    // contrib[r][b] = set of ranks whose data rank r holds in its partial of block b.
    std::vector<std::vector<std::set<int>>> contrib(n, std::vector<std::set<int>>(n));
    for (int r = 0; r < n; ++r)
      for (int b = 0; b < n; ++b) contrib[r][b] = {r};
    for (int s = 0; s + 1 < n; ++s) {
      auto next = contrib;
      for (int r = 0; r < n; ++r) {
        int right = ring_right(r, n);
        int b = ring_rs_send_block(r, n, s);
        EXPECT_EQ(ring_rs_recv_block(right, n, s), b);
        next[right][b].insert(contrib[r][b].begin(), contrib[r][b].end());
      }
      contrib = next;
    }
    for (int r = 0; r < n; ++r) EXPECT_EQ(contrib[r][mod(r + 1, n)].size(), static_cast<std::size_t>(n));
    // Allgather: each rank starts with block r+1 complete.
    std::vector<std::set<int>> have(n);
    for (int r = 0; r < n; ++r) have[r] = {mod(r + 1, n)};
    for (int s = 0; s + 1 < n; ++s) {
      auto next = have;
      for (int r = 0; r < n; ++r) {
        int right = ring_right(r, n);
        int b = ring_ag_send_block(r, n, s, 1);
        EXPECT_TRUE(have[r].count(b)) << "n=" << n << " r=" << r << " s=" << s;
        EXPECT_EQ(ring_ag_recv_block(right, n, s, 1), b);
        next[right].insert(b);
      }
      have = next;
    }
    for (int r = 0; r < n; ++r) EXPECT_EQ(have[r].size(), static_cast<std::size_t>(n));
  }
}

TEST(Schedule, ReduceScatterShiftOwnsOwnBlock) {
  for (int n = 2; n <= 6; ++n)
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(ring_rs_recv_block(r, n, n - 2, -1), r);
      for (int s = 0; s + 2 < n; ++s) EXPECT_EQ(ring_rs_send_block(r, n, s + 1, -1), ring_rs_recv_block(r, n, s, -1));
    }
}

TEST(Schedule, RecursiveDoublingAnySize) {
  for (int n = 1; n <= 13; ++n) {
    int participants = 0;
    std::set<int> vranks;
    for (int r = 0; r < n; ++r) {
      RecursiveDoubling rd = recursive_doubling(r, n);
      EXPECT_EQ(rd.pow2 + rd.rem, n);
      EXPECT_EQ(1 << rd.rounds, rd.pow2);
      if (rd.fold_peer >= 0) {
        EXPECT_EQ(recursive_doubling(rd.fold_peer, n).fold_peer, r);
      }
      if (rd.folded_out) {
        EXPECT_TRUE(rd.partners.empty());
        continue;
      }
      ++participants;
      vranks.insert(rd.vrank);
      EXPECT_EQ(rd_real_rank(rd.vrank, rd.rem), r);
      // Partner relation is symmetric per round.
      for (std::size_t k = 0; k < rd.partners.size(); ++k) {
        RecursiveDoubling other = recursive_doubling(rd.partners[k], n);
        ASSERT_FALSE(other.folded_out);
        EXPECT_EQ(other.partners[k], r);
      }
    }
    int p = 1;
    while (p * 2 <= n) p *= 2;
    EXPECT_EQ(participants, p);
    EXPECT_EQ(static_cast<int>(vranks.size()), p);
  }
}

TEST(Schedule, BinomialTreeReachesEveryRankOnce) {
  for (int n = 1; n <= 11; ++n)
    for (int root = 0; root < n; ++root) {
      std::vector<int> parent_of(n, -2);
      for (int r = 0; r < n; ++r)
        for (int c : binomial_children(r, n, root)) {
          EXPECT_EQ(parent_of[c], -2) << "two parents";
          parent_of[c] = r;
          EXPECT_EQ(binomial_parent(c, n, root), r);
        }
      for (int r = 0; r < n; ++r) {
        if (r == root) {
          EXPECT_EQ(binomial_parent(r, n, root), -1);
          EXPECT_EQ(parent_of[r], -2);
        } else {
          EXPECT_GE(parent_of[r], 0) << "n=" << n << " root=" << root << " r=" << r;
        }
      }
    }
}

TEST(Schedule, DisseminationAndPairwise) {
  EXPECT_TRUE(dissemination(0, 1).empty());
  auto d = dissemination(1, 5);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0], (Exchange{2, 0}));
  EXPECT_EQ(d[2], (Exchange{0, 2}));
  for (int n = 2; n <= 6; ++n)
    for (int s = 1; s < n; ++s)
      for (int r = 0; r < n; ++r) EXPECT_EQ(pairwise(pairwise(r, n, s).to, n, s).from, r);
}

}  // namespace
}  // namespace elasticrun::collective::schedule
