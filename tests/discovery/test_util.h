// Helpers for the discovery tests: temp dirs with real scripts, and running an
// io_context until something happened (always with a deadline).
#pragma once

#include "discovery/host_source.h"

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace elasticrun::discovery::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Writes `body` to dir/name with mode 0755 (or `mode`) and returns the path.
std::string write_script(const TempDir& dir, const std::string& name, const std::string& body, int mode = 0755);
// Replaces a file atomically (write + rename), so a script never reads half of it.
void write_file(const std::string& path, const std::string& text);
std::string read_file(const std::string& path);

// Runs `io` until `done()` holds or `limit` passes; returns whether it held.
bool run_until(boost::asio::io_context& io, const std::function<bool()>& done,
               std::chrono::milliseconds limit = std::chrono::seconds(5));

// One poll of `src`, waiting at most `limit`; nullopt when no answer came.
std::optional<Result<std::vector<Host>>> poll_once(boost::asio::io_context& io, HostSource& src,
                                                   std::chrono::milliseconds limit = std::chrono::seconds(5));

// Whether `pid` no longer runs (gone, or a zombie waiting for its new parent).
bool process_gone(int pid);
// This process's children that have exited but were not reaped.
std::vector<int> zombie_children();
// Waits up to `limit` for process_gone(pid).
bool wait_gone(int pid, std::chrono::milliseconds limit = std::chrono::seconds(3));

}  // namespace elasticrun::discovery::testing
