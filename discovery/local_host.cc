#include "discovery/local_host.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <string>

namespace elasticrun::discovery {
namespace {

std::string addr_key(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  else if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  return buf;
}

bool is_loopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa->sa_family == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
  return false;
}

}  // namespace

std::string bare_name(const std::string& full) {
  std::string name = full.substr(full.find('@') == std::string::npos ? 0 : full.find('@') + 1);
  if (name.size() > 2 && name.front() == '[' && name.back() == ']') name = name.substr(1, name.size() - 2);
  return name;
}

namespace {

bool is_self(const std::string& name) {
  char self[256] = {};
  return ::gethostname(self, sizeof self - 1) == 0 && name == self;
}

// One resolution of `name` (with port 9, discard, for a UDP connect), or null.
addrinfo* resolve(const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(name.c_str(), "9", &hints, &res) != 0 || !res) return nullptr;
  return res;
}

// Whether every address is a loopback one or one of our interfaces'.
bool all_local(const addrinfo* res) {
  std::set<std::string> local;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i; i = i->ifa_next)
      if (i->ifa_addr) local.insert(addr_key(i->ifa_addr));
    ::freeifaddrs(ifs);
  }
  for (const addrinfo* a = res; a; a = a->ai_next)
    if (!is_loopback(a->ai_addr) && !local.count(addr_key(a->ai_addr))) return false;
  return true;
}

// Our address that traffic to the first address leaves from (a UDP connect sends nothing).
std::string toward(const addrinfo* res) {
  std::string out;
  int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0)
    out = addr_key(reinterpret_cast<sockaddr*>(&local));
  if (fd >= 0) ::close(fd);
  if (out.find(':') != std::string::npos) out = "[" + out + "]";
  return out;
}

}  // namespace

HostPlace look_up_host(const std::string& full) {
  std::string name = bare_name(full);
  if (is_self(name)) return {true, ""};
  addrinfo* res = resolve(name);
  if (!res) return {};
  HostPlace p;
  p.local = all_local(res);
  if (!p.local) p.toward = toward(res);
  ::freeaddrinfo(res);
  return p;
}

}  // namespace elasticrun::discovery
