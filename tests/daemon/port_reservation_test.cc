// The epoch's MASTER_PORT, held by rank 0's daemon: nobody else gets the port, except a
// socket that names it with SO_REUSEADDR (torch's TCPStore); each renewal is a new port.
#include "daemon/port_reservation.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>

namespace ed = elasticrun::daemon;

namespace {

// Binds a new socket to 0.0.0.0:port (optionally with SO_REUSEADDR); the errno, 0 on
// success. With `listen_too` it also listens.
int try_bind(std::uint16_t port, bool reuse, bool listen_too = false) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  if (reuse) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(port);
  int err = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 ? 0 : errno;
  if (err == 0 && listen_too && ::listen(fd, 1) != 0) err = errno;
  ::close(fd);
  return err;
}

}  // namespace

TEST(PortReservation, HeldFromPlainBindsButOpenToAListenerThatReusesIt) {
  ed::PortReservation r;
  auto port = r.renew();
  ASSERT_TRUE(port) << port.error();
  ASSERT_NE(*port, 0);
  EXPECT_EQ(r.port(), *port);
  EXPECT_EQ(try_bind(*port, false), EADDRINUSE);
  EXPECT_EQ(try_bind(*port, true, true), 0);  // as torch's TCPStore binds and listens
  r.release();
  EXPECT_EQ(try_bind(*port, false), 0);
}

// A renewal's port differs from the one it replaces (the old one is held while the
// kernel picks the new one), and the old one is then free. Ports from earlier renewals
// may come back: the kernel picks at random among the free ones, so 20 renewals repeat
// one about 2% of the time, which is fine and not asserted.
TEST(PortReservation, EachRenewalIsANewPortAndFreesTheOldOne) {
  ed::PortReservation r;
  std::uint16_t last = 0;
  for (int i = 0; i < 20; ++i) {
    auto port = r.renew();
    ASSERT_TRUE(port) << port.error();
    EXPECT_NE(*port, last) << "renewal " << i << " gave the port it replaces";
    if (last) EXPECT_EQ(try_bind(last, false), 0) << "the previous port " << last << " is still held";
    last = *port;
  }
}

// How the daemon learns that the store it started listens: a held port is not
// listening, the same port with a listener (IPv4 or IPv6) is.
TEST(PortReservation, ListeningIsSeenOnlyWhileSomethingListens) {
  ed::PortReservation r;
  auto port = r.renew();
  ASSERT_TRUE(port) << port.error();
  EXPECT_FALSE(ed::port_listening(*port));
  for (int family : {AF_INET, AF_INET6}) {
    int fd = ::socket(family, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage s{};
    socklen_t len;
    if (family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&s);
      a->sin_family = AF_INET, a->sin_port = htons(*port), a->sin_addr.s_addr = htonl(INADDR_ANY);
      len = sizeof *a;
    } else {
      auto* a = reinterpret_cast<sockaddr_in6*>(&s);
      a->sin6_family = AF_INET6, a->sin6_port = htons(*port), a->sin6_addr = in6addr_any;
      len = sizeof *a;
    }
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&s), len), 0) << family << ": " << std::strerror(errno);
    EXPECT_FALSE(ed::port_listening(*port)) << family;  // bound is not listening
    ASSERT_EQ(::listen(fd, 1), 0);
    EXPECT_TRUE(ed::port_listening(*port)) << family;
    ::close(fd);
    EXPECT_FALSE(ed::port_listening(*port)) << family;
  }
}
