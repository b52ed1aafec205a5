// The ring asks for its input in the order allreduce_ring_reads and
// reduce_scatterv_ring_reads say: the hierarchical collectives sum a host's input in that
// order, as the ring asks for it (host/hierarchical.h), so that the parts the ring sends
// first are summed first. Run on UCX among threads, blocks of several chunks; a block
// asked for out of that order would make the host sum everything up to it at once.
#include "control/abort_signal.h"
#include "control/memory_store.h"
#include "host/algorithms.h"
#include "host/ucx_transport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <exception>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace elasticrun::collective {
namespace {

using schedule::Range;

// Runs fn(step) on n threads, each over its own UCX transport (4 KiB segments).
void on_ring(int n, const std::string& scope, const std::function<void(Step&)>& fn) {
  auto store = std::make_shared<MemoryStore>();
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        UcxTransport::Options o;
        o.rank = r;
        o.size = o.local_size = n;
        o.scope = scope;
        UcxTransport tp(o, store, std::make_shared<AbortSignal>());
        Workspace ws;
        Step st{tp, Clock::now() + std::chrono::seconds(60), 1, ws, 4096, 2, "ring reads"};
        fn(st);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// The blocks that `asked` (the ready calls) touch, in the order first touched.
std::vector<Range> first_touched(const std::vector<Range>& asked, const std::vector<Range>& blocks) {
  std::vector<Range> order;
  for (const Range& a : asked) {
    EXPECT_GT(a.count, 0u);
    for (const Range& b : blocks)
      if (a.offset < b.offset + b.count && b.offset < a.offset + a.count &&
          std::find(order.begin(), order.end(), b) == order.end()) {
        EXPECT_LE(a.offset + a.count, b.offset + b.count) << "a call spans two blocks";
        order.push_back(b);
      }
  }
  return order;
}

TEST(RingReads, TheAllreduceAsksInItsReadOrder) {
  for (int n : {2, 3, 5}) {
    const std::size_t count = 3001;  // 12 KiB of i32: several chunks a block
    on_ring(n, "ar" + std::to_string(n) + "/", [&](Step& st) {
      const int r = st.tp.rank();
      std::vector<std::int32_t> in(count), out(count);
      std::iota(in.begin(), in.end(), r);
      std::vector<Range> asked;
      const InputReady ready = [&](std::size_t o, std::size_t c) { asked.push_back({o, c}); };
      allreduce_ring(st, in.data(), out.data(), count, DataType::i32, ReduceOp::sum, &ready);
      const std::vector<Range> reads = allreduce_ring_reads(r, n, count);
      EXPECT_EQ(first_touched(asked, reads), reads) << "rank " << r << " of " << n;
      for (std::size_t i = 0; i < count; ++i)
        ASSERT_EQ(out[i], static_cast<std::int32_t>(n * i + n * (n - 1) / 2)) << "element " << i;
    });
  }
}

// Blocks of different sizes (a hierarchical reduce-scatter's leaders: hosts of 3, 1 and
// 2 ranks), and equal ones.
TEST(RingReads, TheReduceScatterAsksInItsReadOrder) {
  for (std::vector<std::size_t> counts : {std::vector<std::size_t>{3000, 1000, 2000},
                                          std::vector<std::size_t>{1500, 1500, 1500, 1500},
                                          std::vector<std::size_t>{7, 5000}}) {
    const int n = static_cast<int>(counts.size());
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    on_ring(n, "rs" + std::to_string(counts[0]) + "/", [&](Step& st) {
      const int r = st.tp.rank();
      std::vector<std::int32_t> in(total), out(counts[r]);
      std::iota(in.begin(), in.end(), r);
      std::vector<Range> asked;
      const InputReady ready = [&](std::size_t o, std::size_t c) { asked.push_back({o, c}); };
      reduce_scatterv_ring(st, in.data(), out.data(), counts, DataType::i32, ReduceOp::sum, &ready);
      const std::vector<Range> reads = reduce_scatterv_ring_reads(r, counts);
      EXPECT_EQ(first_touched(asked, reads), reads) << "rank " << r << " of " << n;
      std::size_t mine = std::accumulate(counts.begin(), counts.begin() + r, std::size_t{0});
      for (std::size_t i = 0; i < counts[r]; ++i)
        ASSERT_EQ(out[i], static_cast<std::int32_t>(n * (mine + i) + n * (n - 1) / 2)) << "element " << i;
    });
  }
}

}  // namespace
}  // namespace elasticrun::collective
