// `elasticrund --listen`: the long-running daemon systemd keeps on each host.
//
// It accepts TCP connections from drivers, each one a job. A connection must prove the
// cluster secret before anything else (hello / auth / auth_ok, as every control
// connection does; the daemon proves it too). An authenticated connection is handed to
// a job process of its own: this program re-executed as `elasticrund --stdio` with the
// socket as its control channel, so a job under the daemon behaves exactly like one
// started over SSH, and jobs are isolated from each other and from the listener (a job
// that crashes takes nothing else down). The job's secret reaches it XORed with a pad
// derived from the cluster secret and both nonces, so it never crosses the network in
// the clear.
//
// Anything else (no hello answer in time, wrong secret, garbage, a frame too large) is
// logged with the peer's address and closes that connection only.
#pragma once

#include "common/accept_loop.h"
#include "common/auth.h"
#include "common/child_process.h"
#include "common/result.h"

#include <boost/asio.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace elasticrun::daemon {

struct ListenOptions {
  std::string address = "0.0.0.0";
  std::uint16_t port = 0;  // 0: any free port (tests)
  auth::Secret secret{};
  std::string state_dir;   // job records (see job_records.h)
  std::string self_exe = "/proc/self/exe";  // the program job processes run
  std::string log_level;   // passed on to job processes
  std::chrono::milliseconds handshake_timeout{5000};
  std::size_t max_handshakes = 64;  // connections not yet authenticated
};

class Listener {
 public:
  Listener(boost::asio::io_context& io, ListenOptions options);
  ~Listener();
  Result<void> start();
  std::uint16_t port() const;
  // Stops accepting, asks every job to stop its workers (SIGTERM), kills what is left
  // after `grace`, then calls `done`.
  void stop(std::chrono::milliseconds grace, std::function<void()> done);

 private:
  class Handshake;
  void on_socket(boost::asio::ip::tcp::socket socket);
  void start_job(boost::asio::ip::tcp::socket socket, const auth::Secret& pad, const std::string& peer);
  void on_job_exit(int pid, const std::string& peer, int status);
  void finish_if_stopped();

  boost::asio::io_context& io_;
  ListenOptions options_;
  boost::asio::ip::tcp::acceptor acceptor_;
  AcceptLoop accept_;
  boost::asio::steady_timer kill_timer_;
  std::shared_ptr<std::size_t> handshake_count_ = std::make_shared<std::size_t>(0);
  std::map<int, std::unique_ptr<ChildProcess>> jobs_;  // by pid
  bool stopping_ = false;
  std::function<void()> done_;
};

}  // namespace elasticrun::daemon
