#include "cmd/daemon_link.h"

#include "common/child_process.h"
#include "common/framed_stream.h"
#include "common/log.h"
#include "common/shm_dirs.h"

#include <fmt/format.h>

#include <boost/asio.hpp>

#include <csignal>
#include <optional>

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
    case msg::kPortReserved: ev_.on_port_reserved(host_, msg::parse<msg::PortReserved>(f)); return;
    case msg::kPreempted: ev_.on_preempted(host_, msg::parse<msg::Preempted>(f)); return;
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

namespace asio = boost::asio;

class ChildDaemon final : public DaemonLink, private FramedStream::Handler {
 public:
  ChildDaemon(asio::io_context& io, std::string host, DaemonEvents ev) : DaemonLink(std::move(host), std::move(ev)), io_(io) {}
  ~ChildDaemon() override {
    close();
    if (!child_) return;
    // The daemon exits once its workers are gone; a killed one could not clean up
    // after its workers, so their shared-memory directories are removed either way
    // (here, when the child is the daemon itself and not srun).
    int pid = child_->pid();
    child_->wait_for(std::chrono::seconds(3));
    child_.reset();  // still there (stopped, or hung): killed
    if (!through_srun_) shm_dirs::remove_all_of(pid);
  }

  // `argv`: the daemon's command line, or srun's that runs it on another node.
  Result<void> start(std::vector<std::string> argv, bool through_srun) {
    through_srun_ = through_srun;
    ChildSpec spec;
    spec.program = argv.front();
    spec.argv = std::move(argv);
    const std::string& path = spec.program;
    spec.in = spec.out = ChildSpec::Stdio::pipe;
    // In the driver's process group, so that ^C in a terminal reaches it too.
    spec.own_group = false;
    // SIGTERM, not SIGKILL: the daemon then stops its workers and removes their
    // shared-memory directories before it exits.
    spec.death_signal = SIGTERM;
    auto child = ChildProcess::start(io_, spec);
    if (!child) return fail("cannot start '" + path + "': " + child.error());
    child_ = std::move(*child);
    stream_.emplace(io_, child_->take_pipe(1).release(), child_->take_pipe(0).release(),
                    static_cast<FramedStream::Handler&>(*this));
    stream_->start();
    return {};
  }

  void send_frame(const Frame& f) override {
    if (!closed() && stream_) stream_->send(f);
  }

  void close() override {
    if (stream_) stream_->close();
  }

 private:
  void on_stream_frame(Frame f) override { on_frame(f); }
  void on_stream_end(const StreamEnd& end) override {
    switch (end.kind) {
      case StreamEnd::Kind::bad_stream: return report_closed("bad control stream from daemon: " + end.detail);
      case StreamEnd::Kind::write_error:
        return report_closed(shutting_down_ ? "" : "daemon control channel broke: " + end.detail);
      case StreamEnd::Kind::eof:
      case StreamEnd::Kind::read_error: return report_closed(shutting_down_ ? "" : "daemon exited unexpectedly");
    }
  }

  asio::io_context& io_;
  std::unique_ptr<ChildProcess> child_;
  std::optional<FramedStream> stream_;
  bool through_srun_ = false;
};

std::vector<std::string> daemon_argv(const std::string& daemon_path, const std::string& log_level) {
  std::vector<std::string> argv{daemon_path, "--stdio"};
  if (!log_level.empty()) argv.push_back("--log-level=" + log_level);
  return argv;
}

}  // namespace

std::vector<std::string> srun_daemon_argv(const std::string& srun_path, const std::string& host,
                                          const std::string& daemon_path, const std::string& log_level) {
  // --unbuffered: slurmstepd otherwise holds the task's output until a newline, and a
  // frame need not end in one (it is no pseudo-terminal: the stream stays binary).
  std::vector<std::string> argv{srun_path, "--nodes=1", "--ntasks=1", "--nodelist=" + host, "--overlap",
                                "--unbuffered", "--quiet", "--job-name=elasticrund", "--"};
  for (auto& a : daemon_argv(daemon_path, log_level)) argv.push_back(std::move(a));
  return argv;
}

Result<std::unique_ptr<DaemonLink>> launch_srun_daemon(asio::io_context& io, const std::string& host,
                                                       const std::string& daemon_path, const std::string& log_level,
                                                       const std::string& srun_path, DaemonEvents ev) {
  auto d = std::make_unique<ChildDaemon>(io, host, std::move(ev));
  if (auto ok = d->start(srun_daemon_argv(srun_path, host, daemon_path, log_level), true); !ok)
    return Failure{ok.error()};
  return std::unique_ptr<DaemonLink>(std::move(d));
}

Result<std::unique_ptr<DaemonLink>> launch_local_daemon(asio::io_context& io, const std::string& host,
                                                        const std::string& daemon_path,
                                                        const std::string& log_level, DaemonEvents ev) {
  auto d = std::make_unique<ChildDaemon>(io, host, std::move(ev));
  if (auto ok = d->start(daemon_argv(daemon_path, log_level), false); !ok) return Failure{ok.error()};
  return std::unique_ptr<DaemonLink>(std::move(d));
}

}  // namespace elasticrun::cmd
