#include "control/settings.h"

#include "common/env.h"
#include "common/socket_options.h"

#include <elasticrun/types.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace elasticrun::collective {
namespace {

// The variable's value, or null when it is unset or empty (both mean the default).
const char* value_of(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

std::string bad(const char* name, const char* v, const char* rule) {
  return std::string(name) + "='" + v + "' is not " + rule;
}

std::string required(const char* name) {
  const char* v = value_of(name);
  if (!v)
    throw Error(std::string(name) + " is not set: run this program under elasticrun (elasticrun -np N " +
                "program ...)");
  return v;
}

long long non_negative(const char* name) {
  std::string v = required(name);
  char* end = nullptr;
  long long n = std::strtoll(v.c_str(), &end, 10);
  if (*end != '\0' || n < 0) throw Error(bad(name, v.c_str(), "a non-negative integer"));
  return n;
}

std::chrono::milliseconds seconds(const char* name, std::chrono::milliseconds fallback) {
  const char* v = value_of(name);
  if (!v) return fallback;
  char* end = nullptr;
  double s = std::strtod(v, &end);
  if (*end != '\0' || !(s > 0) || s > settings::kMaxSeconds)
    throw Error(bad(name, v, "a positive number of seconds"));
  return std::chrono::milliseconds(static_cast<long long>(s * 1000));
}

}  // namespace

Algorithm parse_algorithm(const std::string& s, const char* what) {
  if (s == "auto") return Algorithm::automatic;
  if (s == "ring") return Algorithm::ring;
  if (s == "rd") return Algorithm::rd;
  if (s == "rhd") return Algorithm::rhd;
  if (s == "shm") return Algorithm::shm;
  if (s == "hier") return Algorithm::hier;
  if (s == "rails") return Algorithm::rails;
  if (s == "direct") return Algorithm::direct;
  if (s == "twoshot") return Algorithm::twoshot;
  throw Error(std::string(what) + ": unknown algorithm '" + s +
              "' (expected auto, shm, hier, rails, ring, rd, rhd, direct or twoshot)");
}

Progress parse_progress(const std::string& s, const char* what) {
  if (s == "auto") return Progress::automatic;
  if (s == "busy") return Progress::busy;
  if (s == "block") return Progress::block;
  throw Error(std::string(what) + ": unknown progress mode '" + s + "' (expected auto, busy or block)");
}

std::optional<int> parse_device(const char* value, const char* name) {
  if (!value || !*value) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  bool digit_first = *value >= '0' && *value <= '9';  // strtol would accept " 1" and "+1"
  long n = std::strtol(value, &end, 10);
  if (!digit_first || *end != '\0' || errno != 0 || n < 0 || n > 1 << 20)
    throw Error(bad(name, value, "a device index (a non-negative integer)"));
  return static_cast<int>(n);
}

namespace settings {

Worker worker() {
  Worker w;
  w.secret_hex = required(env::kSecret);
  w.host = required(env::kHost);
  w.slot = static_cast<int>(non_negative(env::kSlot));
  w.epoch = static_cast<std::uint64_t>(non_negative(env::kEpoch));
  w.rendezvous = required(env::kRendezvousAddr);
  return w;
}

std::chrono::milliseconds collective_timeout() { return seconds(env::kCollectiveTimeout, kDefaultCollectiveTimeout); }

std::chrono::milliseconds rejoin_timeout(std::chrono::milliseconds collective) {
  return std::max(collective, seconds(env::kRejoinTimeout, collective));
}

std::chrono::milliseconds host_timeout() { return seconds(env::kHostTimeout, net::kDefaultHostTimeout); }

Algorithm algorithm() {
  const char* v = value_of(env::kAlgorithm);
  return v ? parse_algorithm(v, env::kAlgorithm) : Algorithm::automatic;
}

Progress progress() {
  const char* v = value_of(env::kProgress);
  return v ? parse_progress(v, env::kProgress) : Progress::automatic;
}

std::optional<std::size_t> segment() {
  const char* v = value_of(env::kSegment);
  if (!v) return std::nullopt;
  const std::string rule = "a byte count from 1K to 64M (digits, then K or M for KiB or MiB)";
  char* end = nullptr;
  errno = 0;
  unsigned long long n = std::strtoull(v, &end, 10);
  if (*v < '0' || *v > '9' || errno != 0) throw Error(bad(env::kSegment, v, rule.c_str()));
  std::size_t unit = 1;
  if ((*end == 'K' || *end == 'k') && end[1] == '\0') unit = 1024;
  else if ((*end == 'M' || *end == 'm') && end[1] == '\0') unit = 1024 * 1024;
  else if (*end != '\0') throw Error(bad(env::kSegment, v, rule.c_str()));
  if (n > kMaxSegment / unit || n * unit < kMinSegment) throw Error(bad(env::kSegment, v, rule.c_str()));
  return static_cast<std::size_t>(n * unit);
}

std::optional<int> device() { return parse_device(std::getenv(env::kDevice), env::kDevice); }
std::optional<int> device_hint() { return parse_device(std::getenv(env::kDeviceHint), env::kDeviceHint); }

namespace {
bool zero_or_one(const char* name) {
  const char* v = value_of(name);
  if (!v || std::string(v) == "1") return true;
  if (std::string(v) == "0") return false;
  throw Error(bad(name, v, "0 or 1"));
}
}  // namespace

bool nccl_shrink() { return zero_or_one(env::kNcclShrink); }
bool tune() { return zero_or_one(env::kTune); }

std::optional<Checkpoint> checkpoint() {
  const char* dir = value_of(env::kCheckpointDir);
  if (!dir) return std::nullopt;
  Checkpoint c;
  c.dir = dir;
  if (const char* v = value_of(env::kCheckpointEvery)) {
    char* end = nullptr;
    errno = 0;
    long long n = std::strtoll(v, &end, 10);
    if (*v < '0' || *v > '9' || *end != '\0' || errno != 0 || n < 0)
      throw Error(bad(env::kCheckpointEvery, v, "a non-negative integer (commits)"));
    c.every = static_cast<std::uint64_t>(n);
  }
  if (const char* v = value_of(env::kCheckpointInterval)) {
    char* end = nullptr;
    double s = std::strtod(v, &end);
    if (*end != '\0' || !(s >= 0) || s > kMaxSeconds)
      throw Error(bad(env::kCheckpointInterval, v, "a non-negative number of seconds"));
    c.interval = std::chrono::milliseconds(static_cast<long long>(s * 1000));
  }
  if (c.every == 0 && c.interval.count() == 0)
    throw Error(std::string(env::kCheckpointEvery) + " and " + env::kCheckpointInterval +
                " are both 0: no checkpoint would ever be written");
  return c;
}

}  // namespace settings
}  // namespace elasticrun::collective
