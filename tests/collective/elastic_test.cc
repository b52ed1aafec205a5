// The elastic State over real collectives: N ranks as threads, each with a Context
// around its own UCX communicator. Resets are simulated through ElasticHooks, since
// a standalone Context has no rendezvous server to re-join.
#include "elastic_fixture.h"

#include <elasticrun/elastic.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace elasticrun::collective::testing {
namespace {

TEST(ElasticState, CommitRestoreRoundTrip) {
  run_contexts(1, "roundtrip/", [](int, Context& ctx) {
    std::vector<float> f = {1, 2, 3};
    std::vector<std::byte> raw(5, std::byte{7});
    Pair p{1, 1.5};
    State st(ctx, quiet_hooks());
    st.track("f", std::span(f));
    st.track("raw", std::span(raw));
    st.track_value("pair", p);

    // Before any commit, restore() goes back to the values at registration.
    f[0] = 100;
    p.a = 9;
    st.restore();
    EXPECT_EQ(f[0], 1);
    EXPECT_EQ(p.a, 1);

    f = {4, 5, 6};
    raw[4] = std::byte{1};
    p = {2, 2.5};
    st.commit();
    EXPECT_EQ(st.commits(), 1u);
    f = {0, 0, 0};
    raw[4] = std::byte{0};
    p = {0, 0};
    st.restore();
    EXPECT_EQ(f, (std::vector<float>{4, 5, 6}));
    EXPECT_EQ(raw[4], std::byte{1});
    EXPECT_EQ(p.a, 2);
    EXPECT_EQ(p.b, 2.5);

    // A second commit replaces the first (the double buffer flips back).
    f[1] = 50;
    st.commit();
    f[1] = -1;
    st.restore();
    EXPECT_EQ(f[1], 50);
  });
}

TEST(ElasticState, DuplicateAndEmptyNamesAreErrors) {
  run_contexts(1, "names/", [](int, Context& ctx) {
    std::int64_t a = 0, b = 0;
    State st(ctx, quiet_hooks());
    st.track_value("a", a);
    EXPECT_THROW(st.track_value("a", b), Error);
    EXPECT_THROW(st.track_value("", b), Error);
    EXPECT_THROW(st.track_raw("null", nullptr, 4, DataType::i32), Error);
    EXPECT_THROW(st.on_reset(nullptr), Error);
  });
}

TEST(ElasticState, SyncMakesEveryRankEqualRankZero) {
  constexpr int n = 3;
  run_contexts(n, "sync/", [](int r, Context& ctx) {
    std::vector<std::int64_t> small(10, r * 100);
    std::vector<float> large(50000, static_cast<float>(r));  // 200 KB: broadcast in place
    std::int32_t step = r + 7;
    State st(ctx, quiet_hooks());
    st.track("small", std::span(small));
    st.track("large", std::span(large));
    st.track_value("step", step);
    st.sync();
    EXPECT_EQ(small, std::vector<std::int64_t>(10, 0)) << "rank " << r;
    EXPECT_EQ(large, std::vector<float>(50000, 0.0f)) << "rank " << r;
    EXPECT_EQ(step, 7) << "rank " << r;
    // sync() snapshots: restore() returns to rank 0's values.
    small[3] = -1;
    large[49999] = -1;
    step = -1;
    st.restore();
    EXPECT_EQ(small[3], 0);
    EXPECT_EQ(large[49999], 0.0f);
    EXPECT_EQ(step, 7);
  });
}

TEST(ElasticState, SyncRejectsDifferentLayoutsOnEveryRank) {
  std::atomic<int> errors{0};
  run_contexts(3, "layout/", [&](int r, Context& ctx) {
    std::vector<std::int32_t> buf(r == 1 ? 5 : 4);
    State st(ctx, quiet_hooks());
    st.track("buf", std::span(buf));
    try {
      st.sync();
    } catch (const Error& e) {
      ++errors;
      EXPECT_NE(std::string(e.what()).find("different items"), std::string::npos) << e.what();
    }
  });
  EXPECT_EQ(errors.load(), 3);
}

TEST(ElasticState, HostsUpdatedOnAllRanksAtTheSameCommit) {
  constexpr int n = 3;
  std::vector<std::uint64_t> raised_at(n, 0);
  run_contexts(n, "hosts/", [&](int r, Context& ctx) {
    int checks = 0;
    // Only rank 1 hears about new hosts, from its third commit on.
    ElasticHooks hooks{[] {}, [&checks, r] { return r == 1 && ++checks >= 3; }};
    std::int64_t x = 0;
    State st(ctx, hooks);
    st.track_value("x", x);
    for (int i = 0; i < 10; ++i) {
      x = i;
      try {
        st.commit();
      } catch (const HostsUpdated&) {
        raised_at[r] = st.commits();
        EXPECT_TRUE(st.interrupted_at_commit());
        break;
      }
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(raised_at[r], 3u) << "rank " << r;
}

TEST(ElasticState, RunRestoresOnWorkersFailed) {
  run_contexts(2, "run-failed/", [](int r, Context& ctx) {
    int rejoins = 0;
    std::int64_t x = 0;
    State st(ctx, quiet_hooks([&] { ++rejoins; }));
    st.track_value("x", x);
    int calls = 0;
    int result = run(st, [&](State& s) {
      ++calls;
      if (calls == 1) {
        x = 10 + r;  // rank 0's value wins at the next sync
        s.commit();
        x = 99;
        throw WorkersFailed("injected");
      }
      EXPECT_EQ(x, 10) << "rank " << r << ": not restored and synced from rank 0";
      return 42;
    });
    EXPECT_EQ(result, 42);
    EXPECT_EQ(calls, 2);
    EXPECT_EQ(rejoins, 1);
  });
}

TEST(ElasticState, RunKeepsTheCommitThatRaisedHostsUpdated) {
  run_contexts(2, "run-hosts/", [](int r, Context& ctx) {
    bool announced = false;
    std::int64_t x = 0;
    ElasticHooks hooks{[&] { announced = false; }, [&] { return announced; }};
    State st(ctx, hooks);
    st.track_value("x", x);
    int calls = 0;
    run(st, [&](State& s) {
      if (++calls == 1) {
        x = 20;
        if (r == 0) announced = true;  // one rank's notice stops both at this commit
        s.commit();
        ADD_FAILURE() << "commit did not raise HostsUpdated";
      }
      EXPECT_EQ(x, 20);
      EXPECT_EQ(s.commits(), 1u);
    });
    EXPECT_EQ(calls, 2);
  });
}

TEST(ElasticState, RunRestoresWhenHostsUpdatedInterruptsAStep) {
  run_contexts(2, "run-mid/", [](int, Context& ctx) {
    std::int64_t x = 5;
    State st(ctx, quiet_hooks());
    st.track_value("x", x);
    int calls = 0;
    run(st, [&](State&) {
      if (++calls == 1) {
        x = 6;  // half a step: must not survive
        throw HostsUpdated("injected mid-step");
      }
      EXPECT_EQ(x, 5);
    });
    EXPECT_EQ(calls, 2);
  });
}

TEST(ElasticState, OnResetRunsAfterEachRejoinInOrder) {
  run_contexts(2, "on-reset/", [](int, Context& ctx) {
    std::vector<std::string> events;
    std::int64_t x = 0;
    State st(ctx, quiet_hooks([&] { events.push_back("rejoin"); }));
    st.track_value("x", x);
    st.on_reset([&] { events.push_back("a"); });
    st.on_reset([&] { events.push_back("b"); });
    int calls = 0;
    run(st, [&](State&) {
      if (++calls <= 2) throw WorkersFailed("injected");
    });
    EXPECT_EQ(events, (std::vector<std::string>{"rejoin", "a", "b", "rejoin", "a", "b"}));
  });
}

TEST(ElasticState, RunPropagatesAFailedRejoinAndOtherErrors) {
  run_contexts(1, "run-errors/", [](int, Context& ctx) {
    State removed(ctx, quiet_hooks([] { throw Error("not part of epoch 3"); }));
    EXPECT_THROW(run(removed, [](State&) { throw WorkersFailed("injected"); }), Error);
    State st(ctx, quiet_hooks());
    EXPECT_THROW(run(st, [](State&) { throw ProtocolError("injected"); }), ProtocolError);
  });
}

// A silent peer shows as a collective timeout: like a failure, restore and re-join.
TEST(ElasticState, RunRestoresAndRejoinsOnTimeout) {
  run_contexts(1, "run-timeout/", [](int, Context& ctx) {
    int rejoins = 0;
    std::int64_t x = 0;
    State st(ctx, quiet_hooks([&] { ++rejoins; }));
    st.track_value("x", x);
    int calls = 0;
    run(st, [&](State& s) {
      if (++calls == 1) {
        x = 7;
        s.commit();
        x = 99;
        throw TimeoutError("injected: allreduce timed out waiting for rank 2");
      }
      EXPECT_EQ(x, 7) << "not restored to the commit";
    });
    EXPECT_EQ(calls, 2);
    EXPECT_EQ(rejoins, 1);
  });
}

// After a failure the epoch's transport goes before the restore: a receive under way
// when the collective failed cannot be cancelled, and landing after the restore it would
// overwrite the restored commit. The hook sees the buffer as the failure left it.
TEST(ElasticState, RunAbandonsTheEpochBeforeRestoring) {
  run_contexts(1, "run-abandon/", [](int, Context& ctx) {
    std::vector<std::string> failures = {"failed", "timeout", "hosts mid-step"};
    for (const auto& kind : failures) {
      std::int64_t x = 0;
      std::vector<std::int64_t> seen;
      ElasticHooks hooks = quiet_hooks();
      hooks.abandon = [&] { seen.push_back(x); };
      State st(ctx, hooks);
      st.track_value("x", x);
      int calls = 0;
      run(st, [&](State& s) {
        if (++calls > 1) return;
        x = 7;
        s.commit();
        x = 99;
        if (kind == "failed") throw WorkersFailed("injected");
        if (kind == "timeout") throw TimeoutError("injected");
        throw HostsUpdated("injected mid-step");
      });
      EXPECT_EQ(seen, std::vector<std::int64_t>{99}) << kind << ": not abandoned once, before the restore";
      EXPECT_EQ(x, 7) << kind;
    }
  });
}

// Rank 1 of 2 whose sync receives rank 0's small items (commit count 100 among them) and
// then loses rank 0 in the broadcast of a large item.
class SyncBreaksAfterTheSmallItems final : public Communicator {
 public:
  int rank() const override { return 1; }
  int size() const override { return 2; }
  void allreduce(const void*, void*, std::size_t, DataType, ReduceOp) override {}  // the layouts agree
  void broadcast(void* buf, std::size_t count, DataType, int) override {
    if (broadcasts_++ > 0) throw WorkersFailed("injected: rank 0 lost mid-sync");
    std::uint64_t hundred = 100;
    std::memset(buf, 0x5a, count);
    std::memcpy(buf, &hundred, sizeof hundred);
  }
  void allgather(const void*, void*, std::size_t, DataType) override {}
  void allgatherv(const void*, void*, std::span<const std::size_t>, DataType) override {}
  void reduce_scatter(const void*, void*, std::size_t, DataType, ReduceOp) override {}
  void alltoall(const void*, void*, std::size_t, DataType) override {}
  void barrier() override {}

 private:
  int broadcasts_ = 0;
};

// A sync that fails after the small items came: restore() puts them back, and the commit
// count with them (it went on saying rank 0's 100 over this rank's commit-3 data, and
// that count names durable checkpoint files and schedules them).
TEST(ElasticState, ASyncThatFailsPartWayLeavesTheCommitCountWithTheData) {
  Context ctx(std::make_unique<SyncBreaksAfterTheSmallItems>());
  std::int64_t small = 0;
  std::vector<std::uint8_t> large(128 * 1024);
  ElasticHooks hooks = quiet_hooks();
  hooks.hosts_updated = [] { return false; };
  State st(ctx, hooks);
  st.track_value("small", small);
  st.track("large", std::span<std::uint8_t>(large));
  for (int i = 1; i <= 3; ++i) {
    small = i;
    st.commit();
  }
  EXPECT_THROW(st.sync(), WorkersFailed);
  st.restore();
  EXPECT_EQ(small, 3);
  EXPECT_EQ(st.commits(), 3u);
}

// Without a communicator (abandoned, or a re-join that failed) a collective is an Error,
// not a crash.
TEST(ElasticState, AnAbandonedContextHasNoCommunicator) {
  run_contexts(1, "abandoned/", [](int, Context& ctx) {
    std::int64_t x = 1;
    ctx.comm().allreduce(&x, &x, 1, DataType::i64, ReduceOp::sum);
    ctx.abandon();
    try {
      ctx.comm();
      ADD_FAILURE() << "comm() after abandon() did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no communicator"), std::string::npos) << e.what();
    }
  });
}

TEST(ElasticDeviceState, DeviceItemsSnapshotToHostByDefault) {
  run_contexts(1, "dev-host/", [](int, Context& ctx) {
    auto dev = std::make_shared<FakeDevice>();
    float* w = dev->alloc<float>(3);
    std::fill(w, w + 3, 1.0f);
    std::vector<float> host = {5, 6};
    State st(ctx, device_hooks(dev));
    st.track_raw("w", w, 3, DataType::f32);
    st.track("host", std::span(host));
    EXPECT_EQ(dev->copies["d2h"], 1);  // track() snapshots the item as it is
    EXPECT_EQ(dev->live(), 1u);        // no device snapshot buffers

    w[0] = 9;
    st.restore();
    EXPECT_EQ(w[0], 1.0f);
    std::fill(w, w + 3, 2.0f);
    host[1] = 60;
    st.commit();
    EXPECT_EQ(dev->copies["d2h"], 2);
    std::fill(w, w + 3, -1.0f);
    host[1] = -1;
    st.restore();
    EXPECT_EQ(std::vector<float>(w, w + 3), (std::vector<float>{2, 2, 2}));
    EXPECT_EQ(host[1], 60);
    EXPECT_EQ(dev->copies["h2d"], 2);
    EXPECT_EQ(dev->copies["d2d"], 0);
  });
}

TEST(ElasticDeviceState, DeviceSnapshotCopiesOnTheDevice) {
  run_contexts(1, "dev-dev/", [](int, Context& ctx) {
    auto dev = std::make_shared<FakeDevice>();
    auto* w = dev->alloc<std::int64_t>(4);
    std::fill(w, w + 4, 3);
    {
      State st(ctx, device_hooks(dev));
      st.track_raw("w", w, 4, DataType::i64, Snapshot::device);
      EXPECT_EQ(dev->live(), 3u);  // the item and its two snapshot slots
      st.commit();
      w[2] = 7;
      st.commit();  // the slots alternate: the first commit's is overwritten only now
      w[2] = 0;
      st.restore();
      EXPECT_EQ(w[2], 7);
      EXPECT_EQ(dev->copies["d2h"] + dev->copies["h2d"], 0);
      EXPECT_EQ(dev->copies["d2d"], 4);  // track, two commits, restore
    }
    EXPECT_EQ(dev->live(), 1u);  // the State freed its slots
  });
}

TEST(ElasticDeviceState, DeviceSnapshotNeedsDeviceMemory) {
  run_contexts(1, "dev-bad/", [](int, Context& ctx) {
    auto dev = std::make_shared<FakeDevice>();
    std::vector<float> host(4);
    State st(ctx, device_hooks(dev));
    EXPECT_THROW(st.track("host", std::span(host), Snapshot::device), Error);
    EXPECT_EQ(dev->live(), 0u);
  });
}

TEST(ElasticDeviceState, SyncBroadcastsDeviceItemsThroughHost) {
  constexpr int n = 3;
  run_contexts(n, "dev-sync/", [](int r, Context& ctx) {
    auto dev = std::make_shared<FakeDevice>();
    auto* small = dev->alloc<std::int64_t>(10);
    constexpr std::size_t kLarge = 50000;  // 200 KB: the staged path
    float* large = dev->alloc<float>(kLarge);
    std::fill(small, small + 10, r * 100 + 1);
    std::fill(large, large + kLarge, static_cast<float>(r + 1));
    std::int32_t step = r + 7;
    State st(ctx, device_hooks(dev));
    st.track_raw("small", small, 10, DataType::i64);
    st.track_raw("large", large, kLarge, DataType::f32, r == 1 ? Snapshot::device : Snapshot::host);
    st.track_value("step", step);
    st.sync();
    EXPECT_EQ(small[9], 1) << "rank " << r;
    EXPECT_EQ(large[0], 1.0f) << "rank " << r;
    EXPECT_EQ(large[kLarge - 1], 1.0f) << "rank " << r;
    EXPECT_EQ(step, 7) << "rank " << r;
    // The root copies out, the others copy in; then everyone snapshots.
    if (r != 0) {
      EXPECT_EQ(dev->copies["h2d"], 2) << "rank " << r;
    }
    large[5] = -1;
    small[0] = -1;
    st.restore();
    EXPECT_EQ(large[5], 1.0f) << "rank " << r;
    EXPECT_EQ(small[0], 1) << "rank " << r;
  });
}

}  // namespace
}  // namespace elasticrun::collective::testing
