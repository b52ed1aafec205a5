#include "common/shm_dirs.h"

#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

namespace elasticrun::shm_dirs {
namespace {

constexpr const char* kRoot = "/dev/shm";
constexpr std::string_view kPrefix = "elasticrun.";

// The daemon pid in a directory name of this PID namespace, or -1 if the name is not
// ours: elasticrun.<pid>.<pidns>.<slot>.<n> and elasticrun.<pid>.<pidns>.errors, or the
// names before the namespace was in them (elasticrun.<pid>.<slot>.<n>,
// elasticrun.<pid>.errors), taken for this namespace's.
pid_t owner(const std::string& name) {
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
  std::vector<std::string> f;
  for (std::size_t at = kPrefix.size();;) {
    std::size_t dot = name.find('.', at);
    f.push_back(name.substr(at, dot == std::string::npos ? std::string::npos : dot - at));
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  auto number = [](const std::string& s) -> long long {
    if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoll(s);
  };
  long long pid = number(f[0]);
  if (pid <= 0) return -1;
  bool old_format =
      (f.size() == 3 && number(f[1]) >= 0 && number(f[2]) >= 0) || (f.size() == 2 && f[1] == "errors");
  if (old_format) return static_cast<pid_t>(pid);
  bool named = (f.size() == 4 && number(f[2]) >= 0) || (f.size() == 3 && f[2] == "errors");
  if (!named || number(f[1]) < 0) return -1;
  return static_cast<std::uint64_t>(number(f[1])) == pid_namespace() ? static_cast<pid_t>(pid) : -1;
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

std::uint64_t pid_namespace() {
  static const std::uint64_t ns = [] {
    struct stat st {};
    return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
  }();
  return ns;
}

std::string path(pid_t daemon, std::uint32_t slot, std::uint64_t n) {
  return std::string(kRoot) + "/" + std::string(kPrefix) + std::to_string(daemon) + "." +
         std::to_string(pid_namespace()) + "." + std::to_string(slot) + "." + std::to_string(n);
}

std::string errors_path(pid_t daemon) {
  return std::string(kRoot) + "/" + std::string(kPrefix) + std::to_string(daemon) + "." +
         std::to_string(pid_namespace()) + ".errors";
}

void remove_all_of(pid_t daemon) {
  remove_if([daemon](pid_t p) { return p == daemon; });
}

void remove_stale() {
  remove_if([](pid_t p) { return ::kill(p, 0) != 0 && errno == ESRCH; });
}

}  // namespace elasticrun::shm_dirs
