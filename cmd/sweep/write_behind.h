// The sweep's files are written by a thread of their own, so that its event loop, which
// answers every trial's reports while all of that trial's ranks wait, never waits for
// the disk. A rename over a file on a busy ext4 took 50-60 ms here (its journal), and
// the loop stalled every running trial for as long: up to 0.7 s per stall while a
// compiler wrote beside it (bench/RESULTS.md, hyperparameter search).
//
// Operations are applied in the order given, except that a replace of a file that is
// still queued takes the queued one's place (only the newest text matters). What is
// queued when the sweep is killed is lost, as if the kill had come a moment earlier;
// a resumed sweep already copes with that (a trial's own checkpoint may be ahead of
// what the sweep recorded). What must not be lost (a trial's end) is flushed at once.
#pragma once

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>

namespace elasticrun::sweep {

class WriteBehind {
 public:
  WriteBehind();
  ~WriteBehind();  // writes everything queued, then ends the thread
  WriteBehind(const WriteBehind&) = delete;
  WriteBehind& operator=(const WriteBehind&) = delete;

  // `path` becomes `text` atomically (write_file_atomically; `sync`: flushed to the disk
  // before the rename).
  void replace(const std::filesystem::path& path, std::string text, bool sync = false);
  // `text` is appended to `path`.
  void append(const std::filesystem::path& path, std::string text);
  // Returns once everything queued before the call is written.
  void flush();

 private:
  struct Op {
    std::filesystem::path path;
    std::string text;
    bool append = false, sync = false;
  };
  void run();

  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::deque<Op> queue_;
  bool writing_ = false;  // the thread holds an operation taken from the queue
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is ready
};

}  // namespace elasticrun::sweep
