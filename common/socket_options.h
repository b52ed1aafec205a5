// Socket settings every long-lived control connection uses.
#pragma once

namespace elasticrun::net {

// TCP keep-alives: a silent connection whose peer is gone (host down, link cut) is
// noticed after about idle + interval * count seconds; unacknowledged data gives up
// after the same bound (TCP_USER_TIMEOUT), so a blocked write cannot hang either.
void keep_alive(int fd, int idle_s = 10, int interval_s = 5, int count = 2);

}  // namespace elasticrun::net
