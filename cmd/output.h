// Worker output, multiplexed onto the driver's stdout/stderr line by line with a
// rank prefix ("[2]<stdout>: ..."), and optionally tee'd to DIR/rank.N/{stdout,stderr}.
//
// Chunks arrive in arbitrary pieces; a line is printed only once complete (or when
// its stream ends), so lines from different workers never interleave mid-line. A
// carriage return not followed by a newline ends a line too, printed with its '\r'
// (a progress bar's update, which then redraws in place, prefix included), and a line
// is cut at kMaxLine bytes: the driver's memory stays bounded and a worker that never
// writes a newline is still seen. Lines
// are gathered per producing process, named by its place (host, slot: one process at
// a time), not per prefix: a worker keeps the rank it started as for its prefix, and
// after resets two live workers can carry the same one.
#pragma once

#include "common/result.h"

#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <utility>

namespace elasticrun::cmd {

class OutputRouter {
 public:
  static constexpr std::size_t kMaxLine = 64 * 1024;
  using Source = std::pair<std::string, int>;  // the producing worker's (host, slot)

  explicit OutputRouter(std::string dir, std::FILE* out = stdout, std::FILE* err = stderr)
      : dir_(std::move(dir)), out_(out), err_(err) {}
  ~OutputRouter();
  OutputRouter(const OutputRouter&) = delete;
  OutputRouter& operator=(const OutputRouter&) = delete;
  // stream: 1 stdout, 2 stderr. `rank` is the prefix (and the file) of the lines.
  Result<void> write(const Source& from, int rank, int stream, std::span<const std::uint8_t> data);
  // Flushes a partial last line of the process at `from` (it ended).
  void finish(const Source& from);

 private:
  struct Pending {  // one process's stream: its incomplete last line
    int rank = -1;
    std::string partial;
  };
  Result<std::FILE*> file(int rank, int stream);
  void emit(int rank, int stream, std::string_view line, char end = '\n');
  void flush_partial(const Pending& p, int stream);

  std::string dir_;
  std::FILE* out_;
  std::FILE* err_;
  std::map<std::tuple<std::string, int, int>, Pending> pending_;  // (host, slot, stream)
  std::map<std::pair<int, int>, std::FILE*> files_;               // (rank, stream), with dir_
};

}  // namespace elasticrun::cmd
