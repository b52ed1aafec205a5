#include "common/shm_dirs.h"

#include <signal.h>

#include <cerrno>
#include <filesystem>

namespace elasticrun::shm_dirs {
namespace {

constexpr const char* kRoot = "/dev/shm";
constexpr std::string_view kPrefix = "elasticrun.";

// The daemon pid in a directory name, or -1 if the name is not ours.
pid_t owner(const std::string& name) {
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
  std::size_t end = name.find('.', kPrefix.size());
  if (end == std::string::npos) return -1;
  try {
    return static_cast<pid_t>(std::stol(name.substr(kPrefix.size(), end - kPrefix.size())));
  } catch (const std::exception&) {
    return -1;
  }
}

template <class Pred>
void remove_if(Pred pred) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(kRoot, ec)) {
    pid_t pid = owner(e.path().filename().string());
    if (pid > 0 && pred(pid)) std::filesystem::remove_all(e.path(), ec);
  }
}

}  // namespace

std::string path(pid_t daemon, std::uint32_t slot, std::uint64_t n) {
  return std::string(kRoot) + "/" + std::string(kPrefix) + std::to_string(daemon) + "." + std::to_string(slot) + "." +
         std::to_string(n);
}

std::string errors_path(pid_t daemon) {
  return std::string(kRoot) + "/" + std::string(kPrefix) + std::to_string(daemon) + ".errors";
}

void remove_all_of(pid_t daemon) {
  remove_if([daemon](pid_t p) { return p == daemon; });
}

void remove_stale() {
  remove_if([](pid_t p) { return ::kill(p, 0) != 0 && errno == ESRCH; });
}

}  // namespace elasticrun::shm_dirs
