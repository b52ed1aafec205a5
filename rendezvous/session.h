// One worker's connection to the rendezvous server: handshake, then request frames.
#pragma once

#include "common/auth.h"
#include "common/framed_stream.h"
#include "common/handshake.h"
#include "common/messages.h"
#include "rendezvous/assignment.h"

#include <boost/asio.hpp>

#include <chrono>
#include <memory>
#include <optional>

namespace elasticrun::rendezvous {

class Session;

// What a session asks of its server: requests of joined workers, and its end. The
// server answers through the session.
class SessionHost {
 public:
  virtual void on_join(const std::shared_ptr<Session>& s, const msg::Join& j) = 0;
  virtual void on_rejoin(const std::shared_ptr<Session>& s, const msg::Rejoin& r) = 0;
  virtual void on_kv_set(const std::shared_ptr<Session>& s, msg::KvSet m) = 0;
  virtual void on_kv_get(const std::shared_ptr<Session>& s, const msg::KvGet& m) = 0;
  virtual void on_barrier(const std::shared_ptr<Session>& s, const msg::Barrier& m) = 0;
  virtual void on_report(const std::shared_ptr<Session>& s, msg::Report m) = 0;
  virtual void on_checkpoint_note(const std::shared_ptr<Session>& s, const msg::CheckpointNote& m) = 0;
  virtual void on_synced(const std::shared_ptr<Session>& s, const msg::Synced& m) = 0;
  // A joined worker sent a frame (any: a request, a heartbeat, a leave).
  virtual void on_heard(Session& s) = 0;
  // The session's handshake is over: it joined, or closed before it did (once, and only
  // for a session that was started).
  virtual void on_handshake_over(Session& s) = 0;
  // A joined worker said it is ending on purpose.
  virtual void on_leave(Session& s) = 0;
  // The connection closed; `clean`: the worker left, or had not joined.
  virtual void on_closed(const std::shared_ptr<Session>& s, bool clean) = 0;

 protected:
  ~SessionHost() = default;
};

class Session : public std::enable_shared_from_this<Session>, private FramedStream::Handler {
 public:
  // `keep_alive`: the job's host timeout, for the connection's TCP keep-alive;
  // `max_send_queue`: the bytes that may wait to be written to the peer before it is
  // cut off for not reading.
  Session(SessionHost& host, boost::asio::ip::tcp::socket socket, const auth::Secret& secret,
          std::chrono::milliseconds keep_alive, std::size_t max_send_queue);
  void start(std::chrono::milliseconds handshake_timeout);
  template <class M>
  void send(const M& m) {
    send_frame(msg::to_frame(m));
  }
  void send_frame(const Frame& f);
  // Logs why and closes; the server forgets the session. A joined worker's connection
  // is then reported lost (unless it left), or not with `report_lost` false: the
  // server gave it up itself and says so otherwise.
  void close(const std::string& why, bool report_lost = true);

  const std::optional<WorkerPlace>& place() const { return place_; }
  std::uint64_t epoch() const { return epoch_; }
  void joined(const WorkerPlace& p, std::uint64_t epoch) {
    place_ = p;
    epoch_ = epoch;
  }
  const std::string& peer() const { return peer_; }
  // Requests of this session waiting on the server: each holds the token returned here
  // for as long as it waits (the count drops when the last copy of it goes).
  std::shared_ptr<void> hold_wait();
  std::size_t waiting() const { return *waiting_; }

 private:
  enum class Phase { auth, join, ready, closed };
  void on_stream_frame(Frame f) override;
  void on_stream_end(const StreamEnd& end) override;
  void handle(const Frame& f);
  void handle_auth(const Frame& f);

  SessionHost& host_;
  // Before stream_: both are made from the socket before the stream takes it over.
  boost::asio::steady_timer handshake_timer_;
  std::string peer_;
  FramedStream stream_;
  Phase phase_ = Phase::auth;
  handshake::Server handshake_;
  bool left_ = false;
  bool overflowed_ = false;
  bool started_ = false;  // its handshake began (start())  // cut off for not reading: nothing more is queued
  std::size_t max_send_queue_;
  std::shared_ptr<std::size_t> waiting_ = std::make_shared<std::size_t>(0);
  std::optional<WorkerPlace> place_;
  std::uint64_t epoch_ = 0;
};

}  // namespace elasticrun::rendezvous
