// Workers' error files: torchrun's TORCHELASTIC_ERROR_FILE, one per worker process.
//
// torch's @record decorator (torch.distributed.elastic.multiprocessing.errors) writes the
// exception that ended the program there, as JSON with its traceback. The daemon gives
// every worker a fresh path in a directory of its own (shm_dirs::errors_path, removed with
// the daemon, or by whoever cleans up after a dead one), reads what a failed worker left
// there, bounded, and removes it. A worker may leave anything at that path (a huge file,
// a FIFO, a link): none of it can block, crash or mislead the daemon.
#pragma once

#include <cstdint>
#include <string>

namespace elasticrun::daemon {

struct ErrorFileContents {
  std::string text;        // the file's bytes when it held at most the limit; else empty
  std::uint64_t size = 0;  // its size; 0: no file (or not a regular file)
};

class ErrorFiles {
 public:
  explicit ErrorFiles(std::string dir) : dir_(std::move(dir)) {}
  ~ErrorFiles();
  ErrorFiles(const ErrorFiles&) = delete;
  ErrorFiles& operator=(const ErrorFiles&) = delete;
  // A new path for the next worker started at `slot`; empty when the directory cannot be
  // made (the worker then gets no error file, and torch logs the error instead).
  std::string next_path(std::uint32_t slot);
  // What is at `path` (at most `limit` bytes are read), after which it is removed.
  static ErrorFileContents take(const std::string& path, std::size_t limit);
  // Removes the directory now (the daemon was told to stop from outside).
  void remove_now();

 private:
  std::string dir_;
  bool made_ = false;
  std::uint64_t given_ = 0;
};

}  // namespace elasticrun::daemon
