#include "common/fd_limit.h"

#include <sys/resource.h>

#include <algorithm>

namespace elasticrun {

std::uint64_t raise_open_file_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  rlim_t want = std::min<rlim_t>(rl.rlim_max, kMaxOpenFiles);  // RLIM_INFINITY is the largest value
  if (want > rl.rlim_cur) {
    rlimit raised{want, rl.rlim_max};
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl.rlim_cur = want;
  }
  return rl.rlim_cur;
}

}  // namespace elasticrun
