// Per-worker shared-memory directories: /dev/shm/elasticrun.<daemon pid>.<pidns>.<slot>.<n>,
// and the daemon's directory of error files.
//
// The daemon points each worker's UCX shared-memory transport there (UCX_POSIX_DIR) and
// removes the directory when the worker ends, so segments of a SIGKILLed worker do not
// outlive it. If the daemon itself dies, whoever notices first cleans up: the driver
// for a local daemon, or the next daemon started on that host (stale directories of
// dead daemons).
//
// <pidns> is the inode of the daemon's PID namespace (/proc/self/ns/pid): a pid names a
// process only within its namespace, and /dev/shm can be shared across them (containers
// run with --ipc=host, pods sharing a volume there). Without it two daemons of two
// namespaces, each pid 2 in its own, shared a directory, and one took the other's for a
// dead daemon's. Only directories of this namespace are cleaned up here (and those of
// the format before it, elasticrun.<pid>.<slot>.<n>, which had no namespace).
#pragma once

#include <cstdint>
#include <string>
#include <sys/types.h>

namespace elasticrun::shm_dirs {

// The inode number of this process's PID namespace; 0 where it cannot be read.
std::uint64_t pid_namespace();
std::string path(pid_t daemon, std::uint32_t slot, std::uint64_t n);
// The daemon's directory of its workers' error files (TORCHELASTIC_ERROR_FILE):
// /dev/shm/elasticrun.<daemon pid>.<pidns>.errors, cleaned up like the others.
std::string errors_path(pid_t daemon);
// Removes every directory of `daemon`.
void remove_all_of(pid_t daemon);
// Removes the directories of daemons that are no longer running.
void remove_stale();

}  // namespace elasticrun::shm_dirs
