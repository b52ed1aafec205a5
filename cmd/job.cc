#include "cmd/job.h"

#include "cmd/exit_codes.h"
#include "common/log.h"
#include "discovery/local_host.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstring>
#include <filesystem>

namespace elasticrun::cmd {

namespace asio = boost::asio;

Job::Job(Options opts)
    : opts_(std::move(opts)), secret_(auth::random_secret()), output_(opts_.output_dir),
      signals_(io_, SIGINT, SIGTERM, SIGHUP), start_timer_(io_), stop_timer_(io_) {}

Job::~Job() = default;

namespace {

bool executable_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

std::string describe_exit(const msg::Exited& e) {
  if (e.signal != 0) {
    const char* abbrev = sigabbrev_np(e.signal);
    return fmt::format("was killed by signal {} (SIG{})", e.signal, abbrev ? abbrev : "?");
  }
  return fmt::format("exited with code {}", e.code);
}

}  // namespace

Result<std::string> Job::daemon_path() const {
  if (!opts_.daemon_path.empty()) {
    if (!executable_file(opts_.daemon_path))
      return fail(fmt::format("--daemon-path '{}' is not an executable file", opts_.daemon_path));
    return opts_.daemon_path;
  }
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  for (auto cand : {self / "elasticrund", self / "../daemon/elasticrund", self / "../sbin/elasticrund"})
    if (executable_file(cand.string())) return std::filesystem::weakly_canonical(cand, ec).string();
  if (const char* path = std::getenv("PATH")) {
    std::string p = path;
    for (std::size_t s = 0, c; s <= p.size(); s = c + 1) {
      c = p.find(':', s);
      if (c == std::string::npos) c = p.size();
      std::string cand = p.substr(s, c - s) + "/elasticrund";
      if (executable_file(cand)) return cand;
    }
  }
  return fail("cannot find elasticrund beside elasticrun or in PATH (use --daemon-path)");
}

Result<void> Job::start() {
  for (const auto& h : opts_.hosts)
    if (!discovery::is_local_host(h.name))
      return fail(fmt::format("host '{}' is not this machine; launching on remote hosts needs SSH, "
                              "which this version does not support yet", h.name));
  auto dpath = daemon_path();
  if (!dpath) return Failure{dpath.error()};
  rendezvous::Server::Callbacks cb;
  cb.on_worker_joined = [this](const rendezvous::WorkerPlace& p, std::uint64_t) {
    if (Worker* w = worker(p.host, static_cast<std::uint32_t>(p.slot)); w && !w->joined) {
      w->joined = true;
      if (++joined_ == assignment_.size()) start_timer_.cancel();
    }
  };
  try {
    server_ = std::make_unique<rendezvous::Server>(
        io_, secret_, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0), std::move(cb));
  } catch (const std::exception& e) {
    return fail(std::string("cannot start the rendezvous server: ") + e.what());
  }
  assignment_ = rendezvous::assign(opts_.hosts, opts_.np, 1);
  server_->start_epoch(assignment_, msg::NotifyKind::abort, "");
  for (const auto& w : assignment_.workers)
    workers_[{w.host, static_cast<std::uint32_t>(w.slot)}] = Worker{w.rank};

  DaemonEvents ev;
  ev.on_started = [this](const std::string& host, const msg::Started& s) {
    if (Worker* w = worker(host, s.slot)) w->started = true, w->pid = static_cast<int>(s.pid);
  };
  ev.on_output = [this](const std::string& host, const msg::Output& o) {
    Worker* w = worker(host, o.slot);
    if (!w || (o.stream != 1 && o.stream != 2)) return;
    if (auto ok = output_.write(w->rank, o.stream, o.data); !ok) finish(exit_code::kLaunchFailed, ok.error());
  };
  ev.on_exited = [this](const std::string& host, const msg::Exited& e) { on_exited(host, e); };
  ev.on_spawn_failed = [this](const std::string& host, const msg::SpawnFailed& f) {
    Worker* w = worker(host, f.slot);
    finish(exit_code::kLaunchFailed, fmt::format("cannot start rank {} on host '{}': {}", w ? w->rank : -1,
                                                 host, f.message));
  };
  ev.on_closed = [this](const std::string& host, bool clean, const std::string& why) {
    on_closed(host, clean, why);
  };
  char cwd[PATH_MAX] = {};
  if (!::getcwd(cwd, sizeof cwd)) return fail("cannot read the working directory");
  std::string addr = fmt::format("127.0.0.1:{}", server_->port());
  for (const auto& h : opts_.hosts) {
    if (!assignment_.find(h.name, 0)) continue;  // no ranks there
    auto link = launch_local_daemon(io_, h.name, *dpath, opts_.log_level, ev);
    if (!link) return fail(fmt::format("starting daemon on '{}': {}", h.name, link.error()));
    (*link)->send(msg::Config{wire::Bytes(secret_.begin(), secret_.end()), addr, h.name, cwd});
    spawn_workers(**link);
    daemons_[h.name] = std::move(*link);
  }
  return {};
}

void Job::spawn_workers(DaemonLink& d) {
  for (const auto& w : assignment_.workers)
    if (w.host == d.host())
      d.send(msg::Spawn{static_cast<std::uint32_t>(w.slot), assignment_.epoch, w.rank, assignment_.size(),
                        opts_.command, opts_.env});
}

Job::Worker* Job::worker(const std::string& host, std::uint32_t slot) {
  auto it = workers_.find({host, slot});
  return it == workers_.end() ? nullptr : &it->second;
}

void Job::on_exited(const std::string& host, const msg::Exited& e) {
  Worker* w = worker(host, e.slot);
  if (!w || w->exited) return;
  w->exited = true;
  output_.finish(w->rank);
  if (exit_code_ >= 0) return maybe_done();  // already stopping: exits are expected
  if (e.code != 0 || e.signal != 0) {
    finish(exit_code::kWorkerFailed, fmt::format("rank {} (host '{}', slot {}, pid {}) {}", w->rank, host,
                                                 e.slot, e.pid, describe_exit(e)));
    return;
  }
  bool all = true;
  for (const auto& [k, wk] : workers_) all = all && wk.exited;
  if (all) finish(exit_code::kOk, "");
}

void Job::on_closed(const std::string& host, bool clean, const std::string& why) {
  if (exit_code_ < 0 && !clean)
    finish(exit_code::kWorkerFailed, fmt::format("lost the daemon on host '{}': {}", host, why));
  maybe_done();
}

void Job::on_start_timeout() {
  std::string missing;
  int n = 0;
  for (const auto& [k, w] : workers_)
    if (!w.joined && !w.exited && n++ < 8) missing += fmt::format(" {}@{}", w.rank, k.first);
  finish(exit_code::kTimeout, fmt::format("{} of {} workers did not join within {:.1f} s (rank@host:{})",
                                          assignment_.size() - joined_, assignment_.size(),
                                          opts_.start_timeout.count() / 1000.0, missing));
}

void Job::finish(int code, const std::string& message) {
  if (exit_code_ >= 0) return;
  exit_code_ = code;
  if (!message.empty()) fmt::print(stderr, "elasticrun: {}\n", message);
  start_timer_.cancel();
  if (server_) server_->notify_all(msg::NotifyKind::shutdown, message.empty() ? "job finished" : message);
  for (auto& [h, d] : daemons_) d->shutdown(std::chrono::milliseconds(2000));
  // The daemons kill stragglers after 2 s; if one does not report back by then, cut it off.
  stop_timer_.expires_after(std::chrono::milliseconds(4000));
  stop_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    ER_LOG(driver, warn, "daemons did not stop in time; closing their links");
    for (auto& [h, d] : daemons_) d->close();
    io_.stop();
  });
  maybe_done();
}

void Job::maybe_done() {
  if (exit_code_ < 0) return;
  for (auto& [h, d] : daemons_)
    if (!d->closed()) return;
  stop_timer_.cancel();
  signals_.cancel();
  if (server_) server_->stop();
  io_.stop();
}

int Job::run() {
  signals_.async_wait([this](boost::system::error_code ec, int sig) {
    if (ec) return;
    finish(128 + sig, fmt::format("interrupted by SIG{}; stopping all workers", sigabbrev_np(sig)));
  });
  if (auto ok = start(); !ok) {
    finish(exit_code::kLaunchFailed, ok.error());
  } else {
    start_timer_.expires_after(opts_.start_timeout);
    start_timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec && joined_ < assignment_.size()) on_start_timeout();
    });
  }
  io_.run();
  daemons_.clear();
  return exit_code_ < 0 ? exit_code::kLaunchFailed : exit_code_;
}

}  // namespace elasticrun::cmd
