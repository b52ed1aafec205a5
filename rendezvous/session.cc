#include "rendezvous/session.h"

#include "common/log.h"
#include "common/socket_options.h"
#include "rendezvous/server.h"

#include <fmt/format.h>

namespace elasticrun::rendezvous {

namespace asio = boost::asio;

namespace {

// The peer's address for log lines; sets the socket's options on the way.
std::string tune(asio::ip::tcp::socket& socket, std::chrono::milliseconds keep_alive) {
  boost::system::error_code ec;
  auto ep = socket.remote_endpoint(ec);
  std::string peer = ec ? "?" : ep.address().to_string() + ":" + std::to_string(ep.port());
  socket.set_option(asio::ip::tcp::no_delay(true), ec);
  // A worker behind a cut link is noticed (its place fails) within 1.5 x the job's host
  // timeout, the backstop behind its daemon's heartbeats.
  net::keep_alive(socket.native_handle(), keep_alive);
  return peer;
}

// Not zero-filled, and small: thousands of sessions would each touch the whole buffer.
// Until the peer proves the secret, frames are as small as an Auth frame.
constexpr FramedStream::Options kStreamOptions{handshake::kMaxPayload, 4096};

}  // namespace

Session::Session(SessionHost& host, asio::ip::tcp::socket socket, const auth::Secret& secret,
                 std::chrono::milliseconds keep_alive, std::size_t max_send_queue)
    : host_(host), handshake_timer_(socket.get_executor()), peer_(tune(socket, keep_alive)),
      stream_(std::move(socket), *this, kStreamOptions), handshake_(secret), max_send_queue_(max_send_queue) {}

std::shared_ptr<void> Session::hold_wait() {
  ++*waiting_;
  return std::shared_ptr<void>(nullptr, [count = waiting_](void*) { --*count; });
}

void Session::start(std::chrono::milliseconds handshake_timeout) {
  started_ = true;
  send(handshake_.hello());
  handshake_timer_.expires_after(handshake_timeout);
  handshake_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (!ec && self->phase_ != Phase::ready) self->close("handshake timed out");
  });
  stream_.start();
}

void Session::on_stream_frame(Frame f) {
  auto self = shared_from_this();  // the server may let go of the session meanwhile
  try {
    handle(f);
  } catch (const wire::DecodeError& e) {
    close(std::string("rejected malformed ") + msg::type_name(f.type) + " frame: " + e.what());
  }
}

void Session::on_stream_end(const StreamEnd& end) {
  auto self = shared_from_this();
  switch (end.kind) {
    case StreamEnd::Kind::eof: return close("");
    case StreamEnd::Kind::read_error: return close("read: " + end.detail);
    case StreamEnd::Kind::bad_stream: return close("rejected: " + end.detail);
    case StreamEnd::Kind::write_error: return close("write: " + end.detail);
  }
}

void Session::handle_auth(const Frame& f) {
  auto a = msg::parse<msg::Auth>(f);
  auto ok = handshake_.check(a, "worker");
  if (!ok) {
    close("rejected: authentication failed (wrong secret or role '" + a.role.substr(0, 32) + "')");
    return;
  }
  send(*ok);
  stream_.set_max_payload(kMaxFramePayload);
  phase_ = Phase::join;
}

void Session::handle(const Frame& f) {
  switch (phase_) {
    case Phase::auth:
      // A worker speaks first, with a heartbeat, before our hello can reach it
      // (RendezvousClient::open says why).
      if (f.type == msg::kHeartbeat) return void(msg::parse<msg::Heartbeat>(f));
      return handle_auth(f);
    case Phase::join:
      host_.on_join(shared_from_this(), msg::parse<msg::Join>(f));
      if (place_) {
        phase_ = Phase::ready;
        handshake_timer_.cancel();
        host_.on_handshake_over(*this);
      }
      return;
    case Phase::ready: break;
    case Phase::closed: return;
  }
  host_.on_heard(*this);
  switch (f.type) {
    case msg::kKvSet: return host_.on_kv_set(shared_from_this(), msg::parse<msg::KvSet>(f));
    case msg::kKvGet: return host_.on_kv_get(shared_from_this(), msg::parse<msg::KvGet>(f));
    case msg::kBarrier: return host_.on_barrier(shared_from_this(), msg::parse<msg::Barrier>(f));
    case msg::kRejoin: return host_.on_rejoin(shared_from_this(), msg::parse<msg::Rejoin>(f));
    case msg::kReport: return host_.on_report(shared_from_this(), msg::parse<msg::Report>(f));
    case msg::kCheckpointNote:
      return host_.on_checkpoint_note(shared_from_this(), msg::parse<msg::CheckpointNote>(f));
    case msg::kSynced: return host_.on_synced(shared_from_this(), msg::parse<msg::Synced>(f));
    case msg::kHeartbeat: msg::parse<msg::Heartbeat>(f); return;  // being heard was the point
    case msg::kLeave:
      msg::parse<msg::Leave>(f);
      left_ = true;
      host_.on_leave(*this);
      return;
    default:
      close(std::string("rejected unexpected ") + msg::type_name(f.type) + " frame");
  }
}

// A peer that does not read is cut off once max_send_queue_ bytes wait for it; the
// close comes from the io_context, not from inside this send: the server may be going
// through its sessions, sending to each.
void Session::send_frame(const Frame& f) {
  if (phase_ == Phase::closed || overflowed_) return;
  stream_.send(f);
  if (stream_.queued_bytes() <= max_send_queue_) return;
  overflowed_ = true;
  stream_.stop_reading();
  asio::post(handshake_timer_.get_executor(), [self = shared_from_this(), queued = stream_.queued_bytes()] {
    self->close(fmt::format("does not read its connection: {:.1f} MiB waiting to be written to it (limit {:.1f} MiB)",
                            queued / 1048576.0, self->max_send_queue_ / 1048576.0));
  });
}

void Session::close(const std::string& why, bool report_lost) {
  if (phase_ == Phase::closed) return;
  bool was_joined = phase_ == Phase::ready;
  phase_ = Phase::closed;
  if (!was_joined && started_) host_.on_handshake_over(*this);
  if (!why.empty()) {
    if (place_)
      ER_LOG(rendezvous, warn, "worker rank {} on '{}' (epoch {}, {}): {}", place_->rank,
             place_->host, epoch_, peer_, why);
    else
      ER_LOG(rendezvous, warn, "connection from {}: {}", peer_, why);
  }
  handshake_timer_.cancel();
  stream_.close();
  host_.on_closed(shared_from_this(), left_ || !was_joined || !report_lost);
}

}  // namespace elasticrun::rendezvous
