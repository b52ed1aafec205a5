// Reaching the long-running `elasticrund --listen` of a host over TCP (--daemon-port).
//
// The link proves the cluster secret and checks that the daemon proves it too (see
// common/auth.h), then speaks the same frames as over SSH. The job secret inside the
// config frame travels XORed with a pad only the two ends can compute. When the link
// closes, the daemon's job process stops its workers, as an SSH-started daemon does.
#pragma once

#include "cmd/daemon_link.h"
#include "common/auth.h"

#include <chrono>
#include <cstdint>
#include <string>

namespace elasticrun::cmd {

std::unique_ptr<DaemonLink> connect_daemon(boost::asio::io_context& io, const std::string& host, std::uint16_t port,
                                           const auth::Secret& cluster_secret,
                                           std::chrono::milliseconds connect_timeout,
                                           std::chrono::milliseconds host_timeout, DaemonEvents ev);

}  // namespace elasticrun::cmd
