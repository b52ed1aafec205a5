// Device selection, ELASTICRUN_DEVICE(_HINT) parsing and the NCCL unique-id exchange over the
// in-memory store with N threads. None of it needs NCCL or a GPU, so it runs in every build.
#include "../require.h"
#include "control/abort_signal.h"
#include "device/device_backend.h"
#include "device/device_config.h"
#include "control/memory_store.h"
#include "device/nccl_id_exchange.h"

#include <elasticrun/device.hpp>

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace ec = elasticrun::collective;
using namespace std::chrono_literals;

// Without the NCCL backend the device tests (collective_nccl_device) are not even built:
// this one says so, and fails where GPU tests are required (ELASTICRUN_TEST_REQUIRE=gpu).
TEST(DeviceBackend, IsBuiltIn) {
#ifndef ELASTICRUN_TEST_HAVE_NCCL
  ER_SKIP_UNLESS_REQUIRED("gpu", "built without the NCCL backend: the device tests are not built");
#endif
}

TEST(DeviceConfig, ParseDevice) {
  EXPECT_FALSE(ec::parse_device(nullptr));
  EXPECT_FALSE(ec::parse_device(""));
  EXPECT_EQ(ec::parse_device("0"), 0);
  EXPECT_EQ(ec::parse_device("7"), 7);
  for (const char* bad : {"-1", "x", "1x", " 1", "99999999999"})
    EXPECT_THROW(ec::parse_device(bad), elasticrun::Error) << bad;
}

TEST(DeviceConfig, LocalRankModuloDeviceCount) {
  EXPECT_EQ(ec::select_device(0, 8, std::nullopt), 0);
  EXPECT_EQ(ec::select_device(5, 8, std::nullopt), 5);
  EXPECT_EQ(ec::select_device(5, 2, std::nullopt), 1);  // ranks share GPUs
  EXPECT_EQ(ec::select_device(3, 1, std::nullopt), 0);  // one visible GPU (CUDA_VISIBLE_DEVICES=k)
}

TEST(DeviceConfig, ForcedDeviceAndErrors) {
  EXPECT_EQ(ec::select_device(3, 4, 1), 1);
  EXPECT_THROW(ec::select_device(0, 2, 2), elasticrun::Error);
  EXPECT_THROW(ec::select_device(0, 0, std::nullopt), elasticrun::Error);
  EXPECT_THROW(ec::select_device(-1, 2, std::nullopt), elasticrun::Error);
}

// The daemon's hint counts the host's GPUs; a worker may see fewer (a wrapper's
// CUDA_VISIBLE_DEVICES, MIG): the hint wraps around instead of failing.
TEST(DeviceConfig, HintIsModuloTheVisibleDevices) {
  EXPECT_EQ(ec::select_device(0, 4, std::nullopt, 3), 3);
  EXPECT_EQ(ec::select_device(0, 1, std::nullopt, 3), 0);  // one GPU left visible per rank
  EXPECT_EQ(ec::select_device(0, 2, std::nullopt, 5), 1);
  EXPECT_EQ(ec::select_device(1, 4, 2, 3), 2);  // the user's choice wins
  EXPECT_THROW(ec::select_device(0, 2, 2, 1), elasticrun::Error);
  EXPECT_THROW(ec::select_device(0, 0, std::nullopt, 1), elasticrun::Error);
}

TEST(DeviceConfig, FromEnvironment) {
  ::setenv(elasticrun::env::kDevice, "1", 1);
  ::setenv(elasticrun::env::kDeviceHint, "3", 1);
  EXPECT_EQ(ec::select_device_from_env(0, 4), 1);
  ::setenv(elasticrun::env::kDevice, "5", 1);
  EXPECT_THROW(ec::select_device_from_env(0, 4), elasticrun::Error);
  ::setenv(elasticrun::env::kDevice, "bad", 1);
  EXPECT_THROW(ec::select_device_from_env(0, 4), elasticrun::Error);
  ::unsetenv(elasticrun::env::kDevice);
  EXPECT_EQ(ec::select_device_from_env(0, 4), 3);
  EXPECT_EQ(ec::select_device_from_env(0, 2), 1);
  ::setenv(elasticrun::env::kDeviceHint, "x", 1);
  try {
    ec::select_device_from_env(0, 4);
    ADD_FAILURE() << "a malformed hint was accepted";
  } catch (const elasticrun::Error& e) {
    EXPECT_NE(std::string(e.what()).find(elasticrun::env::kDeviceHint), std::string::npos) << e.what();
  }
  ::unsetenv(elasticrun::env::kDeviceHint);
  EXPECT_EQ(ec::select_device_from_env(6, 4), 2);
}

namespace {
ec::Bytes fake_id(std::uint8_t seed) {
  ec::Bytes id(ec::kNcclIdBytes);
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::uint8_t>(seed + i);
  return id;
}
}  // namespace

TEST(NcclIdExchange, EveryRankGetsRankZerosId) {
  constexpr int kRanks = 6;
  auto store = std::make_shared<ec::MemoryStore>();
  std::vector<ec::Bytes> got(kRanks);
  std::atomic<int> made{0};
  std::vector<std::thread> threads;
  for (int r = kRanks - 1; r >= 0; --r) {  // fetchers start before the maker
    threads.emplace_back([&, r] {
      auto ex = ec::store_id_exchange(store, "e3/", r);
      got[r] = ex([&] { ++made; return fake_id(42); }, ec::Clock::now() + 5s);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(made.load(), 1);
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(got[r], fake_id(42)) << "rank " << r;
  EXPECT_EQ(store->get("e3/nccl/id", ec::Clock::now()), fake_id(42));
}

TEST(NcclIdExchange, EpochsHaveTheirOwnIds) {
  ec::MemoryStore store;
  ec::exchange_nccl_id(store, "e1/", 0, [] { return fake_id(1); }, ec::Clock::now() + 1s);
  ec::exchange_nccl_id(store, "e2/", 0, [] { return fake_id(2); }, ec::Clock::now() + 1s);
  EXPECT_EQ(ec::exchange_nccl_id(store, "e1/", 3, nullptr, ec::Clock::now() + 1s), fake_id(1));
  EXPECT_EQ(ec::exchange_nccl_id(store, "e2/", 3, nullptr, ec::Clock::now() + 1s), fake_id(2));
}

TEST(NcclIdExchange, ScopesCountCommunicatorsPerEpoch) {
  ec::DeviceScopes scopes;
  EXPECT_EQ(scopes.next(0), "e0/d0/");
  EXPECT_EQ(scopes.next(0), "e0/d1/");
  EXPECT_EQ(scopes.next(3), "e3/d0/");  // a newcomer of epoch 3 starts at d0 too
  EXPECT_EQ(scopes.next(3), "e3/d1/");
  EXPECT_EQ(ec::nccl_id_key(scopes.next(3)), "e3/d2/nccl/id");
}

// Two communicators in one epoch (a retry, or make_communicator beside Collectives):
// rank 0 publishes the second id late, and a fetcher must wait for it, not take the
// first one still in the store.
TEST(NcclIdExchange, SecondCommunicatorOfAnEpochGetsAFreshId) {
  constexpr int kRanks = 4;
  auto store = std::make_shared<ec::MemoryStore>();
  std::vector<std::vector<ec::Bytes>> got(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      ec::DeviceScopes scopes;  // each rank's context counts on its own
      for (std::uint8_t seed : {1, 2}) {
        auto ex = ec::store_id_exchange(store, scopes.next(5), r);
        got[r].push_back(ex(
            [&] {
              if (seed == 2) std::this_thread::sleep_for(100ms);
              return fake_id(seed);
            },
            ec::Clock::now() + 5s));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(got[r], (std::vector<ec::Bytes>{fake_id(1), fake_id(2)})) << "rank " << r;
}

TEST(NcclIdExchange, MalformedValueIsProtocolError) {
  ec::MemoryStore store;
  store.set("e1/nccl/id", ec::Bytes(5, 0));
  EXPECT_THROW(ec::exchange_nccl_id(store, "e1/", 1, nullptr, ec::Clock::now() + 1s), elasticrun::ProtocolError);
  EXPECT_THROW(ec::exchange_nccl_id(store, "e1/", 0, [] { return ec::Bytes(3); }, ec::Clock::now() + 1s),
               elasticrun::Error);
}

TEST(NcclIdExchange, MissingIdTimesOutAndAbortInterrupts) {
  ec::MemoryStore store;
  EXPECT_THROW(ec::exchange_nccl_id(store, "e1/", 1, nullptr, ec::Clock::now() + 50ms), elasticrun::TimeoutError);
  auto abort = std::make_shared<ec::AbortSignal>();
  ec::MemoryStore aborting(abort);
  std::thread raiser([&] {
    std::this_thread::sleep_for(20ms);
    abort->raise(ec::AbortSignal::Kind::workers_failed, "rank 0 died");
  });
  auto t0 = ec::Clock::now();
  EXPECT_THROW(ec::exchange_nccl_id(aborting, "e1/", 1, nullptr, t0 + 10s), elasticrun::WorkersFailed);
  EXPECT_LT(ec::Clock::now() - t0, 2s);
  raiser.join();
}

// Telling host from device memory must not start CUDA in a process that never used it
// (a context costs GPU memory and time). Only meaningful where libcuda exists: on a
// machine without the driver the library can never be loaded.
TEST(DeviceApi, AskingAboutHostMemoryLeavesCudaAlone) {
  ASSERT_EQ(::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD), nullptr) << "precondition: CUDA unused so far";
  std::vector<float> v(4);
  EXPECT_EQ(elasticrun::device::memory_of(v.data()), elasticrun::device::Memory::host);
  EXPECT_EQ(::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD), nullptr);
}

TEST(DeviceApi, HostMemoryIsHost) {
  std::vector<float> v(4);
  EXPECT_EQ(elasticrun::device::memory_of(v.data()), elasticrun::device::Memory::host);
  EXPECT_EQ(elasticrun::device::memory_of(nullptr), elasticrun::device::Memory::host);
  std::string why;
  if (!elasticrun::device::available(&why)) {
    EXPECT_FALSE(why.empty());
  }
}

// Without a device (or without the backend) use_device says why instead of picking one;
// with one, it returns an index among the visible devices.
TEST(DeviceApi, UseDeviceNeedsADevice) {
  std::string why;
  if (elasticrun::device::available(&why)) {
    EXPECT_GE(ec::use_device(0), 0);
    return;
  }
  try {
    ec::use_device(0);
    ADD_FAILURE() << "use_device without a device returned";
  } catch (const elasticrun::Error& e) {
    EXPECT_NE(std::string(e.what()).find(why.substr(0, 12)), std::string::npos) << e.what() << " vs " << why;
  }
}
