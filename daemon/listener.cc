#include "daemon/listener.h"

#include "common/child_process.h"
#include "common/frame.h"
#include "common/handshake.h"
#include "common/log.h"
#include "common/messages.h"
#include "common/shm_dirs.h"
#include "common/socket_options.h"
#include "daemon/job_records.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

namespace elasticrun::daemon {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

constexpr std::string_view kRole = "driver";

}  // namespace

// One connection that has not proved the cluster secret yet.
class Listener::Handshake : public std::enable_shared_from_this<Handshake> {
 public:
  Handshake(Listener& listener, tcp::socket socket, std::shared_ptr<std::size_t> count)
      : listener_(listener), hs_(listener.options_.secret), socket_(std::move(socket)), timer_(socket_.get_executor()),
        parser_(handshake::kMaxPayload), count_(std::move(count)) {
    ++*count_;
    boost::system::error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    peer_ = ec ? "?" : ep.address().to_string() + ":" + std::to_string(ep.port());
    socket_.set_option(tcp::no_delay(true), ec);
    net::keep_alive(socket_.native_handle());
  }
  ~Handshake() { --*count_; }

  void start(std::chrono::milliseconds timeout) {
    write(msg::to_frame(hs_.hello()), [](Handshake&) {});
    timer_.expires_after(timeout);
    timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec && !self->done_) self->reject("no authentication within the handshake timeout");
    });
    read();
  }

 private:
  template <class Then>
  void write(const Frame& f, Then then) {
    auto bytes = std::make_shared<wire::Bytes>(encode_frame(f));
    asio::async_write(socket_, asio::buffer(*bytes),
                      [self = shared_from_this(), bytes, then](boost::system::error_code ec, std::size_t) {
                        if (self->done_) return;
                        if (ec) return self->reject("write: " + ec.message());
                        then(*self);
                      });
  }

  void read() {
    socket_.async_read_some(asio::buffer(buf_), [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
      if (self->done_) return;
      if (ec) return self->reject(ec == asio::error::eof ? "closed before authenticating" : "read: " + ec.message());
      if (auto ok = self->parser_.feed({self->buf_.data(), n}); !ok) return self->reject(ok.error());
      if (!self->parser_.has_frame()) return self->read();
      Frame f = self->parser_.pop();
      if (self->parser_.has_frame() || self->parser_.partial_bytes() > 0)
        return self->reject("sent more before the daemon proved itself");
      try {
        self->on_auth(msg::parse<msg::Auth>(f));
      } catch (const wire::DecodeError& e) {
        self->reject(std::string("malformed ") + msg::type_name(f.type) + " frame: " + e.what());
      }
    });
  }

  void on_auth(const msg::Auth& a) {
    auto ok = hs_.check(a, kRole);
    if (!ok) {
      // The reason goes to our log, not to the peer.
      log_rejection("authentication failed (wrong cluster secret or role '" + a.role.substr(0, 32) + "')");
      write(msg::to_frame(msg::Error{0, "authentication failed"}), [](Handshake& h) { h.close(); });
      timer_.cancel();
      return;
    }
    pad_ = auth::wrap_pad(listener_.options_.secret, kRole, hs_.server_nonce(), hs_.client_nonce());
    write(msg::to_frame(*ok), [](Handshake& h) {
      h.done_ = true;
      h.timer_.cancel();
      h.listener_.start_job(std::move(h.socket_), h.pad_, h.peer_);
    });
  }

  void log_rejection(const std::string& why) { ER_LOG(daemon, warn, "rejected connection from {}: {}", peer_, why); }

  void reject(const std::string& why) {
    log_rejection(why);
    close();
  }

  void close() {
    done_ = true;
    boost::system::error_code ec;
    timer_.cancel();
    socket_.close(ec);
  }

  Listener& listener_;
  handshake::Server hs_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  FrameParser parser_;
  std::shared_ptr<std::size_t> count_;
  std::string peer_;
  auth::Secret pad_{};
  std::array<std::uint8_t, 2048> buf_{};
  bool done_ = false;
};

Listener::Listener(asio::io_context& io, ListenOptions options)
    : io_(io), options_(std::move(options)), acceptor_(io),
      accept_(acceptor_, log::Component::daemon, [this](tcp::socket socket) { on_socket(std::move(socket)); }),
      kill_timer_(io) {}

Listener::~Listener() = default;

Result<void> Listener::start() {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(options_.address, ec);
  if (ec) return fail("bad listen address '" + options_.address + "'");
  tcp::endpoint ep(addr, options_.port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail("cannot listen on " + options_.address + ":" + std::to_string(options_.port) + ": " + ec.message());
  ::fcntl(acceptor_.native_handle(), F_SETFD, FD_CLOEXEC);
  accept_.start();
  return {};
}

std::uint16_t Listener::port() const {
  boost::system::error_code ec;
  return acceptor_.local_endpoint(ec).port();
}

void Listener::on_socket(tcp::socket socket) {
  if (stopping_) return;
  if (*handshake_count_ >= options_.max_handshakes) {
    boost::system::error_code ec;
    auto ep = socket.remote_endpoint(ec);
    ER_LOG(daemon, warn, "rejected connection from {}: {} connections are already authenticating",
           ec ? "?" : ep.address().to_string(), options_.max_handshakes);
    return;
  }
  ::fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);
  std::make_shared<Handshake>(*this, std::move(socket), handshake_count_)->start(options_.handshake_timeout);
}

void Listener::start_job(tcp::socket socket, const auth::Secret& pad, const std::string& peer) {
  if (stopping_) return;
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) {
    ER_LOG(daemon, error, "cannot start a job for {}: pipe: {}", peer, std::strerror(errno));
    return;
  }
  UniqueFd pad_r(pipefd[0]), pad_w(pipefd[1]);
  ChildSpec spec;
  spec.program = options_.self_exe;
  spec.argv = {"elasticrund", "--stdio", "--job-pad-fd=3"};
  if (!options_.state_dir.empty()) spec.argv.push_back("--state-dir=" + options_.state_dir);
  if (!options_.log_level.empty()) spec.argv.push_back("--log-level=" + options_.log_level);
  spec.fds = {{0, socket.native_handle()}, {1, socket.native_handle()}, {3, pad_r.get()}};
  // A job never outlives the daemon: it stops its workers when the daemon goes.
  spec.death_signal = SIGTERM;
  auto child = ChildProcess::start(io_, spec, [this, peer](int pid, int status) { on_job_exit(pid, peer, status); });
  if (!child) {
    ER_LOG(daemon, error, "cannot start a job for {}: {}", peer, child.error());
    return;
  }
  pad_r.reset();
  std::size_t off = 0;
  while (off < pad.size()) {
    ssize_t n = ::write(pad_w.get(), pad.data() + off, pad.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
  boost::system::error_code ec;
  socket.close(ec);
  int pid = (*child)->pid();
  jobs_[pid] = std::move(*child);
  ER_LOG(daemon, info, "job from {} started as process {}", peer, pid);
}

void Listener::on_job_exit(int pid, const std::string& peer, int status) {
  bool abnormal = WIFSIGNALED(status);
  if (abnormal)
    ER_LOG(daemon, warn, "job from {} (process {}) killed by signal {}", peer, pid, WTERMSIG(status));
  else
    ER_LOG(daemon, info, "job from {} (process {}) ended with code {}", peer, pid, WEXITSTATUS(status));
  jobs_.erase(pid);
  // A job that could not clean up: kill what its workers left, remove its files.
  if (abnormal && !options_.state_dir.empty()) reclaim_jobs(options_.state_dir);
  finish_if_stopped();
}

void Listener::stop(std::chrono::milliseconds grace, std::function<void()> done) {
  if (stopping_) return;
  stopping_ = true;
  done_ = std::move(done);
  boost::system::error_code ec;
  accept_.stop();
  acceptor_.close(ec);
  for (auto& [pid, job] : jobs_) job->signal(SIGTERM);
  kill_timer_.expires_after(grace);
  kill_timer_.async_wait([this](boost::system::error_code e) {
    if (e) return;
    for (auto& [pid, job] : jobs_) job->signal_group(SIGKILL);
  });
  finish_if_stopped();
}

void Listener::finish_if_stopped() {
  if (!stopping_ || !jobs_.empty() || !done_) return;
  kill_timer_.cancel();
  auto done = std::move(done_);
  done_ = nullptr;
  done();
}

}  // namespace elasticrun::daemon
