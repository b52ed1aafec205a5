// The hierarchical collectives, on ranks laid out as on several "hosts" (each rank a
// thread, each "host" a shared-memory group among them): the allreduce in the leaders'
// form and in rails, the allgather, the broadcast and the reduce-scatter, on even and
// uneven hosts, forced and automatic, and their refusals.
#include "collective_cases.h"

#include "host/tuner.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace elasticrun::collective::testing {
namespace {

constexpr std::size_t kLarge = 8 * 1024 * 1024 / 4 + 3;  // ~8 MiB of f32, odd count

// Ranks on several "hosts" (local_size/local_rank as the rendezvous assigns them:
// hosts in order, each host's ranks consecutive), allreduce hierarchical: shared
// memory within a host, UCX among the hosts' first ranks. 4 KiB rounds so that
// mid-size vectors take several; uneven hosts and a host of one rank included.
HostCommConfig on_hosts(const std::vector<int>& hosts, int rank, Algorithm a) {
  HostCommConfig c = config(a);
  c.shm_slot_bytes = 4096;
  c.progress = Progress::block;  // every "host" shares this machine's cores
  for (int base = 0, h = 0; h < static_cast<int>(hosts.size()); base += hosts[h++])
    if (rank < base + hosts[h]) {
      c.local_size = hosts[h];
      c.local_rank = rank - base;
      break;
    }
  return c;
}

// The ranks of `hosts`, and the suffix naming them ("-3-1-2") in a run's store scope.
int ranks_of(const std::vector<int>& hosts) {
  int n = 0;
  for (int h : hosts) n += h;
  return n;
}
std::string layout_suffix(const std::vector<int>& hosts) {
  std::string s;
  for (int h : hosts) s.append(1, '-').append(std::to_string(h));
  return s;
}
// A run's name: `what`, the algorithm's and the layout's ("ag-hier/-3-1-2").
std::string run_name(const char* what, Algorithm a, const std::vector<int>& hosts) {
  return what + std::string(name_of(a)) + layout_suffix(hosts);
}

TEST(Hierarchical, AllreduceEveryTypeAndOpOnUnevenHosts) {
  for (std::vector<int> hosts : {std::vector{2, 2}, std::vector{2, 1}, std::vector{1, 3}, std::vector{3, 1, 2}}) {
    const int n = ranks_of(hosts);
    World w(n);
    std::string name = "hier";
    name += layout_suffix(hosts);
    run_ranks(w, [&](int r) { return on_hosts(hosts, r, Algorithm::hier); }, name + "/", [](int r, Communicator& c) {
      for (DataType t : kAllTypes)
        for (ReduceOp op : kAllOps)
          for (std::size_t count : {0u, 1u, 1023u, 5000u})
            for (bool in_place : {false, true}) allreduce_case(c, r, t, op, count, in_place);
      allreduce_case(c, r, DataType::f32, ReduceOp::sum, kLarge, false);
      c.barrier();  // UCX collectives after hierarchical ones still line up
      allreduce_case(c, r, DataType::i64, ReduceOp::max, 300001, true);
    });
  }
}

// The allreduce in rails (every host's j-th ranks allreduce the j-th part of the host
// sums), forced, on hosts of equal size: every type and op, vectors shorter than a host's
// ranks (empty parts), odd ones (parts that differ by one), in place, and in many 4 KiB
// rounds; and automatic above rails_above_bytes, beside the leaders' form below it.
TEST(Hierarchical, AllreduceInRailsOnEvenHosts) {
  for (std::vector<int> hosts : {std::vector{2, 2}, std::vector{3, 3}, std::vector{2, 2, 2}}) {
    const int n = ranks_of(hosts);
    World w(n);
    std::string name = "rails";
    name += layout_suffix(hosts);
    run_ranks(w, [&](int r) { return on_hosts(hosts, r, Algorithm::rails); }, name + "/", [](int r, Communicator& c) {
      for (DataType t : kAllTypes)
        for (ReduceOp op : kAllOps)
          for (std::size_t count : {0u, 1u, 2u, 1023u, 5000u})
            for (bool in_place : {false, true}) allreduce_case(c, r, t, op, count, in_place);
      for (bool in_place : {false, true}) allreduce_case(c, r, DataType::f32, ReduceOp::avg, kLarge, in_place);
      c.barrier();  // UCX collectives after the rails still line up
      allreduce_case(c, r, DataType::i64, ReduceOp::max, 300001, true);
    });
    World a(n);
    run_ranks(a, [&](int r) {
      HostCommConfig c = on_hosts(hosts, r, Algorithm::automatic);
      c.rails_above_bytes = 16 * 1024;
      return c;
    }, name + "-auto/", [](int r, Communicator& c) {
      for (std::size_t count : {1000u, 5000u, 1000u, 70001u})  // 4 KB leaders, 20 KB rails, ..., 280 KB rails
        for (bool in_place : {false, true}) allreduce_case(c, r, DataType::f32, ReduceOp::sum, count, in_place);
    });
  }
}

// The hierarchical allgather (each host's ranks through shared memory, one rank per host
// over UCX), forced and automatic, on even and uneven hosts: equal blocks in place and
// not, and unequal ones with empty contributions. A world of one has nothing to gather
// from, forced or not.
TEST(Hierarchical, AllgatherOnUnevenHosts) {
  for (std::vector<int> hosts :
       {std::vector{2, 2}, std::vector{2, 1}, std::vector{1, 3}, std::vector{3, 1, 2}, std::vector{1}})
    for (Algorithm a : {Algorithm::hier, Algorithm::automatic}) {
      const int n = ranks_of(hosts);
      World w(n);
      const std::string name = run_name("ag-", a, hosts);
      run_ranks(w, [&](int r) { return on_hosts(hosts, r, a); }, name + "/", [](int r, Communicator& c) {
        for (std::size_t count : {0u, 1u, 1023u, 5000u})
          for (bool in_place : {false, true}) allgather_case(c, r, count, in_place);
        std::vector<std::size_t> counts(c.size());
        for (int q = 0; q < c.size(); ++q) counts[q] = (q % 3 == 1) ? 0 : 700 * q + 5;
        allgatherv_case(c, r, counts);
        c.barrier();  // UCX collectives after hierarchical ones still line up
        allreduce_case(c, r, DataType::f32, ReduceOp::sum, 200000, false);  // hierarchical too (auto)
      });
      // Automatic went hierarchical too: the first host of several ranks made its segment.
      int base = 0;
      std::size_t i = 0;
      for (; i < hosts.size() && hosts[i] == 1; ++i) base += hosts[i];
      if (i < hosts.size()) {
        EXPECT_NO_THROW(w.store->get(name + "/hier/" + std::to_string(base),
                                     Clock::now() + std::chrono::milliseconds(10))) << name;
      }
    }
}

// The hierarchical broadcast (the root's host through shared memory, the leaders over UCX
// from the root's host, the other hosts through shared memory), forced and automatic, from
// every root (a leader, a host's later rank, a rank alone on its host), empty, small, and
// in many 4 KiB rounds. Automatic went hierarchical: the first host of several ranks made
// its segment (no other collective ran).
TEST(Hierarchical, BroadcastFromEveryRootOnUnevenHosts) {
  for (std::vector<int> hosts : {std::vector{2, 2}, std::vector{2, 1}, std::vector{1, 3}, std::vector{3, 1, 2}})
    for (Algorithm a : {Algorithm::hier, Algorithm::automatic}) {
      const int n = ranks_of(hosts);
      World w(n);
      const std::string name = run_name("bc-", a, hosts);
      run_ranks(w, [&](int r) { return on_hosts(hosts, r, a); }, name + "/", [](int r, Communicator& c) {
        for (std::size_t count : {0u, 1u, 1023u, 70001u})
          for (int root = 0; root < c.size(); ++root) broadcast_root_case(c, r, count, root);
      });
      const int base = hosts[0] > 1 ? 0 : 1;  // every layout here has a host of several ranks first or second
      EXPECT_NO_THROW(w.store->get(name + "/hier/" + std::to_string(base), Clock::now() + std::chrono::milliseconds(10)))
          << name;
    }
}

// The hierarchical reduce-scatter (each host's ranks reduce through shared memory, one rank
// per host reduce-scatters the host sums over UCX), forced and automatic, every type and
// op, in rounds (4 KiB slots) and in place, on hosts of equal size and of different sizes
// (the leaders' blocks then differ: a host of 3 ranks takes 3 blocks, a host of 1 one),
// hosts of one rank included (their leader's input goes to the leaders as it is).
TEST(Hierarchical, ReduceScatterOnUnevenHosts) {
  for (std::vector<int> hosts : {std::vector{2, 2}, std::vector{3, 3}, std::vector{2, 2, 2}, std::vector{3, 1, 2},
                                 std::vector{1, 3}, std::vector{2, 1}})
    for (Algorithm a : {Algorithm::hier, Algorithm::automatic}) {
      const int n = ranks_of(hosts);
      World w(n);
      const std::string name = run_name("rs-", a, hosts);
      run_ranks(w, [&](int r) { return on_hosts(hosts, r, a); }, name + "/", [&](int r, Communicator& c) {
        for (DataType t : kAllTypes)
          for (ReduceOp op : kAllOps)
            for (std::size_t count : {1u, 255u, 1023u})
              for (bool in_place : {false, true}) reduce_scatter_case(c, r, t, op, count, in_place);
        reduce_scatter_case(c, r, DataType::f32, ReduceOp::avg, 70001, false);
        c.barrier();  // UCX collectives after hierarchical ones still line up
        allreduce_case(c, r, DataType::i64, ReduceOp::max, 5000, true);
      });
    }
}

// Automatic takes the hierarchical reduce-scatter on even and uneven hosts alike: the
// leaders' tuner measures among the 3 hosts' leaders (halving, the ring and direct on even
// hosts; direct and the ring where the hosts' blocks differ, a class of its own), where
// the flat one would measure among all 6 ranks.
TEST(Hierarchical, AutomaticReduceScatterOnAnyHosts) {
  for (std::vector<int> hosts : {std::vector{2, 2, 2}, std::vector{3, 1, 2}}) {
    World w(6);
    std::vector<std::string> heard;
    std::mutex mu;
    std::string name = "rs-tuned";
    name += layout_suffix(hosts);
    run_ranks(w, [&](int r) {
      HostCommConfig c = on_hosts(hosts, r, Algorithm::automatic);
      c.tune = true;
      if (r == 0) c.on_tuned = [&](const std::string& text) {
        std::lock_guard lock(mu);
        heard.push_back(text);
      };
      return c;
    }, name + "/", [](int r, Communicator& c) {
      for (int call = 0; call < Tuner::most_calls(Tuner::kMaxCandidates) + 2; ++call)
        reduce_scatter_case(c, r, DataType::f32, ReduceOp::sum, 1000, call % 2);
    });
    ASSERT_FALSE(heard.empty()) << name;
    const bool even = hosts[1] == 2;
    for (const std::string& h : heard) {
      EXPECT_EQ(h.rfind(even ? "reduce_scatter of " : "reduce_scatterv of ", 0), 0u) << h;
      EXPECT_NE(h.find(" over 3 ranks"), std::string::npos) << name << ": " << h;
      EXPECT_EQ(h.find("halving") == std::string::npos, !even) << name << ": " << h;
    }
  }
}

// A rank that never comes is named by its job rank, not by its place in its host's
// group: on hosts {2, 2}, rank 2 waits for rank 3 (its group's second).
TEST(Hierarchical, ASharedMemoryTimeoutNamesTheJobRank) {
  World w(4);
  std::string said;
  run_ranks(w, [&](int r) {
    HostCommConfig c = on_hosts({2, 2}, r, Algorithm::hier);
    c.timeout = std::chrono::seconds(2);
    return c;
  }, "hier-timeout/", [&](int r, Communicator& c) {
    int y = r;
    c.allreduce(&y, &y, 1, DataType::i32, ReduceOp::sum);  // every rank: the groups are made
    if (r == 3) {
      std::this_thread::sleep_for(std::chrono::seconds(3));  // never takes part, until the others gave up
      return;
    }
    int x = r;
    try {
      c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum);
    } catch (const Error& e) {
      if (r == 2) said = e.what();
    }
  });
  EXPECT_NE(said.find("timed out waiting for rank 3 (shared memory)"), std::string::npos) << said;
}

// Automatic: hierarchical up to hier_max_bytes where hosts hold several ranks (the
// host's shared segment is made: its key is in the store), the flat algorithms above
// it, and where every host runs one rank no hierarchy and no error.
TEST(Hierarchical, AutomaticUpToItsLimitWhereHostsHoldSeveralRanks) {
  for (std::vector<int> hosts : {std::vector{2, 2}, std::vector{3, 1, 2}, std::vector{1, 1, 1}}) {
    const int n = ranks_of(hosts);
    World w(n);
    std::string name = "auto";
    name += layout_suffix(hosts);
    run_ranks(w, [&](int r) {
      HostCommConfig c = on_hosts(hosts, r, Algorithm::automatic);
      c.hier_max_bytes = 64 * 1024;
      return c;
    }, name + "/", [](int r, Communicator& c) {
      allreduce_case(c, r, DataType::f32, ReduceOp::sum, 1023, false);   // 4 KiB: hierarchical
      allreduce_case(c, r, DataType::f32, ReduceOp::sum, 100000, false); // 400 KB: the ring
      allreduce_case(c, r, DataType::i64, ReduceOp::max, 5000, true);    // 40 KB: hierarchical again (1-1-1: rhd)
      c.barrier();
    });
    bool hierarchical = false;
    try {
      w.store->get(name + "/hier/0", Clock::now() + std::chrono::milliseconds(10));
      hierarchical = true;
    } catch (const TimeoutError&) {
    }
    EXPECT_EQ(hierarchical, hosts.size() != 3 || hosts[0] != 1) << name;
  }
}

// A rail's part is tuned in the class of the bytes its host's link carries: on hosts of
// 2 ranks an allreduce of 160 KB gives each rail 80 KB, in the ring's class (above the
// halving-doubling's 128 KiB over 2) among the 3 hosts' ranks of its local rank.
TEST(Hierarchical, ARailsPartIsTunedByItsHostsBytes) {
  const std::vector<int> hosts{2, 2, 2};
  World w(6);
  std::vector<std::string> heard;
  std::mutex mu;
  run_ranks(w, [&](int r) {
    HostCommConfig c = on_hosts(hosts, r, Algorithm::rails);
    c.tune = true;
    if (r == 1) c.on_tuned = [&](const std::string& text) {
      std::lock_guard lock(mu);
      heard.push_back(text);
    };
    return c;
  }, "rails-tuned/", [](int r, Communicator& c) {
    for (int call = 0; call < Tuner::most_calls(Tuner::kMaxCandidates) + 2; ++call)
      allreduce_case(c, r, DataType::f32, ReduceOp::sum, 40000, call % 2);
  });
  ASSERT_EQ(heard.size(), 1u);
  EXPECT_EQ(heard[0].rfind("allreduce of 65537-131072 bytes over 3 ranks: ring ", 0), 0u) << heard[0];
}

// Forced rails where the hosts differ in size say why, on every rank.
TEST(Hierarchical, RailsRefusedOnUnevenHosts) {
  const std::vector<int> hosts{3, 1, 2};
  World w(6);
  std::atomic<int> refused{0};
  run_ranks(w, [&](int r) { return on_hosts(hosts, r, Algorithm::rails); }, "rails-no/", [&](int r, Communicator& c) {
    int x = r;
    try {
      c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ELASTICRUN_ALGORITHM=rails, but the hosts run different numbers of ranks"),
                std::string::npos) << e.what();
      ++refused;
    }
  });
  EXPECT_EQ(refused, 6);
}

// Forced hier where it cannot apply says why, on every rank, for an allreduce and a broadcast.
TEST(Hierarchical, RefusedWhereThereIsNoHierarchy) {
  for (std::vector<int> hosts : {std::vector{3}, std::vector{1, 1, 1}})
    for (bool broadcast : {false, true}) {
      World w(3);
      std::atomic<int> refused{0};
      run_ranks(w, [&](int r) { return on_hosts(hosts, r, Algorithm::hier); }, "hier-no/", [&](int r, Communicator& c) {
        int x = r;
        try {
          if (broadcast) c.broadcast(&x, 1, DataType::i32, 0);
          else c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum);
        } catch (const Error& e) {
          std::string what = e.what();
          EXPECT_NE(what.find(hosts.size() == 1 ? "every rank is on one host" : "every host runs one rank"),
                    std::string::npos)
              << what;
          ++refused;
        }
      });
      EXPECT_EQ(refused, 3);
    }
}

}  // namespace
}  // namespace elasticrun::collective::testing
