// Socket settings every long-lived control connection uses.
#pragma once

#include <chrono>

namespace elasticrun::net {

// How long a control connection may stay silent before its peer is taken for gone,
// unless the job says otherwise (elasticrun --host-timeout).
inline constexpr std::chrono::milliseconds kDefaultHostTimeout{10000};

// TCP keep-alives: a silent connection whose peer is gone (host down, link cut) is
// noticed after about `within` (idle for half of it, then two probes), never sooner;
// unacknowledged data gives up after the same bound (TCP_USER_TIMEOUT), so a blocked
// write cannot hang either. The kernel counts in whole seconds: below 3 s the bound
// is 3 s.
void keep_alive(int fd, std::chrono::milliseconds within = kDefaultHostTimeout);

}  // namespace elasticrun::net
