#include "daemon/device_hint.h"

#include "common/env.h"

#include <cstdlib>
#include <filesystem>
#include <string_view>

namespace elasticrun::daemon {

int count_gpus_in(const std::string& dir) {
  std::error_code ec;
  int n = 0;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) ++n;
  return n;
}

namespace {
bool all_digits(std::string_view s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
}
}  // namespace

int visible_gpus(int physical, const char* cuda_visible_devices) {
  if (!cuda_visible_devices) return physical;
  std::string_view rest(cuda_visible_devices);
  int n = 0;
  while (true) {
    auto comma = rest.find(',');
    std::string_view e = rest.substr(0, comma);
    while (!e.empty() && e.front() == ' ') e.remove_prefix(1);
    while (!e.empty() && e.back() == ' ') e.remove_suffix(1);
    bool uuid = e.starts_with("GPU-") || e.starts_with("MIG-");
    bool index = all_digits(e) && e.size() < 6 && std::stoi(std::string(e)) < physical;
    if (!uuid && !index) break;
    ++n;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return n;
}

std::optional<int> device_hint(int slot, int visible, bool user_chose) {
  if (user_chose || visible <= 0 || slot < 0) return std::nullopt;
  return slot % visible;
}

std::optional<int> worker_device_hint(int slot, const std::vector<std::string>& job_env) {
  auto has = [&](std::string_view key) {
    for (const auto& kv : job_env)
      if (kv.size() > key.size() && kv.starts_with(key) && kv[key.size()] == '=') return true;
    return false;
  };
  const char* own = std::getenv(env::kDevice);
  bool user_chose = has(env::kDevice) || has("CUDA_VISIBLE_DEVICES") || (own && *own);
  if (user_chose) return std::nullopt;
  return device_hint(slot, visible_gpus(count_gpus_in(), std::getenv("CUDA_VISIBLE_DEVICES")), false);
}

}  // namespace elasticrun::daemon
