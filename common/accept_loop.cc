#include "common/accept_loop.h"

#include <fmt/format.h>

namespace elasticrun {

namespace asio = boost::asio;

AcceptLoop::AcceptLoop(asio::ip::tcp::acceptor& acceptor, log::Component who, OnSocket on_socket)
    : acceptor_(acceptor), who_(who), on_socket_(std::move(on_socket)), retry_(acceptor.get_executor()) {}

void AcceptLoop::start() {
  if (!stopped_) return;
  stopped_ = false;
  accept();
}

void AcceptLoop::stop() {
  stopped_ = true;
  retry_.cancel();
  boost::system::error_code ec;
  acceptor_.cancel(ec);  // a connection that comes meanwhile waits in the listen queue
}

void AcceptLoop::accept() {
  acceptor_.async_accept([this, alive = alive_](boost::system::error_code ec, asio::ip::tcp::socket socket) {
    if (!*alive || ec == asio::error::operation_aborted || stopped_ || !acceptor_.is_open()) return;
    if (!ec) {
      if (failures_ > 0 && log::enabled(who_, log::Level::info))
        log::write(who_, log::Level::info, fmt::format("accepting connections again, after {} failed accepts", failures_));
      failures_ = 0;
      on_socket_(std::move(socket));
      if (!stopped_ && acceptor_.is_open()) accept();
      return;
    }
    if (failures_++ == 0 && log::enabled(who_, log::Level::warn))
      log::write(who_, log::Level::warn,
                 fmt::format("accept: {}; trying again every {} ms", ec.message(), kRetry.count()));
    retry_.expires_after(kRetry);
    retry_.async_wait([this, alive = alive_](boost::system::error_code e) {
      if (*alive && !e && !stopped_ && acceptor_.is_open()) accept();
    });
  });
}

}  // namespace elasticrun
