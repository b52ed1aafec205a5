#include "daemon/port_reservation.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace elasticrun::daemon {

Result<std::uint16_t> PortReservation::renew() {
  // Close-on-exec: workers must not inherit it, or the port would outlive its epoch.
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return fail(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
    return fail(std::string("SO_REUSEADDR: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    return fail(std::string("bind: ") + std::strerror(errno));
  socklen_t len = sizeof a;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return fail(std::string("getsockname: ") + std::strerror(errno));
  fd_ = std::move(fd);
  port_ = ntohs(a.sin_port);
  return port_;
}

void PortReservation::release() {
  fd_.reset();
  port_ = 0;
}

}  // namespace elasticrun::daemon
