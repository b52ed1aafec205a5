#include "cmd/sweep/write_behind.h"

#include "cmd/sweep/experiment.h"
#include "common/log.h"

#include <algorithm>
#include <fstream>

namespace elasticrun::sweep {

WriteBehind::WriteBehind() : thread_([this] { run(); }) {}

WriteBehind::~WriteBehind() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void WriteBehind::replace(const std::filesystem::path& path, std::string text, bool sync) {
  {
    std::lock_guard lock(mu_);
    auto queued = std::find_if(queue_.begin(), queue_.end(), [&](const Op& op) { return !op.append && op.path == path; });
    if (queued != queue_.end()) {
      queued->text = std::move(text);
      queued->sync = queued->sync || sync;
      return;
    }
    queue_.push_back(Op{path, std::move(text), false, sync});
  }
  wake_.notify_one();
}

void WriteBehind::append(const std::filesystem::path& path, std::string text) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(Op{path, std::move(text), true, false});
  }
  wake_.notify_one();
}

void WriteBehind::flush() {
  std::unique_lock lock(mu_);
  done_.wait(lock, [this] { return queue_.empty() && !writing_; });
}

void WriteBehind::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything is written
    Op op = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    if (op.append) {
      std::ofstream out(op.path, std::ios::app | std::ios::binary);
      out << op.text;
      out.flush();
      if (!out) ER_LOG(driver, error, "cannot append to {}", op.path.string());
    } else if (auto ok = write_file_atomically(op.path, op.text, op.sync); !ok) {
      ER_LOG(driver, error, "{}", ok.error());
    }
    lock.lock();
    writing_ = false;
    if (queue_.empty()) done_.notify_all();
  }
}

}  // namespace elasticrun::sweep
