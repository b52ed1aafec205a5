#include "common/socket_options.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>

namespace elasticrun::net {

void keep_alive(int fd, std::chrono::milliseconds host_timeout) {
  int on = 1, count = 2;
  auto ms = std::max<long long>(host_timeout.count() * 3 / 2, 1000);
  auto ceil_s = [](long long m) { return static_cast<int>(std::max<long long>(1, (m + 999) / 1000)); };
  int idle_s = ceil_s(ms / 2);
  int interval_s = ceil_s((ms - idle_s * 1000LL) / count);
  auto user_timeout_ms = static_cast<unsigned>(std::max<long long>(ms, (idle_s + interval_s * count) * 1000LL));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
}

}  // namespace elasticrun::net
