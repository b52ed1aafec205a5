#include "cmd/events.h"

#include <cmath>

namespace elasticrun::cmd {

EventLog::~EventLog() {
  if (file_) std::fclose(file_);
}

bool EventLog::open(const std::string& path) {
  if (path.empty()) return true;
  file_ = std::fopen(path.c_str(), "a");
  return file_ != nullptr;
}

void EventLog::emit(const std::string& event, nlohmann::json fields) {
  if (!file_) return;
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  nlohmann::json line = {{"t", std::round(t * 1e6) / 1e6}, {"event", event}};
  line.update(fields);
  // Text from workers (an error file) may hold bytes that are not UTF-8: replaced, not thrown on.
  std::string s = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::fwrite(s.data(), 1, s.size(), file_);
  std::fflush(file_);  // readers (tests, scripts) follow the file live
}

}  // namespace elasticrun::cmd
