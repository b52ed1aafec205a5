// An in-process Store for tests: N threads, each with its own communicator,
// exchange addresses through one shared map.
#pragma once

#include "control/abort_signal.h"
#include "control/store.h"

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>

namespace elasticrun::collective {

class MemoryStore final : public Store {
 public:
  // If `abort` is given, a raised abort ends every get() with its typed error.
  explicit MemoryStore(std::shared_ptr<AbortSignal> abort = nullptr) : abort_(std::move(abort)) {}

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Clock::time_point deadline) override;

 private:
  std::shared_ptr<AbortSignal> abort_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes> data_;
};

}  // namespace elasticrun::collective
