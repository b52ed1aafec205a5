// What the elastic State's tests share: N ranks as threads, each with a Context around
// its own UCX communicator (run_contexts), hooks that simulate resets, and FakeDevice, a
// MemoryOps that stands in for a GPU.
#pragma once

#include "rank_fixture.h"

#include <elasticrun/elastic.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace elasticrun::collective::testing {

using namespace std::chrono_literals;

struct Pair {
  std::int32_t a;
  double b;
};

// Runs fn(rank, ctx) on n threads; rethrows the first exception after all joined.
inline void run_contexts(int n, const std::string& scope, const std::function<void(int, Context&)>& fn) {
  World w(n);
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        HostCommConfig cfg;
        cfg.rank = r;
        cfg.size = n;
        cfg.scope = scope;
        cfg.timeout = 20s;  // a broken test fails instead of hanging
        Context ctx(make_host_communicator(cfg, w.store, w.aborts[r]));
        fn(r, ctx);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

inline ElasticHooks quiet_hooks(std::function<void()> rejoin = [] {}) {
  return ElasticHooks{std::move(rejoin), [] { return false; }};
}

// Stands in for a GPU: "device memory" is heap memory this object handed out, and every
// copy is counted by direction, so the State's choice of copies is visible.
class FakeDevice final : public MemoryOps {
 public:
  ~FakeDevice() override {
    for (auto& [p, n] : blocks_) delete[] static_cast<std::byte*>(p);
  }
  template <class T>
  T* alloc(std::size_t count) {
    return static_cast<T*>(allocate(count * sizeof(T)));
  }
  device::Memory where(const void* p) override {
    auto* b = static_cast<const std::byte*>(p);
    for (auto& [base, n] : blocks_)
      if (b >= static_cast<std::byte*>(base) && b < static_cast<std::byte*>(base) + n) return device::Memory::device;
    return device::Memory::host;
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    bool d = where(dst) == device::Memory::device, s = where(src) == device::Memory::device;
    EXPECT_TRUE(d || s) << "a host-to-host copy went through MemoryOps";
    ++copies[std::string(s ? "d" : "h") + "2" + (d ? "d" : "h")];
    std::memcpy(dst, src, bytes);
  }
  void* allocate_device(std::size_t bytes, const void* near) override {
    EXPECT_EQ(where(near), device::Memory::device);
    return allocate(bytes);
  }
  void free_device(void* p) noexcept override {
    blocks_.erase(p);
    delete[] static_cast<std::byte*>(p);
  }
  std::size_t live() const { return blocks_.size(); }
  std::map<std::string, int> copies;  // "d2h", "h2d", "d2d"

 private:
  void* allocate(std::size_t bytes) {
    void* p = new std::byte[bytes];
    blocks_[p] = bytes;
    return p;
  }
  std::map<void*, std::size_t> blocks_;
};

inline ElasticHooks device_hooks(std::shared_ptr<FakeDevice> dev) {
  return ElasticHooks{[] {}, [] { return false; }, std::move(dev)};
}

}  // namespace elasticrun::collective::testing
