// The library's settings: every ELASTICRUN_* variable libelasticrun reads, each with its
// default and its rule here and nowhere else (the names are declared in common/env.h,
// the user-facing text is libelasticrun(3)). A value that breaks its rule is an Error
// naming the variable and the value; unset and empty mean the default.
//
// Each setting is read when the object that needs it is built, as one function here:
// ELASTICRUN_ALGORITHM at every collective (a test program may switch algorithms between
// calls), the device variables when a device is chosen, the timeouts when a context or
// device communicator is made. Reading them all up front would make, say, a bad
// ELASTICRUN_DEVICE fail a program that never touches a GPU.
#pragma once

#include "common/env.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace elasticrun::collective {

enum class Algorithm { automatic, ring, rd, rhd, shm, hier, direct, twoshot, rails };
enum class Progress { automatic, busy, block };

// Parses "auto|ring|rd|rhd|shm|hier|rails|direct|twoshot" and "auto|busy|block"; throws Error naming `what` otherwise.
Algorithm parse_algorithm(const std::string& s, const char* what);
Progress parse_progress(const std::string& s, const char* what);
// A device index, the value of the variable `name`: a non-negative integer (at most 2^20).
// Null or empty means unset. Throws Error naming the variable otherwise.
std::optional<int> parse_device(const char* value, const char* name = env::kDevice);

namespace settings {

// ELASTICRUN_COLLECTIVE_TIMEOUT's default: the deadline of every collective and wait.
inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout{300000};
// The longest accepted value of a seconds setting (about 116 days).
inline constexpr double kMaxSeconds = 1e7;

// What elasticrund sets for every worker; all required ("... is not set: run this program
// under elasticrun"), slot and epoch non-negative integers.
struct Worker {
  std::string secret_hex;  // ELASTICRUN_SECRET (checked by auth::secret_from_hex)
  std::string host;        // ELASTICRUN_HOST
  int slot = 0;            // ELASTICRUN_SLOT
  std::uint64_t epoch = 0; // ELASTICRUN_EPOCH
  std::string rendezvous;  // ELASTICRUN_RENDEZVOUS_ADDR, host:port
};
Worker worker();

// The three seconds settings: a positive number of seconds up to kMaxSeconds.
// ELASTICRUN_COLLECTIVE_TIMEOUT, default kDefaultCollectiveTimeout.
std::chrono::milliseconds collective_timeout();
// ELASTICRUN_REJOIN_TIMEOUT, never shorter than `collective` (its default).
std::chrono::milliseconds rejoin_timeout(std::chrono::milliseconds collective);
// ELASTICRUN_HOST_TIMEOUT, default net::kDefaultHostTimeout.
std::chrono::milliseconds host_timeout();

// ELASTICRUN_ALGORITHM (parse_algorithm) and ELASTICRUN_PROGRESS (parse_progress), default auto.
Algorithm algorithm();
Progress progress();

// ELASTICRUN_SEGMENT: the UCX algorithms' pipeline chunk in bytes, an integer with an
// optional K or M suffix (binary), from kMinSegment to kMaxSegment; unset: by layout
// (HostCommConfig::segment).
inline constexpr std::size_t kMinSegment = 1024;
inline constexpr std::size_t kMaxSegment = 64 * 1024 * 1024;
std::optional<std::size_t> segment();

// ELASTICRUN_DEVICE and ELASTICRUN_DEVICE_HINT (parse_device); unset by default.
std::optional<int> device();
std::optional<int> device_hint();

// ELASTICRUN_TUNE: "1" (default) or "0" (HostCommConfig::tune).
bool tune();

// ELASTICRUN_NCCL_SHRINK: "1" (default) or "0".
bool nccl_shrink();

// Durable checkpoints: ELASTICRUN_CHECKPOINT_DIR (unset: none), ELASTICRUN_CHECKPOINT_EVERY
// (a non-negative integer of commits, 0: not by count; default kDefaultCheckpointEvery) and
// ELASTICRUN_CHECKPOINT_INTERVAL (non-negative seconds, 0: not by time; default
// kDefaultCheckpointInterval). Both 0 is an Error: no checkpoint would ever be written.
inline constexpr std::uint64_t kDefaultCheckpointEvery = 10;
inline constexpr std::chrono::milliseconds kDefaultCheckpointInterval{60000};
struct Checkpoint {
  std::string dir;
  std::uint64_t every = kDefaultCheckpointEvery;
  std::chrono::milliseconds interval = kDefaultCheckpointInterval;
};
std::optional<Checkpoint> checkpoint();

}  // namespace settings
}  // namespace elasticrun::collective
