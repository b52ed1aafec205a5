#include "daemon/port_reservation.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

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

bool port_listening(std::uint16_t port) {
  // Each line after the header: "sl local_address rem_address st ...", the local
  // address as HEXADDR:HEXPORT, st 0A for LISTEN.
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      if (!(fields >> slot >> local >> remote >> state)) continue;
      auto colon = local.rfind(':');
      if (colon == std::string::npos || state != "0A") continue;
      if (std::strtoul(local.c_str() + colon + 1, nullptr, 16) == port) return true;
    }
  }
  return false;
}

}  // namespace elasticrun::daemon
