#include "cmd/tcp_daemon.h"

#include "common/framed_stream.h"
#include "common/handshake.h"
#include "common/log.h"
#include "common/socket_options.h"

#include <boost/asio.hpp>
#include <fmt/format.h>

#include <deque>
#include <optional>

namespace elasticrun::cmd {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr std::string_view kRole = "driver";

class TcpDaemon final : public DaemonLink, private FramedStream::Handler {
 public:
  TcpDaemon(asio::io_context& io, std::string host, std::uint16_t port, const auth::Secret& cluster,
            std::chrono::milliseconds timeout, std::chrono::milliseconds host_timeout, DaemonEvents ev)
      : DaemonLink(std::move(host), std::move(ev)), io_(io), port_(port), cluster_(cluster),
        host_timeout_(host_timeout), resolver_(io),
        socket_(io), timer_(io), where_(fmt::format("daemon at {}:{}", this->host(), port)) {
    timer_.expires_after(timeout);
    timer_.async_wait([this, timeout, alive = std::weak_ptr<int>(alive_)](boost::system::error_code ec) {
      if (ec || !alive.lock() || authenticated_) return;
      fail_link(fmt::format("{}: no answer within {} ms", where_, timeout.count()));
    });
    if (this->host().find('@') != std::string::npos) {
      // Reported from the io loop: the caller is still registering this link.
      asio::post(io_, [this, alive = std::weak_ptr<int>(alive_)] {
        if (alive.lock())
          fail_link(fmt::format("'{}': user@host is for SSH; a daemon runs workers as its own user", this->host()));
      });
      return;
    }
    resolver_.async_resolve(this->host(), std::to_string(port_),
                            [this, alive = std::weak_ptr<int>(alive_)](boost::system::error_code ec,
                                                                       tcp::resolver::results_type r) {
                              if (!alive.lock() || closed()) return;
                              if (ec) return void(fail_link(fmt::format("{}: cannot resolve: {}", where_, ec.message())));
                              connect(r);
                            });
  }
  ~TcpDaemon() override {
    alive_.reset();
    close();
  }

  void send_frame(const Frame& f) override {
    if (closed()) return;
    if (!authenticated_) {
      pending_.push_back(f);
      return;
    }
    write(f);
  }

  void close() override {
    boost::system::error_code ec;
    timer_.cancel();
    resolver_.cancel();
    socket_.close(ec);
    if (stream_) stream_->close();
  }

 private:
  void connect(const tcp::resolver::results_type& r) {
    asio::async_connect(socket_, r, [this, alive = std::weak_ptr<int>(alive_)](boost::system::error_code ec,
                                                                               const tcp::endpoint&) {
      if (!alive.lock() || closed()) return;
      if (ec) return void(fail_link(fmt::format("{}: cannot connect: {}", where_, ec.message())));
      boost::system::error_code e2;
      socket_.set_option(tcp::no_delay(true), e2);
      net::keep_alive(socket_.native_handle(), host_timeout_);
      stream_.emplace(std::move(socket_), static_cast<FramedStream::Handler&>(*this));
      stream_->start();
    });
  }

  void on_stream_frame(Frame f) override { handle(f); }

  void on_stream_end(const StreamEnd& end) override {
    switch (end.kind) {
      case StreamEnd::Kind::bad_stream: return void(fail_link(fmt::format("{}: bad control stream: {}", where_, end.detail)));
      case StreamEnd::Kind::write_error:
        return report_closed(shutting_down_ ? "" : fmt::format("{}: write: {}", where_, end.detail));
      case StreamEnd::Kind::eof:
      case StreamEnd::Kind::read_error:
        if (!authenticated_)
          return void(fail_link(fmt::format("{}: closed during the handshake ({})", where_, end.detail)));
        return report_closed(shutting_down_ ? "" : fmt::format("{}: connection lost: {}", where_, end.detail));
    }
  }

  // False once the link is finished.
  bool handle(const Frame& f) {
    if (authenticated_) return on_frame(f);
    try {
      if (f.type == msg::kError)
        return fail_link(fmt::format("{} refused us: {} (is the cluster secret the same on both sides?)", where_,
                                     msg::parse<msg::Error>(f).message));
      if (!hello_seen_) return on_hello(msg::parse<msg::Hello>(f));
      return on_auth_ok(msg::parse<msg::AuthOk>(f));
    } catch (const wire::DecodeError& e) {
      return fail_link(fmt::format("{}: not an elasticrund handshake ({}: {})", where_, msg::type_name(f.type), e.what()));
    }
  }

  bool on_hello(const msg::Hello& h) {
    write(msg::to_frame(hs_.answer(h)));
    hello_seen_ = true;
    return true;
  }

  bool on_auth_ok(const msg::AuthOk& a) {
    if (!hs_.verify(a)) return fail_link(fmt::format("{} could not prove the cluster secret; refusing it", where_));
    authenticated_ = true;
    timer_.cancel();
    auto pad = auth::wrap_pad(cluster_, kRole, hs_.server_nonce(), hs_.client_nonce());
    for (auto& f : pending_) {
      if (f.type == msg::kConfig) {
        auto c = msg::parse<msg::Config>(f);
        for (std::size_t i = 0; i < c.secret.size() && i < pad.size(); ++i) c.secret[i] ^= pad[i];
        f = msg::to_frame(c);
      }
      write(f);
    }
    pending_.clear();
    ER_LOG(driver, debug, "{}: authenticated", where_);
    return true;
  }

  bool fail_link(const std::string& why) {
    report_closed(why);
    return false;
  }

  void write(const Frame& f) { stream_->send(f); }

  asio::io_context& io_;
  std::uint16_t port_;
  auth::Secret cluster_;
  std::chrono::milliseconds host_timeout_;
  tcp::resolver resolver_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  std::string where_;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
  std::optional<FramedStream> stream_;  // once connected
  std::deque<Frame> pending_;
  handshake::Client hs_{cluster_, std::string(kRole)};
  bool hello_seen_ = false, authenticated_ = false;
};

}  // namespace

std::unique_ptr<DaemonLink> connect_daemon(asio::io_context& io, const std::string& host, std::uint16_t port,
                                           const auth::Secret& cluster_secret,
                                           std::chrono::milliseconds connect_timeout,
                                           std::chrono::milliseconds host_timeout, DaemonEvents ev) {
  return std::make_unique<TcpDaemon>(io, host, port, cluster_secret, connect_timeout, host_timeout, std::move(ev));
}

}  // namespace elasticrun::cmd
