#include "daemon/fork_server.h"

#include "fork_server_source.h"  // kForkServerSource: fork_server.py, generated at build time

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>

namespace elasticrun::daemon {
namespace {

namespace asio = boost::asio;

constexpr int kServerFd = 3;  // the server's end of the socket pair, as fork_server.py reads it
// How long a server whose socket closed may take to end, so that its exit status says why.
constexpr std::chrono::milliseconds kEndLimit{200};

std::string end_text(int status) {
  if (WIFSIGNALED(status)) return fmt::format("it was killed by signal {} ({})", WTERMSIG(status), ::strsignal(WTERMSIG(status)));
  return fmt::format("it exited with code {}", WEXITSTATUS(status));
}

}  // namespace

ForkServer::ForkServer(asio::io_context& io, int fd, Events events)
    : sock_(io, fd), ev_(std::move(events)), ready_timer_(io) {}

ForkServer::~ForkServer() = default;  // the ChildProcess kills and reaps the server

Result<std::unique_ptr<ForkServer>> ForkServer::start(asio::io_context& io, const Setup& setup, Events events) {
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0)
    return fail(fmt::format("socketpair failed: {}", std::strerror(errno)));
  UniqueFd theirs(ends[1]);
  std::unique_ptr<ForkServer> s(new ForkServer(io, ends[0], std::move(events)));
  ChildSpec spec;
  spec.program = setup.interpreter;
  spec.argv = {setup.interpreter};
  spec.argv.insert(spec.argv.end(), setup.options.begin(), setup.options.end());
  spec.argv.insert(spec.argv.end(), {"-c", std::string(kForkServerSource), std::to_string(kServerFd)});
  spec.argv.insert(spec.argv.end(), setup.preload.begin(), setup.preload.end());
  spec.env = setup.env;
  if (std::error_code ec; std::filesystem::is_directory(setup.cwd, ec)) spec.cwd = setup.cwd;
  // What an import prints is nobody's output; its errors go to our log, stderr.
  spec.in = spec.out = ChildSpec::Stdio::null;
  spec.fds = {{kServerFd, theirs.get()}};
  ForkServer* raw = s.get();
  // The ChildProcess calls back only while it lives, and it lives in *raw.
  auto child = ChildProcess::start(io, spec, [raw](int, int status) { raw->gone(end_text(status)); });
  if (!child) return fail(fmt::format("cannot start '{}': {}", setup.interpreter, child.error()));
  s->child_ = std::move(*child);
  s->read();
  std::weak_ptr<bool> alive = s->alive_;
  s->ready_timer_.expires_after(kReadyLimit);
  s->ready_timer_.async_wait([raw, alive](boost::system::error_code ec) {
    if (!ec && !alive.expired())
      raw->gone(fmt::format("it was not ready after {} s: an import hangs?", kReadyLimit.count()));
  });
  return s;
}

void ForkServer::spawn(const fork::Spawn& request, UniqueFd out, UniqueFd err) {
  if (gone_) return;
  wire::Encoder e;
  request.encode(e);
  Outgoing m;
  m.bytes = encode_frame(Frame{fork::kSpawn, e.take()});
  m.fds.push_back(std::move(out));
  m.fds.push_back(std::move(err));
  queue_.push_back(std::move(m));
  flush();
}

// Writes what the socket takes now, the descriptors with a request's first byte; the
// rest when it can take more. The socket stays non-blocking: a server still importing
// must not stall the daemon's heartbeats.
void ForkServer::flush() {
  while (!gone_ && !queue_.empty()) {
    Outgoing& m = queue_.front();
    iovec iov{m.bytes.data() + m.sent, m.bytes.size() - m.sent};
    msghdr h{};
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    alignas(cmsghdr) std::array<char, CMSG_SPACE(2 * sizeof(int))> control{};
    if (!m.fds.empty()) {
      std::size_t n = m.fds.size() * sizeof(int);
      h.msg_control = control.data();
      h.msg_controllen = CMSG_SPACE(n);
      cmsghdr* c = CMSG_FIRSTHDR(&h);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(n);
      for (std::size_t i = 0; i < m.fds.size(); ++i) {
        int fd = m.fds[i].get();
        std::memcpy(CMSG_DATA(c) + i * sizeof(int), &fd, sizeof fd);
      }
    }
    ssize_t n = ::sendmsg(sock_.native_handle(), &h, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (waiting_to_write_) return;
      waiting_to_write_ = true;
      std::weak_ptr<bool> alive = alive_;
      sock_.async_wait(asio::posix::descriptor_base::wait_write, [this, alive](boost::system::error_code ec) {
        if (alive.expired()) return;
        waiting_to_write_ = false;
        if (!ec) flush();
      });
      return;
    }
    if (n < 0) return gone(fmt::format("writing to it failed: {}", std::strerror(errno)));
    m.fds.clear();  // they went with the first byte: the server holds its own copies now
    m.sent += static_cast<std::size_t>(n);
    if (m.sent == m.bytes.size()) queue_.pop_front();
  }
}

void ForkServer::read() {
  std::weak_ptr<bool> alive = alive_;
  sock_.async_read_some(asio::buffer(*buf_), [this, alive, buf = buf_](boost::system::error_code ec, std::size_t n) {
    if (alive.expired() || gone_) return;
    if (auto ok = parser_.feed({buf->data(), n}); !ok) return gone("what it sent is not frames: " + ok.error());
    while (parser_.has_frame()) {
      handle(parser_.pop());
      if (alive.expired() || gone_) return;
    }
    if (!ec) return read();
    // A server that ended closed its socket as it went (a reset, when it left requests
    // unread): its exit status says more.
    if (auto status = child_->wait_for(kEndLimit)) return gone(end_text(*status));
    gone(ec == asio::error::eof ? "it closed its socket" : "reading from it failed: " + ec.message());
  });
}

// Each frame is decoded before its callback runs: a callback may destroy *this.
void ForkServer::handle(const Frame& f) {
  try {
    switch (f.type) {
      case fork::kReady:
        fork::parse<fork::Ready>(f);
        ready_timer_.cancel();
        if (ev_.on_ready) ev_.on_ready();
        return;
      case fork::kStarted: {
        auto m = fork::parse<fork::Started>(f);
        // The pid is signalled as a process group (kill(-pid)): 1 would be every process
        // the daemon may signal; the daemon's pid or group (a local daemon shares the
        // driver's) or the server's would reach them. None can be a worker the server forked.
        const int pid = m.pid > INT_MAX ? 0 : static_cast<int>(m.pid);
        if (pid < 2 || pid == ::getpid() || pid == ::getpgrp() || (child_ && pid == child_->pid()))
          throw wire::DecodeError(fmt::format("a worker's pid cannot be {}", m.pid));
        if (ev_.on_started) ev_.on_started(m.id, static_cast<int>(m.pid));
        return;
      }
      case fork::kRefused: {
        auto m = fork::parse<fork::Refused>(f);
        if (ev_.on_refused) ev_.on_refused(m.id, m.reason);
        return;
      }
      case fork::kExited: {
        auto m = fork::parse<fork::Exited>(f);
        if (ev_.on_exited) ev_.on_exited(static_cast<int>(m.pid), m.status);
        return;
      }
      case fork::kFailed: return gone(fork::parse<fork::Failed>(f).reason);
      default: return gone(fmt::format("it sent a frame of unknown type {}", f.type));
    }
  } catch (const wire::DecodeError& e) {
    gone(fmt::format("it sent a malformed frame (type {}): {}", f.type, e.what()));
  }
}

void ForkServer::gone(const std::string& why) {
  if (gone_) return;
  gone_ = true;
  ready_timer_.cancel();
  queue_.clear();
  boost::system::error_code ec;
  sock_.close(ec);
  if (child_) child_->signal_group(SIGKILL);
  if (ev_.on_gone) ev_.on_gone(why);  // last: it may destroy *this
}

}  // namespace elasticrun::daemon
