#include "common/framed_stream.h"

#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/write.hpp>
#include <sys/socket.h>

#include <deque>
#include <optional>
#include <variant>

namespace elasticrun {

namespace asio = boost::asio;

namespace {

using Descriptor = asio::posix::stream_descriptor;
using Socket = asio::generic::stream_protocol::socket;

// A socket is driven as one (send with MSG_NOSIGNAL: a peer that went away is an error,
// not SIGPIPE); anything else, a pipe say, as a plain descriptor.
std::variant<Descriptor, Socket> wrap(const asio::any_io_executor& ex, int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return std::variant<Descriptor, Socket>(std::in_place_type<Descriptor>, ex, fd);
  return std::variant<Descriptor, Socket>(std::in_place_type<Socket>, ex,
                                          asio::generic::stream_protocol(addr.ss_family, 0), fd);
}

}  // namespace

// What the in-flight I/O holds on to. `handler` is null once the stream is closed:
// completions that arrive after that touch nothing but this.
struct FramedStream::Impl : std::enable_shared_from_this<Impl> {
  Impl(const asio::any_io_executor& ex, int read_fd, int write_fd, Handler& h, const Options& o)
      : in(wrap(ex, read_fd)), handler(&h), parser(o.max_payload), rsize(o.read_buffer),
        rbuf(new std::uint8_t[o.read_buffer]) {  // not zero-filled: thousands of sessions would touch it all
    if (write_fd != read_fd) out.emplace(wrap(ex, write_fd));
  }

  std::variant<Descriptor, Socket> in;
  std::optional<std::variant<Descriptor, Socket>> out;  // when not the same descriptor
  Handler* handler;
  FrameParser parser;
  std::size_t rsize;
  std::unique_ptr<std::uint8_t[]> rbuf;
  std::deque<wire::Bytes> wqueue;  // front: being written
  std::size_t wbytes = 0;          // in wqueue
  bool reading = false, write_failed = false;

  std::variant<Descriptor, Socket>& writer() { return out ? *out : in; }
  bool delivering() const { return handler && reading; }

  void read() {
    std::visit(
        [&](auto& s) {
          s.async_read_some(asio::buffer(rbuf.get(), rsize),
                            [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
                              self->on_read(ec, n);
                            });
        },
        in);
  }

  void on_read(boost::system::error_code ec, std::size_t n) {
    if (!delivering()) return;
    if (n > 0) {
      if (auto ok = parser.feed({rbuf.get(), n}); !ok) return end_reading({StreamEnd::Kind::bad_stream, ok.error()});
      // The handler may close or destroy the stream between two frames.
      while (delivering() && parser.has_frame()) handler->on_stream_frame(parser.pop());
      if (!delivering()) return;
    }
    if (ec)
      return end_reading({ec == asio::error::eof ? StreamEnd::Kind::eof : StreamEnd::Kind::read_error, ec.message()});
    read();
  }

  void end_reading(const StreamEnd& e) {
    reading = false;
    handler->on_stream_end(e);
  }

  void send(const Frame& f) {
    if (!handler || write_failed) return;
    wqueue.push_back(encode_frame(f));
    wbytes += wqueue.back().size();
    if (wqueue.size() == 1) write_next();
  }

  void write_next() {
    std::visit(
        [&](auto& s) {
          asio::async_write(s, asio::buffer(wqueue.front()),
                            [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                              self->on_written(ec);
                            });
        },
        writer());
  }

  void on_written(boost::system::error_code ec) {
    if (!handler) return;
    if (ec) {
      write_failed = true;
      wqueue.clear();
      wbytes = 0;
      return handler->on_stream_end({StreamEnd::Kind::write_error, ec.message()});
    }
    wbytes -= wqueue.front().size();
    wqueue.pop_front();
    if (!wqueue.empty()) write_next();
    else handler->on_stream_drained();
  }

  int fd() const {
    return std::visit([](auto& s) { return const_cast<std::remove_cvref_t<decltype(s)>&>(s).native_handle(); }, in);
  }

  void close() {
    if (!handler) return;
    handler = nullptr;
    reading = false;
    ::shutdown(fd(), SHUT_RDWR);  // fails harmlessly on a pipe
    boost::system::error_code ec;
    auto close = [&](auto& s) { s.close(ec); };
    std::visit(close, in);
    if (out) std::visit(close, *out);
    // wqueue stays: a write in flight may still point into its front.
  }
};

FramedStream::FramedStream(asio::io_context& io, int read_fd, int write_fd, Handler& handler, Options options)
    : impl_(std::make_shared<Impl>(io.get_executor(), read_fd, write_fd, handler, options)) {}

FramedStream::FramedStream(asio::ip::tcp::socket socket, Handler& handler, Options options) {
  int fd = socket.release();  // before the descriptor is registered again below
  impl_ = std::make_shared<Impl>(socket.get_executor(), fd, fd, handler, options);
}

FramedStream::~FramedStream() { impl_->close(); }

void FramedStream::start() {
  if (impl_->handler == nullptr || impl_->reading) return;
  impl_->reading = true;
  impl_->read();
}

void FramedStream::send(const Frame& f) { impl_->send(f); }

void FramedStream::set_max_payload(std::uint32_t max_payload) { impl_->parser.set_max_payload(max_payload); }

void FramedStream::stop_reading() { impl_->reading = false; }

void FramedStream::close() { impl_->close(); }

bool FramedStream::closed() const { return impl_->handler == nullptr; }

std::size_t FramedStream::queued() const { return closed() ? 0 : impl_->wqueue.size(); }

std::size_t FramedStream::queued_bytes() const { return closed() ? 0 : impl_->wbytes; }

int FramedStream::native_handle() const { return impl_->fd(); }

}  // namespace elasticrun
