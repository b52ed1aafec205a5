// The NCCL backend on real GPUs: N ranks as threads, one GPU each (NCCL >= 2.5 rejects
// two ranks of one communicator on the same GPU: "Duplicate GPU detected"), the unique id
// exchanged over the in-memory store. Skips without a CUDA device (fails instead with
// ELASTICRUN_TEST_REQUIRE=gpu: ../require.h).
#include "../require.h"
#include "control/abort_signal.h"
#include "device/device_backend.h"
#include "control/memory_store.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace ec = elasticrun::collective;
using elasticrun::DataType;
using elasticrun::ReduceOp;
using namespace std::chrono_literals;

namespace {

int gpus_or_skip_reason(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) *why = std::string("no CUDA device: ") + cudaGetErrorName(e);
  else if (n == 0) *why = "no CUDA device: cudaGetDeviceCount found none";
  return e == cudaSuccess ? n : 0;
}

// Skips without enough GPUs; fails instead under ELASTICRUN_TEST_REQUIRE=gpu (none at
// all) or multigpu (fewer than k), see tests/require.h.
#define REQUIRE_GPUS(k)                                                                          \
  std::string why;                                                                               \
  int gpus = gpus_or_skip_reason(&why);                                                          \
  if (gpus == 0) ER_SKIP_UNLESS_REQUIRED("gpu", why);                                            \
  if (gpus < (k))                                                                                \
    ER_SKIP_UNLESS_REQUIRED("multigpu", "needs " + std::to_string(k) + " GPUs, found " + std::to_string(gpus));

// Runs fn(rank, comm) on `n` threads, each rank with its own communicator on GPU `rank`.
template <class Fn>
void on_ranks(int n, std::shared_ptr<ec::AbortSignal> abort, Fn fn) {
  auto store = std::make_shared<ec::MemoryStore>(abort);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ec::DeviceCommConfig cfg{r, n, r, std::chrono::milliseconds(60000)};
        auto comm = ec::make_device_communicator(cfg, ec::store_id_exchange(store, "e1/", r), abort);
        fn(r, *comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

template <class T>
T* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
  return static_cast<T*>(p);
}

}  // namespace

TEST(NcclDevice, AllreduceSumAndAvgAcrossGpus) {
  REQUIRE_GPUS(1);
  int n = gpus;
  on_ranks(n, nullptr, [n](int r, elasticrun::device::Communicator& comm) {
    constexpr std::size_t kCount = 1 << 20;
    std::vector<float> host(kCount, static_cast<float>(r + 1));
    float* d = device_alloc<float>(kCount * sizeof(float));
    cudaMemcpy(d, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice);
    EXPECT_EQ(elasticrun::device::memory_of(d), elasticrun::device::Memory::device);
    comm.allreduce(d, d, kCount, DataType::f32, ReduceOp::sum);
    cudaMemcpy(host.data(), d, kCount * sizeof(float), cudaMemcpyDeviceToHost);
    EXPECT_EQ(host.front(), n * (n + 1) / 2.0f);
    EXPECT_EQ(host.back(), n * (n + 1) / 2.0f);
    comm.broadcast(d, kCount, DataType::f32, 0);
    comm.allreduce(d, d, kCount, DataType::f32, ReduceOp::avg);
    cudaMemcpy(host.data(), d, sizeof(float), cudaMemcpyDeviceToHost);
    EXPECT_EQ(host.front(), n * (n + 1) / 2.0f);
    cudaFree(d);
  });
}

TEST(NcclDevice, AllgatherReduceScatterAlltoall) {
  REQUIRE_GPUS(1);
  int n = gpus;
  on_ranks(n, nullptr, [n](int r, elasticrun::device::Communicator& comm) {
    constexpr std::size_t kCount = 1024;
    std::vector<std::int32_t> in(kCount * n), out(kCount * n);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::int32_t>(r * 1000 + i / kCount);
    auto* din = device_alloc<std::int32_t>(in.size() * 4);
    auto* dout = device_alloc<std::int32_t>(out.size() * 4);
    cudaMemcpy(din, in.data(), in.size() * 4, cudaMemcpyHostToDevice);
    comm.alltoall(din, dout, kCount, DataType::i32);
    cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost);
    for (int j = 0; j < n; ++j) EXPECT_EQ(out[j * kCount], j * 1000 + r) << "block " << j;
    comm.allgather(din, dout, kCount, DataType::i32);
    cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost);
    for (int j = 0; j < n; ++j) EXPECT_EQ(out[j * kCount], j * 1000) << "block " << j;
    comm.reduce_scatter(din, dout, kCount, DataType::i32, ReduceOp::max);
    cudaMemcpy(out.data(), dout, 4, cudaMemcpyDeviceToHost);
    EXPECT_EQ(out[0], (n - 1) * 1000 + r);
    cudaFree(din);
    cudaFree(dout);
  });
}

// The failure NCCL cannot see: a peer on this host stops calling collectives. Only the
// control plane's abort ends the wait, within a bound.
TEST(NcclDevice, AbortEndsBlockedAllreduce) {
  REQUIRE_GPUS(2);
  auto abort = std::make_shared<ec::AbortSignal>();
  auto store = std::make_shared<ec::MemoryStore>();
  std::string rank0_error;
  std::chrono::steady_clock::duration took{};
  std::thread peer([&] {
    ec::DeviceCommConfig cfg{1, 2, 1, std::chrono::milliseconds(60000)};
    auto comm = ec::make_device_communicator(cfg, ec::store_id_exchange(store, "e1/", 1), abort);
    while (!abort->raised()) std::this_thread::sleep_for(10ms);  // never joins the allreduce
  });
  ec::DeviceCommConfig cfg{0, 2, 0, std::chrono::milliseconds(60000)};
  auto comm = ec::make_device_communicator(cfg, ec::store_id_exchange(store, "e1/", 0), abort);
  float* d = device_alloc<float>(1 << 20);
  std::thread raiser([&] {
    std::this_thread::sleep_for(300ms);
    abort->raise(ec::AbortSignal::Kind::workers_failed, "test: peer declared dead");
  });
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(comm->allreduce(d, d, (1 << 20) / 4, DataType::f32, ReduceOp::sum), elasticrun::WorkersFailed);
  took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, 5s);
  raiser.join();
  peer.join();
  EXPECT_THROW(comm->allreduce(d, d, 1, DataType::f32, ReduceOp::sum), elasticrun::WorkersFailed);
  cudaFree(d);
}
