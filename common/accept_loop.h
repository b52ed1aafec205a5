// Accepting connections for as long as the acceptor is open, for the servers that take
// them from the network: the driver's rendezvous server and the daemon's listener.
//
// A failed accept is tried again after kRetry, not at once. The usual failure, too many
// open files (EMFILE, ENFILE), leaves the connection waiting in the listen queue, so an
// immediate retry fails the same way and the server spins at full CPU, logging each
// time, until some descriptor closes. It is logged once at warn, and once more when an
// accept works again.
#pragma once

#include "common/log.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <functional>
#include <memory>

namespace elasticrun {

class AcceptLoop {
 public:
  static constexpr std::chrono::milliseconds kRetry{100};
  using OnSocket = std::function<void(boost::asio::ip::tcp::socket)>;

  // `acceptor` must outlive this; its owner opens and closes it.
  AcceptLoop(boost::asio::ip::tcp::acceptor& acceptor, log::Component who, OnSocket on_socket);
  ~AcceptLoop() { *alive_ = false; }
  AcceptLoop(const AcceptLoop&) = delete;
  AcceptLoop& operator=(const AcceptLoop&) = delete;

  void start();
  // No more accepts, nor retries (the acceptor's pending operations are cancelled);
  // start() again resumes.
  void stop();
  // Accepts that failed since the last one that worked.
  unsigned failing() const { return failures_; }

 private:
  void accept();

  boost::asio::ip::tcp::acceptor& acceptor_;
  log::Component who_;
  OnSocket on_socket_;
  boost::asio::steady_timer retry_;
  bool stopped_ = true;
  unsigned failures_ = 0;
  // Read first by every handler: one may run after the loop was destroyed (an accept
  // that completed before, or was cancelled by, the owner's closing the acceptor).
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace elasticrun
