// A failed worker's error file (torchrun's TORCHELASTIC_ERROR_FILE), read and told the
// way torchrun tells it: the root cause of the failure, with the exception and its
// traceback.
//
// torch's @record decorator writes
//   {"message": {"message": "RuntimeError: boom",
//                "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1700000000"}}}
// and older or hand-written files {"message": "text", "timestamp": 1700000000}. The file is
// the worker's: anything (not JSON, not UTF-8, escape sequences, over the daemon's size
// limit) is reported as what it is, never trusted and never fatal. Pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace elasticrun::cmd {

struct WorkerError {
  std::string message;    // "RuntimeError: boom"
  std::string traceback;  // Python's, when there is one
  std::optional<std::int64_t> timestamp;  // seconds since 1970, when the file says
  // Non-empty when the file is not of that form: why, with a printable excerpt of it.
  std::string problem;
};

// `text` is the file's content as the daemon sent it; `size` the file's size (larger than
// `limit`: not sent).
WorkerError parse_error_file(std::string_view text, std::uint64_t size, std::size_t limit);

// The failed worker, as the driver saw it.
struct FailedWorker {
  std::string host;
  int rank = -1, local_rank = -1, pid = 0;
  int code = 0, signal = 0;
};

// The lines torchrun prints under "Root Cause (first observed failure)", without a
// trailing newline.
std::string root_cause(const FailedWorker& w, const WorkerError& e);

// `s` with what a terminal must not get replaced by '?' (bytes that are not UTF-8,
// control characters but newline and tab), cut to `max` bytes with "..." after.
std::string printable(std::string_view s, std::size_t max);

}  // namespace elasticrun::cmd
