// A TCP port held free on this host for one epoch's MASTER_PORT (torchrun's variable: rank
// 0's torch TCPStore listens on it).
//
// Only this host can know which of its ports are free, and a port merely found free can
// be taken by anyone before rank 0 gets to listen on it. So the daemon binds the port
// itself (port 0: the kernel picks one) and keeps it bound without listening, with
// SO_REUSEADDR: the kernel then gives that port to nobody who asks for any free port
// (bind to port 0, outgoing connections), while a socket that names it and sets
// SO_REUSEADDR too, as torch's TCPStore does, can still bind it and listen. Nothing
// listens on it meanwhile: a peer that connects early is refused and retries, as it
// would with torchrun.
#pragma once

#include "common/result.h"
#include "common/unique_fd.h"

#include <cstdint>

namespace elasticrun::daemon {

class PortReservation {
 public:
  // Reserves a new port and only then lets go of the one held before, so that the new
  // one differs from it.
  Result<std::uint16_t> renew();
  std::uint16_t port() const { return port_; }
  void release();

 private:
  UniqueFd fd_;
  std::uint16_t port_ = 0;
};

// Whether a TCP socket of this network namespace listens on `port` (any address, IPv4
// or IPv6), from /proc/net/tcp and /proc/net/tcp6: how the daemon learns that the store
// it started for the port is up, without connecting to it.
bool port_listening(std::uint16_t port);

}  // namespace elasticrun::daemon
