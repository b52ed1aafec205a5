// The limit on open files (RLIMIT_NOFILE) of elasticrun and elasticrund.
#pragma once

#include <cstdint>

namespace elasticrun {

// Raises this process's soft limit on open files to its hard limit, at most
// kMaxOpenFiles, and returns the soft limit in force after.
// The driver holds a connection for each worker and a daemon pipes for each of its
// workers, so Debian's usual soft limit (1024) would stop a job of a thousand workers;
// the hard limit is what the administrator allows. Children inherit the raised limit,
// hence the cap: a program that walks every possible descriptor (closing them all before
// an exec, say) stays quick.
inline constexpr std::uint64_t kMaxOpenFiles = 65536;
std::uint64_t raise_open_file_limit();

}  // namespace elasticrun
