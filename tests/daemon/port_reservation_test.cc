// The epoch's MASTER_PORT, held by rank 0's daemon: nobody else gets the port, except a
// socket that names it with SO_REUSEADDR (torch's TCPStore); each renewal is a new port.
#include "daemon/port_reservation.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <set>

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

TEST(PortReservation, EachRenewalIsANewPortAndFreesTheOldOne) {
  ed::PortReservation r;
  std::set<std::uint16_t> seen;
  std::uint16_t last = 0;
  for (int i = 0; i < 20; ++i) {
    auto port = r.renew();
    ASSERT_TRUE(port) << port.error();
    EXPECT_TRUE(seen.insert(*port).second) << "port " << *port << " given twice";
    if (last) EXPECT_EQ(try_bind(last, false), 0) << "the previous port " << last << " is still held";
    last = *port;
  }
}
