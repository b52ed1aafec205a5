// Worker output, multiplexed onto the driver's stdout/stderr line by line with a
// rank prefix ("[2]<stdout>: ..."), and optionally tee'd to DIR/rank.N/{stdout,stderr}.
//
// Chunks arrive in arbitrary pieces; a line is printed only once complete (or when
// its stream ends), so lines from different ranks never interleave mid-line.
#pragma once

#include "common/result.h"

#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>

namespace elasticrun::cmd {

class OutputRouter {
 public:
  explicit OutputRouter(std::string dir, std::FILE* out = stdout, std::FILE* err = stderr)
      : dir_(std::move(dir)), out_(out), err_(err) {}
  ~OutputRouter();
  // stream: 1 stdout, 2 stderr.
  Result<void> write(int rank, int stream, std::span<const std::uint8_t> data);
  // Flushes a partial last line of this rank (its process ended).
  void finish(int rank);

 private:
  struct Stream {
    std::string partial;
    std::FILE* file = nullptr;
  };
  Result<Stream*> stream(int rank, int stream);
  void emit(int rank, int stream, std::string_view line);

  std::string dir_;
  std::FILE* out_;
  std::FILE* err_;
  std::map<std::pair<int, int>, Stream> streams_;
};

}  // namespace elasticrun::cmd
