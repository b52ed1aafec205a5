// Starting elasticrund on a remote host through an SSH exec channel (libssh).
//
// The daemon's control channel is the SSH channel itself: frames go over its stdin and
// stdout, its stderr comes back prefixed with the host name. When the channel closes
// (driver gone, network cut), sshd closes the daemon's stdin and the daemon stops its
// workers. Connect, authentication and host-key checks run on a thread of their own per
// host, so launching on 32 hosts takes about as long as on one.
#pragma once

#include "cmd/daemon_link.h"
#include "common/socket_options.h"

#include <chrono>
#include <string>

namespace elasticrun::cmd {

enum class HostKeyCheck { yes, accept_new, no };

struct SshOptions {
  int port = 0;                  // 0: from ssh config, else 22
  std::string identity_file;     // empty: agent and default keys
  std::string known_hosts;       // empty: ~/.ssh/known_hosts
  std::string config_file;       // empty: ~/.ssh/config
  HostKeyCheck host_key_check = HostKeyCheck::yes;
  std::chrono::milliseconds connect_timeout{10000};
  // The job's host timeout, for the connection's TCP keep-alive (net::keep_alive).
  std::chrono::milliseconds keep_alive = net::kDefaultHostTimeout;
};

// `host` may be "user@name"; the daemon runs as `daemon_path --stdio`.
std::unique_ptr<DaemonLink> launch_ssh_daemon(boost::asio::io_context& io, const std::string& host,
                                              const std::string& daemon_path, const std::string& log_level,
                                              const SshOptions& options, DaemonEvents ev);

}  // namespace elasticrun::cmd
