// The limit on open files (RLIMIT_NOFILE) of elasticrun and elasticrund.
#pragma once

#include <cstdint>

namespace elasticrun {

// Raises this process's soft limit on open files to its hard limit (at most the kernel's
// fs.nr_open), as Open MPI's launcher does, and returns the soft limit in force after.
// The driver holds a connection for each worker and a daemon pipes for each of its
// workers, so Debian's usual soft limit (1024) would stop a job of a thousand workers;
// the hard limit is what the administrator allows. Children inherit the raised limit.
std::uint64_t raise_open_file_limit();

}  // namespace elasticrun
