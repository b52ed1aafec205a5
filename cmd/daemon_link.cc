#include "cmd/daemon_link.h"

#include "common/log.h"
#include "common/shm_dirs.h"

#include <fmt/format.h>

#include <boost/asio.hpp>
#include <boost/process.hpp>
#include <boost/process/extend.hpp>

#include <sys/prctl.h>
#include <sys/wait.h>

#include <thread>

#include <csignal>
#include <deque>

namespace elasticrun::cmd {

void DaemonLink::shutdown(std::chrono::milliseconds grace) {
  if (closed_ || shutting_down_) return;
  shutting_down_ = true;
  send(msg::Shutdown{static_cast<std::uint32_t>(grace.count())});
}

bool DaemonLink::on_bytes(std::span<const std::uint8_t> data) {
  if (auto ok = parser_.feed(data); !ok) {
    report_closed("bad control stream from daemon: " + ok.error());
    return false;
  }
  while (parser_.has_frame() && !closed_)
    if (!on_frame(parser_.pop())) return false;
  return !closed_;
}

bool DaemonLink::on_frame(const Frame& f) {
  if (closed_) return false;
  last_heard_ = std::chrono::steady_clock::now();
  try {
    dispatch(f);
  } catch (const wire::DecodeError& e) {
    report_closed(std::string("malformed ") + msg::type_name(f.type) + " frame from daemon: " + e.what());
    return false;
  }
  return !closed_;
}

void DaemonLink::dispatch(const Frame& f) {
  if (!ready_) {
    auto r = msg::parse<msg::Ready>(f);
    if (r.protocol != msg::kControlProtocol)
      return report_closed(fmt::format("its elasticrund speaks control protocol {}, this elasticrun {}: install the "
                                       "same elasticrun version on every host",
                                       r.protocol, msg::kControlProtocol));
    ready_ = true;
    return;
  }
  switch (f.type) {
    case msg::kStarted: ev_.on_started(host_, msg::parse<msg::Started>(f)); return;
    case msg::kOutput: ev_.on_output(host_, msg::parse<msg::Output>(f)); return;
    case msg::kExited: ev_.on_exited(host_, msg::parse<msg::Exited>(f)); return;
    case msg::kSpawnFailed: ev_.on_spawn_failed(host_, msg::parse<msg::SpawnFailed>(f)); return;
    case msg::kHeartbeat: msg::parse<msg::Heartbeat>(f); return;  // on_frame noted the time
    default: throw wire::DecodeError(std::string("unexpected ") + msg::type_name(f.type) + " frame");
  }
}

void DaemonLink::report_closed(const std::string& why) {
  if (closed_) return;
  closed_ = true;
  close();
  ev_.on_closed(host_, shutting_down_ && why.empty(), why);
}

namespace {

namespace bp = boost::process;
namespace asio = boost::asio;

struct DieWithDriver : bp::extend::handler {
  template <class Executor>
  void on_exec_setup(Executor&) const {
    // SIGTERM, not SIGKILL: the daemon then stops its workers and removes their
    // shared-memory directories before it exits.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  }
};

class LocalDaemon final : public DaemonLink {
 public:
  LocalDaemon(asio::io_context& io, std::string host, DaemonEvents ev)
      : DaemonLink(std::move(host), std::move(ev)), in_(io), out_(io) {}
  ~LocalDaemon() override {
    close();
    if (!child_ || !child_->valid()) return;
    // Reap the daemon; it exits once its workers are gone. (Boost's wait_for can
    // oversleep its whole timeout, so poll waitpid ourselves.)
    int pid = child_->id(), status = 0;
    for (int i = 0; i < 600; ++i) {
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        child_->detach();
        // A daemon that was killed could not clean up after its workers.
        shm_dirs::remove_all_of(pid);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // Still there (stopped, or hung): kill it, and clean up after it as above.
    std::error_code ec;
    child_->terminate(ec);
    shm_dirs::remove_all_of(pid);
  }

  Result<void> start(const std::string& path, const std::string& log_level) {
    std::vector<std::string> args{"--stdio"};
    if (!log_level.empty()) args.push_back("--log-level=" + log_level);
    try {
      child_ = std::make_unique<bp::child>(bp::exe = path, bp::args = args, bp::std_in < in_,
                                           bp::std_out > out_, DieWithDriver{});
    } catch (const std::exception& e) {
      return fail(std::string("cannot start '") + path + "': " + e.what());
    }
    read();
    return {};
  }

  void send_frame(const Frame& f) override {
    if (closed()) return;
    wqueue_.push_back(encode_frame(f));
    if (wqueue_.size() == 1) write_next();
  }

  void close() override {
    boost::system::error_code ec;
    in_.close(ec);
    out_.close(ec);
  }

 private:
  void read() {
    out_.async_read_some(asio::buffer(buf_), [this](boost::system::error_code ec, std::size_t n) {
      if (closed()) return;
      if (n > 0 && !on_bytes({buf_.data(), n})) return;
      if (ec) {
        report_closed(shutting_down_ ? "" : "daemon exited unexpectedly");
        return;
      }
      read();
    });
  }
  void write_next() {
    asio::async_write(in_, asio::buffer(wqueue_.front()), [this](boost::system::error_code ec, std::size_t) {
      if (closed()) return;
      if (ec) return report_closed(shutting_down_ ? "" : "daemon control channel broke: " + ec.message());
      wqueue_.pop_front();
      if (!wqueue_.empty()) write_next();
    });
  }

  bp::async_pipe in_, out_;
  std::unique_ptr<bp::child> child_;
  std::array<std::uint8_t, 65536> buf_{};
  std::deque<wire::Bytes> wqueue_;
};

}  // namespace

Result<std::unique_ptr<DaemonLink>> launch_local_daemon(asio::io_context& io, const std::string& host,
                                                        const std::string& daemon_path,
                                                        const std::string& log_level, DaemonEvents ev) {
  auto d = std::make_unique<LocalDaemon>(io, host, std::move(ev));
  if (auto ok = d->start(daemon_path, log_level); !ok) return Failure{ok.error()};
  return std::unique_ptr<DaemonLink>(std::move(d));
}

}  // namespace elasticrun::cmd
