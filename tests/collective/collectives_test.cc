// Every collective, checked against a local reference, for world sizes 1..5, every
// allreduce algorithm (ring, recursive doubling, recursive halving-doubling, direct,
// two-shot, shared memory), the direct broadcast, allgather and reduce-scatter, several
// sizes (0, 1, odd, ~8 MiB), in place and out of place.
#include "collective_cases.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

namespace elasticrun::collective::testing {
namespace {

constexpr std::size_t kLarge = 8 * 1024 * 1024 / 4 + 3;  // ~8 MiB of f32, odd count

// The ways every collective can go: UCX (forced ring) as on one host, UCX as across
// hosts (Bruck's allgather and the halving reduce-scatter for small calls) with 4 KiB
// pipeline segments (so that a mid-size call takes many chunks per ring step), the ring
// with segments that grow with its blocks (as across hosts by default), shared
// memory, and shared memory with 4 KiB slots so that even small calls take many rounds.
struct Path {
  std::string name;
  HostCommConfig cfg;
};
// As across hosts (one rank each) with nothing forcing the segment: the rings' grows
// with their blocks, here from 1 KiB to 16 KiB, so that calls of every size take
// segments of their own (and blocks that do not divide into them).
Path grown_ring() {
  HostCommConfig grow = config(Algorithm::ring);
  grow.local_size = 1;
  grow.net_segment_bytes = 1024;
  grow.net_segment_max_bytes = 16 * 1024;
  grow.crossover = grow.net_crossover;
  return {"ucxgrow/", grow};
}
std::vector<Path> paths() {
  HostCommConfig tiny = config(Algorithm::shm);
  tiny.shm_slot_bytes = 4096;
  HostCommConfig net = config(Algorithm::ring);
  net.segment = 4096;
  net.crossover = net.net_crossover;
  return {{"ucx/", config(Algorithm::ring)}, {"ucxnet4k/", net}, grown_ring(), {"shm/", config(Algorithm::shm)},
          {"shm4k/", tiny}};
}

class Collectives : public ::testing::TestWithParam<int> {};


TEST_P(Collectives, AllreduceEveryTypeAndOp) {
  World w(GetParam());
  for (Algorithm a : {Algorithm::ring, Algorithm::rd, Algorithm::rhd, Algorithm::direct, Algorithm::twoshot, Algorithm::shm})
    run_ranks(w, config(a), name_of(a), [](int r, Communicator& c) {
      for (DataType t : kAllTypes)
        for (ReduceOp op : kAllOps)
          for (std::size_t count : {0u, 1u, 7u, 1023u})
            for (bool in_place : {false, true}) allreduce_case(c, r, t, op, count, in_place);
    });
}

TEST_P(Collectives, AllreduceSharedMemoryRounds) {
  World w(GetParam());
  HostCommConfig tiny = config(Algorithm::shm);
  tiny.shm_slot_bytes = 4096;
  tiny.shm_small_max = tiny.shm_small_max_blocking = 1024;
  run_ranks(w, tiny, "shm4k/", [](int r, Communicator& c) {
    for (DataType t : kAllTypes)
      for (ReduceOp op : kAllOps)
        for (std::size_t count : {1u, 255u, 1023u, 4097u, 30001u})
          for (bool in_place : {false, true}) allreduce_case(c, r, t, op, count, in_place);
  });
}

TEST_P(Collectives, AllreduceLarge) {
  World w(GetParam());
  for (Algorithm a : {Algorithm::ring, Algorithm::rd, Algorithm::rhd, Algorithm::direct, Algorithm::twoshot, Algorithm::shm})
    run_ranks(w, config(a), name_of(a), [](int r, Communicator& c) {
      for (bool in_place : {false, true}) allreduce_case(c, r, DataType::f32, ReduceOp::sum, kLarge, in_place);
      allreduce_case(c, r, DataType::f16, ReduceOp::avg, 300001, false);
      allreduce_case(c, r, DataType::i64, ReduceOp::max, 200003, true);
    });
}

// The ring as across hosts, its segment grown with its blocks (1 KiB to 16 KiB here):
// blocks under four segments, between, and past the most, none a multiple of another.
TEST_P(Collectives, AllreduceRingSegmentsGrowWithTheBlocks) {
  World w(GetParam());
  const Path grow = grown_ring();
  run_ranks(w, grow.cfg, "ar/" + grow.name, [](int r, Communicator& c) {
    for (std::size_t count : {std::size_t{1023}, std::size_t{7001}, std::size_t{30001}, kLarge})
      for (bool in_place : {false, true}) allreduce_case(c, r, DataType::f32, ReduceOp::sum, count, in_place);
    allreduce_case(c, r, DataType::f16, ReduceOp::avg, 20001, false);
    allreduce_case(c, r, DataType::i64, ReduceOp::max, 9001, true);
  });
}

TEST_P(Collectives, AutomaticAlgorithmMidSizes) {
  World w(GetParam());
  run_ranks(w, config(Algorithm::automatic), "auto/", [](int r, Communicator& c) {
    for (std::size_t count : {2u, 3u, 5u, 8191u, 8192u, 8193u, 70000u})
      allreduce_case(c, r, DataType::f32, ReduceOp::sum, count, count % 2 == 0);
  });
}

TEST_P(Collectives, Broadcast) {
  World w(GetParam());
  std::vector<Path> all = paths();
  all.push_back({"direct/", config(Algorithm::direct)});
  for (const Path& p : all)
    run_ranks(w, p.cfg, "bc/" + p.name, [](int r, Communicator& c) {
    // 5001 floats: the scatter-allgather across hosts (blocks that do not divide it).
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1023}, std::size_t{5001}, kLarge})
      for (int root = 0; root < c.size(); ++root) broadcast_root_case(c, r, count, root);
  });
}

// The ways an allgather or reduce-scatter can go: those of every collective, and direct.
std::vector<Path> gather_paths() {
  std::vector<Path> all = paths();
  all.push_back({"direct/", config(Algorithm::direct)});
  return all;
}

TEST_P(Collectives, AllgatherAndAllgatherv) {
  World w(GetParam());
  for (const Path& p : gather_paths())
    run_ranks(w, p.cfg, "ag/" + p.name, [](int r, Communicator& c) {
    int n = c.size();
    for (std::size_t count : {0u, 1u, 1023u, 1u << 20})
      for (bool in_place : {false, true}) allgather_case(c, r, count, in_place);
    // Uneven counts, including empty contributions.
    std::vector<std::size_t> counts(n);
    for (int q = 0; q < n; ++q) counts[q] = (q % 3 == 1) ? 0 : 1000 * q + 17;
    allgatherv_case(c, r, counts);
  });
}

TEST_P(Collectives, ReduceScatter) {
  World w(GetParam());
  for (const Path& p : gather_paths())
    run_ranks(w, p.cfg, "rs/" + p.name, [](int r, Communicator& c) {
    for (DataType t : {DataType::f32, DataType::i32, DataType::bf16})
      for (ReduceOp op : kAllOps)
        for (std::size_t count : {0u, 1u, 1023u, 200000u})
          for (bool in_place : {false, true}) reduce_scatter_case(c, r, t, op, count, in_place);
  });
}

TEST_P(Collectives, Alltoall) {
  World w(GetParam());
  for (const Path& p : paths())
    run_ranks(w, p.cfg, "a2a/" + p.name, [](int r, Communicator& c) {
    int n = c.size();
    const DataType t = DataType::u8;
    for (std::size_t count : {0u, 1u, 1023u, 1u << 20})
      for (bool in_place : {false, true}) {
        // Block j of rank q's input is input(q) at offset j*count.
        Buf in = input(t, ReduceOp::sum, r, count * n), out(in.size());
        Buf want;
        for (int q = 0; q < n; ++q) {
          Buf part = input(t, ReduceOp::sum, q, count, count * r);
          want.insert(want.end(), part.begin(), part.end());
        }
        if (in_place) {
          c.alltoall(in.data(), in.data(), count, t);
          out = in;
        } else {
          c.alltoall(in.data(), out.data(), count, t);
        }
        CHECK_SAME(out, want, 1, ctx("alltoall", r, t, ReduceOp::sum, count, in_place));
      }
  });
}

TEST_P(Collectives, Barrier) {
  World w(GetParam());
  for (const Path& p : paths()) {
    std::atomic<int> arrived{0};
    run_ranks(w, p.cfg, "bar/" + p.name, [&](int, Communicator& c) {
      for (int round = 1; round <= 20; ++round) {
        arrived.fetch_add(1);
        c.barrier();
        if (arrived.load() < round * c.size()) throw std::runtime_error("barrier released early");
        c.barrier();  // keeps the next round's increments after everyone's check
      }
    });
  }
}

// Different collectives back to back on one communicator, through the automatic
// choice with 4 KiB slots: the segment is set up by whichever call first wants it
// (here a barrier, after a small broadcast that goes by UCX), broadcasts cross the
// UCX/shared-memory threshold, and rounds of every kind follow each other, so the
// alternation of slot sets is exercised across collectives.
TEST_P(Collectives, MixedSequenceAutomatic) {
  World w(GetParam());
  HostCommConfig cfg = config(Algorithm::automatic);
  cfg.shm_slot_bytes = 4096;
  run_ranks(w, cfg, "mixed/", [](int r, Communicator& c) {
    const int n = c.size();
    const DataType t = DataType::i32;
    std::uint64_t state = 12345;  // the same sequence on every rank
    auto next = [&](std::uint64_t m) { state = state * 6364136223846793005ull + 1442695040888963407ull; return (state >> 33) % m; };
    {
      Buf want = input(t, ReduceOp::sum, 0, 3), buf = r == 0 ? want : Buf(want.size());
      c.broadcast(buf.data(), 3, t, 0);
      CHECK_SAME(buf, want, 4, ctx("broadcast", r, t, ReduceOp::sum, 3, true));
      c.barrier();
    }
    for (int step = 0; step < 120; ++step) {
      std::size_t count = next(4) == 0 ? next(20000) : next(600);
      bool in_place = next(2) == 1;
      switch (next(6)) {
        case 0:
          allreduce_case(c, r, t, ReduceOp::max, count, in_place);
          break;
        case 1: {
          int root = static_cast<int>(next(n));
          Buf want = input(t, ReduceOp::sum, root + step, count), buf = r == root ? want : Buf(want.size());
          c.broadcast(buf.data(), count, t, root);
          CHECK_SAME(buf, want, 4, ctx("broadcast", r, t, ReduceOp::sum, count, true));
          break;
        }
        case 2: {
          Buf in = input(t, ReduceOp::sum, r, count), out(in.size() * n), want;
          for (int q = 0; q < n; ++q) {
            Buf part = input(t, ReduceOp::sum, q, count);
            want.insert(want.end(), part.begin(), part.end());
          }
          c.allgather(in.data(), out.data(), count, t);
          CHECK_SAME(out, want, 4, ctx("allgather", r, t, ReduceOp::sum, count, false));
          break;
        }
        case 3: {
          Buf in = input(t, ReduceOp::sum, r, count * n), out(count * 4);
          c.reduce_scatter(in.data(), out.data(), count, t, ReduceOp::sum);
          CHECK_SAME(out, reduced(t, ReduceOp::sum, n, count, count * r), 4,
                     ctx("reduce_scatter", r, t, ReduceOp::sum, count, false));
          break;
        }
        case 4: {
          Buf in = input(t, ReduceOp::sum, r, count * n), out(in.size()), want;
          for (int q = 0; q < n; ++q) {
            Buf part = input(t, ReduceOp::sum, q, count, count * r);
            want.insert(want.end(), part.begin(), part.end());
          }
          c.alltoall(in.data(), out.data(), count, t);
          CHECK_SAME(out, want, 4, ctx("alltoall", r, t, ReduceOp::sum, count, false));
          break;
        }
        default:
          c.barrier();
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Collectives, ::testing::Values(1, 2, 3, 4, 5),
                         [](const auto& info) { return "np" + std::to_string(info.param); });

}  // namespace
}  // namespace elasticrun::collective::testing
