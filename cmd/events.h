// --events FILE: one JSON object per line for everything a script or test may want to
// follow: hosts added/removed/blacklisted, epochs (with the assignment), workers
// started/exited, resets, rank 0's reports, the job's end. Every line has "t" (seconds since the job
// started) and "event".
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <string>

namespace elasticrun::cmd {

class EventLog {
 public:
  EventLog() = default;
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;
  // Opens `path` for appending; an empty path disables the log. False if it cannot.
  bool open(const std::string& path);
  void emit(const std::string& event, nlohmann::json fields = nlohmann::json::object());

 private:
  std::FILE* file_ = nullptr;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace elasticrun::cmd
