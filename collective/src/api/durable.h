// Durable checkpoints of an elastic state (ELASTICRUN_CHECKPOINT_DIR; elasticrun
// --checkpoint-dir): what lets a job go on when every worker holding its state is gone.
//
// Rank 0 of the current epoch writes a copy of the committed state every N commits
// (ELASTICRUN_CHECKPOINT_EVERY), at the first commit T seconds after the last copy
// (ELASTICRUN_CHECKPOINT_INTERVAL), and at the first commit after the driver asked
// for one (a scheduler's SIGTERM: elasticrun --preempt-grace), on a thread of its own: commit() copies the state
// into a buffer and returns; the disk is not waited for. One write runs at a time and
// one more waits: a commit that falls due while the writer is busy replaces the one
// waiting, so a slow disk costs intermediate checkpoints, never training time, and the
// newest due commit is always written (the destructor waits for it). The file format
// and the atomic write are control/checkpoint_file.h.
//
// A worker that holds no state (it never took part in a sync) and is rank 0 loads the
// newest intact checkpoint before its first sync: at the first start of a job whose
// directory already holds one, and after every holder of the state was lost (the
// driver then starts a new epoch of new workers). A checkpoint that does not verify is
// skipped for the next older one; one that verifies but tracks other items than this
// program is an Error (it is another job's).
//
// Each write, restore, skipped file and failure is told to the driver (--events) over
// the rendezvous connection. Used by State (C++) and by the Python package's states.
#pragma once

#include "control/checkpoint_file.h"
#include "control/settings.h"
#include "common/messages.h"

#include <elasticrun/elasticrun.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace elasticrun {

class Durable {
 public:
  // Sends one note to the driver; empty: nowhere to send (a context without launcher).
  using Notify = std::function<void(const msg::CheckpointNote&)>;
  // How many checkpoints the driver asked for so far (RendezvousClient::
  // checkpoint_requests); empty: none ever.
  using Requests = std::function<std::uint64_t()>;

  // From the settings; nullptr when ELASTICRUN_CHECKPOINT_DIR is unset. Throws Error
  // for a bad setting.
  static std::unique_ptr<Durable> from_settings(Context& ctx);
  Durable(Context& ctx, collective::settings::Checkpoint cfg, Notify notify, Requests requests = {});
  ~Durable();  // waits for the write in progress and the one waiting
  Durable(const Durable&) = delete;
  Durable& operator=(const Durable&) = delete;

  const std::string& dir() const { return cfg_.dir; }
  // Whether this rank should write commit number `commit`: rank 0, due by count, by
  // time, or asked for by the driver since the last save.
  bool due(std::uint64_t commit);
  // Hands the committed state to the writer thread: `payload` (the items' bytes in
  // order, described by `items`) is taken and an earlier buffer given back for reuse.
  void save(std::uint64_t commit, const std::string& kind, std::vector<collective::checkpoint::Item> items,
            std::vector<std::byte>& payload);
  // The newest intact checkpoint in the directory, or nullopt. Files that do not verify
  // are skipped (each told to the driver and logged). Throws Error if the newest intact
  // one is of another kind or tracks other items than `items` (unless `items` is empty:
  // any layout of the kind, for the Python states). Tells the driver what it restored.
  std::optional<collective::checkpoint::Loaded> load(const std::string& kind,
                                                     const std::vector<collective::checkpoint::Item>& items);
  // Waits until no write is in progress.
  void drain();

 private:
  struct Job {
    collective::checkpoint::Manifest manifest;
    std::vector<std::byte> payload;
    bool requested = false;  // it answers the driver's request (CheckpointNote::requested)
  };
  void writer();
  void tell(msg::CheckpointEvent event, std::uint64_t epoch, std::uint64_t commit, std::uint64_t bytes,
            std::chrono::milliseconds took, const std::string& path, const std::string& detail,
            bool requested = false);
  std::uint64_t epoch() const;

  Context& ctx_;
  collective::settings::Checkpoint cfg_;
  Notify notify_;
  Requests requests_;
  // Requests seen by due() and answered by a save (the one after it, on the program's
  // thread), so that each request gets one save marked as its answer.
  std::uint64_t requests_due_ = 0, requests_served_ = 0;
  std::uint64_t last_commit_ = 0;  // the last commit handed to the writer or restored
  std::chrono::steady_clock::time_point last_time_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Job> job_;       // handed over, not yet taken by the writer
  bool busy_ = false;            // a job is waiting or being written
  bool stop_ = false;
  std::vector<std::byte> spare_;  // the buffer of the last write, for reuse
  std::thread thread_;
};

}  // namespace elasticrun
