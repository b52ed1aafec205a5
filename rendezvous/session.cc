#include "rendezvous/session.h"

#include "common/log.h"
#include "common/socket_options.h"
#include "rendezvous/server.h"

namespace elasticrun::rendezvous {

namespace asio = boost::asio;

Session::Session(Server& server, asio::ip::tcp::socket socket)
    : server_(server), socket_(std::move(socket)), handshake_timer_(socket_.get_executor()) {
  boost::system::error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  peer_ = ec ? "?" : ep.address().to_string() + ":" + std::to_string(ep.port());
  socket_.set_option(asio::ip::tcp::no_delay(true), ec);
  // A worker behind a cut link is noticed (its place fails) within 1.5 x the job's host
  // timeout, the backstop behind its daemon's heartbeats.
  net::keep_alive(socket_.native_handle(), server_.limits_.keep_alive);
}

void Session::start(std::chrono::milliseconds handshake_timeout) {
  handshake_.emplace(server_.secret_);
  send(handshake_->hello());
  handshake_timer_.expires_after(handshake_timeout);
  handshake_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (!ec && self->phase_ != Phase::ready) self->close("handshake timed out");
  });
  read();
}

void Session::read() {
  socket_.async_read_some(asio::buffer(rbuf_), [self = shared_from_this()](
                                                   boost::system::error_code ec, std::size_t n) {
    if (self->phase_ == Phase::closed) return;
    if (ec) {
      self->close(ec == asio::error::eof ? "" : "read: " + ec.message());
      return;
    }
    if (auto ok = self->parser_.feed({self->rbuf_.data(), n}); !ok) {
      self->close("rejected: " + ok.error());
      return;
    }
    while (self->parser_.has_frame() && self->phase_ != Phase::closed) {
      Frame f = self->parser_.pop();
      try {
        self->handle(f);
      } catch (const wire::DecodeError& e) {
        self->close(std::string("rejected malformed ") + msg::type_name(f.type) + " frame: " + e.what());
      }
    }
    if (self->phase_ != Phase::closed) self->read();
  });
}

void Session::handle_auth(const Frame& f) {
  auto a = msg::parse<msg::Auth>(f);
  auto ok = handshake_->check(a, "worker");
  if (!ok) {
    close("rejected: authentication failed (wrong secret or role '" + a.role.substr(0, 32) + "')");
    return;
  }
  send(*ok);
  phase_ = Phase::join;
}

void Session::handle(const Frame& f) {
  switch (phase_) {
    case Phase::auth: return handle_auth(f);
    case Phase::join:
      server_.on_join(shared_from_this(), msg::parse<msg::Join>(f));
      if (place_) {
        phase_ = Phase::ready;
        handshake_timer_.cancel();
      }
      return;
    case Phase::ready: break;
    case Phase::closed: return;
  }
  switch (f.type) {
    case msg::kKvSet: return server_.on_kv_set(shared_from_this(), msg::parse<msg::KvSet>(f));
    case msg::kKvGet: return server_.on_kv_get(shared_from_this(), msg::parse<msg::KvGet>(f));
    case msg::kBarrier: return server_.on_barrier(shared_from_this(), msg::parse<msg::Barrier>(f));
    case msg::kRejoin: return server_.on_rejoin(shared_from_this(), msg::parse<msg::Rejoin>(f));
    case msg::kLeave:
      msg::parse<msg::Leave>(f);
      left_ = true;
      return;
    default:
      close(std::string("rejected unexpected ") + msg::type_name(f.type) + " frame");
  }
}

void Session::send_frame(const Frame& f) {
  if (phase_ == Phase::closed) return;
  wqueue_.push_back(encode_frame(f));
  if (wqueue_.size() == 1) write_next();
}

void Session::write_next() {
  asio::async_write(socket_, asio::buffer(wqueue_.front()),
                    [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                      if (self->phase_ == Phase::closed) return;
                      if (ec) return self->close("write: " + ec.message());
                      self->wqueue_.pop_front();
                      if (!self->wqueue_.empty()) self->write_next();
                    });
}

void Session::close(const std::string& why) {
  if (phase_ == Phase::closed) return;
  bool was_joined = phase_ == Phase::ready;
  phase_ = Phase::closed;
  if (!why.empty()) {
    if (place_)
      ER_LOG(rendezvous, warn, "worker rank {} on '{}' (epoch {}, {}): {}", place_->rank,
             place_->host, epoch_, peer_, why);
    else
      ER_LOG(rendezvous, warn, "connection from {}: {}", peer_, why);
  }
  boost::system::error_code ec;
  handshake_timer_.cancel();
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  server_.on_closed(shared_from_this(), left_ || !was_joined);
}

}  // namespace elasticrun::rendezvous
