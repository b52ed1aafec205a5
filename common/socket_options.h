// Socket settings every long-lived control connection uses.
#pragma once

#include <chrono>

namespace elasticrun::net {

// How long a control connection may stay silent before its peer is taken for gone,
// unless the job says otherwise (elasticrun --host-timeout).
inline constexpr std::chrono::milliseconds kDefaultHostTimeout{10000};

// TCP keep-alives, the backstop behind the driver's and daemons' heartbeats: a silent
// connection whose peer is gone (host down, link cut) is given up after about 1.5 x
// `host_timeout` (idle for half of that, then two probes), so that the heartbeats,
// which notice after `host_timeout`, report it first and by name. Unacknowledged data
// gives up after the same bound (TCP_USER_TIMEOUT), so a blocked write cannot hang
// either. The kernel counts in whole seconds: the bound is at least 3 s.
void keep_alive(int fd, std::chrono::milliseconds host_timeout = kDefaultHostTimeout);

}  // namespace elasticrun::net
