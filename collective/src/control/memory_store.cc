#include "control/memory_store.h"

#include <elasticrun/types.hpp>

#include <algorithm>

namespace elasticrun::collective {

void MemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

Bytes MemoryStore::get(const std::string& key, Clock::time_point deadline) {
  // The abort signal cannot notify our condition variable, so wait in short slices.
  constexpr auto kSlice = std::chrono::milliseconds(10);
  std::unique_lock lock(mu_);
  for (;;) {
    if (auto it = data_.find(key); it != data_.end()) return it->second;
    if (abort_) abort_->check();
    auto now = Clock::now();
    if (now >= deadline) throw TimeoutError("store: timed out waiting for key '" + key + "'");
    cv_.wait_until(lock, std::min(deadline, now + kSlice));
  }
}

}  // namespace elasticrun::collective
