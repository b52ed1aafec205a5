// Per-worker shared-memory directories: /dev/shm/elasticrun.<daemon pid>.<slot>.<n>, and
// the daemon's directory of error files.
//
// The daemon points each worker's UCX shared-memory transport there (UCX_POSIX_DIR) and
// removes the directory when the worker ends, so segments of a SIGKILLed worker do not
// outlive it. If the daemon itself dies, whoever notices first cleans up: the driver
// for a local daemon, or the next daemon started on that host (stale directories of
// dead daemons).
#pragma once

#include <cstdint>
#include <string>
#include <sys/types.h>

namespace elasticrun::shm_dirs {

std::string path(pid_t daemon, std::uint32_t slot, std::uint64_t n);
// The daemon's directory of its workers' error files (TORCHELASTIC_ERROR_FILE):
// /dev/shm/elasticrun.<daemon pid>.errors, cleaned up like the others.
std::string errors_path(pid_t daemon);
// Removes every directory of `daemon`.
void remove_all_of(pid_t daemon);
// Removes the directories of daemons that are no longer running.
void remove_stale();

}  // namespace elasticrun::shm_dirs
