// One worker's connection to the rendezvous server: handshake, then request frames.
#pragma once

#include "common/auth.h"
#include "common/handshake.h"
#include "common/frame.h"
#include "common/messages.h"
#include "rendezvous/assignment.h"

#include <boost/asio.hpp>

#include <deque>
#include <memory>
#include <optional>

namespace elasticrun::rendezvous {

class Server;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Server& server, boost::asio::ip::tcp::socket socket);
  void start(std::chrono::milliseconds handshake_timeout);
  template <class M>
  void send(const M& m) {
    send_frame(msg::to_frame(m));
  }
  void send_frame(const Frame& f);
  // Logs why and closes; the server forgets the session.
  void close(const std::string& why);

  const std::optional<WorkerPlace>& place() const { return place_; }
  std::uint64_t epoch() const { return epoch_; }
  void joined(const WorkerPlace& p, std::uint64_t epoch) {
    place_ = p;
    epoch_ = epoch;
  }
  const std::string& peer() const { return peer_; }

 private:
  enum class Phase { auth, join, ready, closed };
  void read();
  void write_next();
  void handle(const Frame& f);
  void handle_auth(const Frame& f);

  Server& server_;
  boost::asio::ip::tcp::socket socket_;
  boost::asio::steady_timer handshake_timer_;
  std::string peer_;
  Phase phase_ = Phase::auth;
  std::optional<handshake::Server> handshake_;
  FrameParser parser_;
  // Not zero-filled: thousands of sessions would each touch the whole buffer.
  std::array<std::uint8_t, 4096> rbuf_;
  std::deque<wire::Bytes> wqueue_;
  bool left_ = false;
  std::optional<WorkerPlace> place_;
  std::uint64_t epoch_ = 0;
};

}  // namespace elasticrun::rendezvous
