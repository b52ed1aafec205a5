#include "common/fd_limit.h"

#include <sys/resource.h>

#include <fstream>

namespace elasticrun {

std::uint64_t raise_open_file_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  rlim_t want = rl.rlim_max;
  if (want == RLIM_INFINITY) {
    // setrlimit refuses more than fs.nr_open.
    std::uint64_t nr_open = 1u << 20;
    std::ifstream("/proc/sys/fs/nr_open") >> nr_open;
    want = static_cast<rlim_t>(nr_open);
  }
  if (want > rl.rlim_cur) {
    rlimit raised{want, rl.rlim_max};
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl.rlim_cur = want;
  }
  return rl.rlim_cur;
}

}  // namespace elasticrun
