#include "cmd/job.h"

#include "cmd/exit_codes.h"
#include "common/env.h"
#include "common/executable.h"
#include "common/log.h"
#include "common/python_command.h"
#include "cmd/ssh_daemon.h"
#include "cmd/tcp_daemon.h"
#include "discovery/local_host.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <csignal>
#include <cstring>
#include <filesystem>

namespace elasticrun::cmd {

namespace asio = boost::asio;


Job::Job(Options opts)
    : opts_(std::move(opts)), lookups_(io_), secret_(auth::random_secret()), controller_(ControllerConfig::of(opts_)),
      output_(opts_.output_dir), signals_(io_, SIGINT, SIGTERM, SIGHUP), controller_timer_(io_), stop_timer_(io_),
      heartbeat_timer_(io_), preempt_timer_(io_) {
  run_id_ = opts_.run_id;
  if (run_id_.empty()) {
    auto r = auth::random_secret();
    run_id_ = auth::to_hex(std::span(r).first(8));
  }
}

Job::~Job() = default;

Result<std::string> Job::daemon_path() const {
  if (!opts_.daemon_path.empty()) {
    if (auto p = find_executable(opts_.daemon_path, ""); !p)
      return fail(fmt::format("--daemon-path: {}", p.error()));
    return opts_.daemon_path;
  }
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  for (auto cand : {self / "elasticrund", self / "../daemon/elasticrund", self / "../sbin/elasticrund"})
    if (find_executable(cand.string(), "")) return std::filesystem::weakly_canonical(cand, ec).string();
  const char* path = std::getenv("PATH");
  if (auto p = find_executable("elasticrund", path ? path : ""); p) return p;
  return fail("cannot find elasticrund beside elasticrun or in PATH (use --daemon-path)");
}

Result<void> Job::start() {
  // --preload is for a Python run the fork server can make; any other command runs as
  // it would without the flag, which is said once.
  if (!opts_.preload.empty()) {
    if (auto py = parse_python_command(opts_.command); !py) {
      fmt::print(stderr, "elasticrun: --preload ignored: {}\n", py.error());
      opts_.preload.clear();
    }
  }
  if (!events_.open(opts_.events_file))
    return fail(fmt::format("cannot open --events file '{}': {}", opts_.events_file, std::strerror(errno)));
  // Remote hosts (or hosts a discovery script may name) must reach the rendezvous
  // server over the network; a job on this machine alone keeps it on loopback.
  bool remote = opts_.discovered();
  // The static hosts are looked up here, before the job's loop runs (a slow resolver
  // stalls nothing yet); discovered ones later, off the loop's thread.
  for (const auto& h : opts_.hosts) {
    auto place = discovery::look_up_host(h.name);
    lookups_.remember(h.name, place);
    remote = remote || !place.local;
  }
  if (opts_.daemon_port > 0) {
    auto s = auth::read_secret_file(opts_.daemon_secret_file);
    if (!s) return fail(s.error() + " (--daemon-secret-file)");
    cluster_secret_ = *s;
  } else {
    auto dpath = daemon_path();
    if (!dpath) return Failure{dpath.error()};
    daemon_path_ = *dpath;
  }
  if (opts_.report_fd >= 0) {
    try {
      reports_ = std::make_unique<ReportChannel>(io_, opts_.report_fd);
    } catch (const std::exception& e) {
      return fail(fmt::format("--report-fd {}: {}", opts_.report_fd, e.what()));
    }
  }
  char cwd[PATH_MAX] = {};
  if (!::getcwd(cwd, sizeof cwd)) return fail("cannot read the working directory");
  cwd_ = cwd;
  rendezvous::Server::Callbacks cb;
  // Each concerns the worker the connection came from: not the place's worker now if
  // that is a successor of it (the place was removed and listed again).
  cb.on_worker_joined = [this](const rendezvous::WorkerPlace& p, std::uint64_t e) {
    feed([p, e](EpochController& c, TimePoint) { c.worker_joined(p, e); });
  };
  cb.on_synced = [this](const rendezvous::WorkerPlace& p, std::uint64_t e, std::uint64_t commits) {
    feed([p, e, commits](EpochController& c, TimePoint) { c.worker_synced(p, e, commits); });
  };
  cb.on_epoch_abandoned = [this](const rendezvous::WorkerPlace& p, std::uint64_t e) {
    feed([p, e](EpochController& c, TimePoint now) { c.epoch_abandoned(p, e, now); });
  };
  cb.on_worker_lost = [this](const rendezvous::WorkerPlace& p, std::uint64_t) {
    feed([p](EpochController& c, TimePoint now) { c.worker_lost(p, now); });
  };
  cb.on_worker_silent = [this](const rendezvous::WorkerPlace& p, std::uint64_t, std::chrono::milliseconds silent) {
    feed([p, silent](EpochController& c, TimePoint now) { c.worker_silent(p, silent, now); });
  };
  cb.on_report = [this](const rendezvous::WorkerPlace& p, std::uint64_t e, std::int64_t step,
                        const nlohmann::json& metrics, rendezvous::ReportAnswer answer) {
    on_report(p, e, step, metrics, std::move(answer));
  };
  cb.on_checkpoint = [this](const rendezvous::WorkerPlace& p, std::uint64_t, const msg::CheckpointNote& n) {
    on_checkpoint(p, n);
  };
  try {
    server_ = std::make_unique<rendezvous::Server>(
        io_, secret_, asio::ip::tcp::endpoint(asio::ip::make_address(remote ? "0.0.0.0" : "127.0.0.1"), 0),
        std::move(cb),
        rendezvous::ServerLimits{.keep_alive = opts_.host_timeout, .worker_timeout = opts_.worker_timeout});
  } catch (const std::exception& e) {
    return fail(std::string("cannot start the rendezvous server: ") + e.what());
  }
  rendezvous_addr_ = fmt::format("127.0.0.1:{}", server_->port());
  ER_LOG(driver, info, "rendezvous server on {}; run id {}", rendezvous_addr_, run_id_);
  start_hosts();
  return {};
}

void Job::start_hosts() {
  if (!opts_.discovered())
    return feed([hosts = opts_.hosts](EpochController& c, TimePoint now) { c.use_hosts(hosts, now); });
  discovery::HostWatcher::Callbacks cb;
  cb.on_change = [this](const std::vector<discovery::Host>& hosts) {
    feed([hosts](EpochController& c, TimePoint now) { c.hosts_changed(hosts, now); });
  };
  cb.on_error = [this](const std::string& why) {
    events_.emit("discovery_error", {{"message", why}});  // the watcher logs it, rate-limited
  };
  cb.on_fatal = [this](const std::string& why) {
    end_job(exit_code::kLaunchFailed, "host discovery failed on its first run: " + why);
  };
  if (opts_.discovery_fd >= 0) {
    // A feed is read as it arrives: each poll waits for the next list.
    discovery::FeedOptions fo{.default_slots = opts_.slots_per_host};
    watcher_ = std::make_unique<discovery::HostWatcher>(io_, discovery::make_feed_source(io_, opts_.discovery_fd, fo),
                                                        std::chrono::milliseconds(0), std::move(cb));
  } else {
    discovery::ScriptOptions so{.path = opts_.discovery_script, .timeout = opts_.discovery_timeout,
                                .default_slots = opts_.slots_per_host};
    watcher_ = std::make_unique<discovery::HostWatcher>(io_, discovery::make_script_source(io_, so),
                                                        opts_.discovery_interval, std::move(cb));
  }
  watcher_->start();
  if (!opts_.request_hosts_script.empty()) {
    requester_ = std::make_unique<HostRequester>(
        io_, opts_.request_hosts_script, opts_.request_interval, opts_.discovery_timeout,
        [this](const RequestAction& a, const std::string& error) {
          bool request = a.kind == RequestAction::Kind::request;
          nlohmann::json fields = request ? nlohmann::json{{"slots", a.slots}} : nlohmann::json{{"hosts", a.hosts}};
          if (!error.empty()) {
            fields["message"] = error;
            ER_LOG(driver, warn, "{} (the job goes on; tried again in {:.0f} s)", error,
                   opts_.request_interval.count() / 1000.0);
          }
          events_.emit(!error.empty() ? "request_failed" : request ? "hosts_requested" : "hosts_released", fields);
        });
  }
}

// What --request-hosts-script's policy looks at (cmd/host_requests.h).
RequestView Job::request_view() const {
  auto now = std::chrono::steady_clock::now();
  const auto& m = controller_.membership();
  RequestView v;
  v.max_np = opts_.max_np;
  v.usable_slots = m.usable_slots(now);
  for (const auto& h : m.discovered()) v.offered.insert(h.name);
  for (const auto& w : controller_.assignment().workers) v.in_use.insert(w.host);
  v.running = !v.in_use.empty() && !controller_.finishing() && !controller_.finished();
  return v;
}

DaemonEvents Job::daemon_events() {
  DaemonEvents ev;
  ev.on_started = [this](const std::string& host, const msg::Started& s) {
    feed([host, s](EpochController& c, TimePoint) { c.worker_started(host, s.slot, static_cast<int>(s.pid)); });
  };
  ev.on_output = [this](const std::string& host, const msg::Output& o) {
    auto rank = controller_.rank_at(host, o.slot);
    if (!rank || (o.stream != 1 && o.stream != 2)) return;
    if (auto ok = output_.write({host, static_cast<int>(o.slot)}, *rank, o.stream, o.data); !ok)
      end_job(exit_code::kLaunchFailed, ok.error());
  };
  ev.on_exited = [this](const std::string& host, const msg::Exited& e) {
    feed([host, e](EpochController& c, TimePoint now) { c.worker_exited(host, e, now); });
    maybe_done();
  };
  ev.on_spawn_failed = [this](const std::string& host, const msg::SpawnFailed& f) {
    feed([host, f](EpochController& c, TimePoint now) { c.spawn_failed(host, f.slot, f.message, now); });
  };
  ev.on_port_reserved = [this](const std::string& host, const msg::PortReserved& r) {
    feed([host, r](EpochController& c, TimePoint) {
      c.port_reserved(host, r.epoch, static_cast<int>(r.port), r.error, r.store);
    });
  };
  ev.on_preempted = [this](const std::string& host, const msg::Preempted& p) { on_preempted(host, p); };
  ev.on_closed = [this](const std::string& host, bool clean, const std::string& why) {
    on_daemon_closed(host, clean, why);
  };
  return ev;
}

void Job::with_host(const std::string& host, std::function<void(const discovery::HostPlace&)> then) {
  lookups_.when_known(host, [this, then = std::move(then)](const discovery::HostPlace& place) {
    if (!controller_.finished()) then(place);
  });
}

// The host's daemon, started if need be; `place` is its name looked up (with_host).
DaemonLink* Job::ensure_daemon(const std::string& host, const discovery::HostPlace& place) {
  auto it = daemons_.find(host);
  if (it != daemons_.end() && !it->second->closed()) return it->second.get();
  std::unique_ptr<DaemonLink> link;
  std::string addr = rendezvous_addr_;
  bool local = place.local;
  if (!local) {
    // The remote workers reach us at the address our traffic to that host leaves from.
    if (place.toward.empty()) {
      on_daemon_closed(host, false, "cannot resolve or route to the host");
      return nullptr;
    }
    addr = fmt::format("{}:{}", place.toward, server_->port());
  }
  if (cluster_secret_) {
    link = connect_daemon(io_, host, static_cast<std::uint16_t>(opts_.daemon_port), *cluster_secret_,
                          opts_.ssh.connect_timeout, opts_.host_timeout, daemon_events());
  } else if (local) {
    auto started = launch_local_daemon(io_, host, daemon_path_, opts_.log_level, daemon_events());
    if (!started) {
      end_job(exit_code::kLaunchFailed, fmt::format("starting daemon on '{}': {}", host, started.error()));
      return nullptr;
    }
    link = std::move(*started);
  } else if (opts_.launcher == Options::Launcher::srun) {
    auto started = launch_srun_daemon(io_, host, daemon_path_, opts_.log_level, opts_.srun_path, daemon_events());
    if (!started) {
      end_job(exit_code::kLaunchFailed, fmt::format("starting srun for '{}': {}", host, started.error()));
      return nullptr;
    }
    link = std::move(*started);
  } else {
    link = launch_ssh_daemon(io_, host, daemon_path_, opts_.log_level, opts_.ssh, daemon_events());
  }
  msg::Config config{wire::Bytes(secret_.begin(), secret_.end()), addr, host, cwd_,
                     static_cast<std::uint32_t>(heartbeat_interval().count()),
                     static_cast<std::uint32_t>(opts_.host_timeout.count())};
  config.preload = opts_.preload;
  // A local daemon answers within the host timeout; one reached over a network (SSH, a
  // listening daemon, srun) gets the connect timeout on top.
  bool networked = cluster_secret_ || !local;
  auto within = opts_.host_timeout + (networked ? opts_.ssh.connect_timeout : std::chrono::milliseconds(0));
  link->expect_answer_by(std::chrono::steady_clock::now() + within,
                         fmt::format("{:.1f} s ({})", within.count() / 1000.0,
                                     networked ? "--ssh-connect-timeout + --host-timeout" : "--host-timeout"));
  config.preempt_grace_ms = static_cast<std::uint32_t>(opts_.preempt_grace.count());
  link->send(config);
  DaemonLink* raw = link.get();
  daemons_[host] = std::move(link);
  return raw;
}

void Job::on_daemon_closed(const std::string& host, bool clean, const std::string& why) {
  auto it = daemons_.find(host);
  DaemonEnd how = clean                                          ? DaemonEnd::clean
                  : it != daemons_.end() && it->second->ready() ? DaemonEnd::lost
                                                                 : DaemonEnd::not_started;
  feed([host, how, why](EpochController& c, TimePoint now) { c.daemon_closed(host, how, why, now); });
  maybe_done();
}

// Rank 0's report: into the events log, then to --report-fd for the decision. The
// controller has no part in it: a report changes nothing in the job's membership.
void Job::on_report(const rendezvous::WorkerPlace& p, std::uint64_t epoch, std::int64_t step,
                    const nlohmann::json& metrics, rendezvous::ReportAnswer answer) {
  int size = server_->assignment().size();
  events_.emit("report", {{"step", step}, {"metrics", metrics}, {"epoch", epoch}, {"size", size}});
  ER_LOG(driver, debug, "report of step {} from rank 0 on '{}' (epoch {})", step, p.host, epoch);
  if (!reports_) return answer(msg::Decision::keep_going);
  reports_->ask(step, report_line(step, metrics, epoch, size), std::move(answer));
}

// A worker's durable checkpointing: each write, restore, skipped file and failure goes to
// the events log; all but a routine write are also told to the user. The controller has
// no part in it: the worker restores by itself when it holds no state.
void Job::on_checkpoint(const rendezvous::WorkerPlace& p, const msg::CheckpointNote& n) {
  static constexpr const char* kEvent[] = {"", "checkpoint_saved", "checkpoint_restored", "checkpoint_skipped",
                                           "checkpoint_failed"};
  nlohmann::json fields = {{"epoch", n.epoch}, {"commit", n.commit}, {"path", n.path}, {"rank", p.rank},
                           {"host", p.host}};
  if (n.event == msg::CheckpointEvent::saved || n.event == msg::CheckpointEvent::restored) {
    fields["bytes"] = n.bytes;
    fields["seconds"] = n.millis / 1000.0;
  }
  if (!n.detail.empty()) fields["reason"] = n.detail;
  if (n.requested) fields["requested"] = true;
  events_.emit(kEvent[static_cast<int>(n.event)], fields);
  // The checkpoint a SIGTERM waits for: written (or failed: there is nothing more to wait for).
  if (preempting_ && n.requested && !controller_.finished()) {
    preempt_timer_.cancel();
    if (n.event == msg::CheckpointEvent::saved)
      end_job(128 + SIGTERM, fmt::format("interrupted by SIGTERM; commit {} is in checkpoint {}; stopping all workers",
                                         n.commit, n.path));
    else if (n.event == msg::CheckpointEvent::failed)
      end_job(128 + SIGTERM, "interrupted by SIGTERM; the last checkpoint failed (" + n.detail +
                                 "); stopping all workers");
  }
  switch (n.event) {
    case msg::CheckpointEvent::saved: break;
    case msg::CheckpointEvent::restored:
      fmt::print(stderr, "elasticrun: rank {} restored commit {} from {}\n", p.rank, n.commit, n.path);
      break;
    case msg::CheckpointEvent::skipped:
      fmt::print(stderr, "elasticrun: rank {} skipped checkpoint {}: {}\n", p.rank, n.path, n.detail);
      break;
    case msg::CheckpointEvent::failed:
      fmt::print(stderr, "elasticrun: rank {} could not write a durable checkpoint: {}\n", p.rank, n.detail);
      break;
  }
}

// The controller decided the job is over: tell every worker, stop every daemon.
void Job::stop_everything(const std::string& message) {
  heartbeat_timer_.cancel();  // the controller's timer stays: SIGKILLs after the grace still fall due
  if (watcher_) watcher_->stop();
  if (requester_) requester_->stop();
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

// Four beats per --host-timeout (at most 5 s apart), both ways.
std::chrono::milliseconds Job::heartbeat_interval() const {
  return std::clamp(opts_.host_timeout / 4, std::chrono::milliseconds(msg::kMinHeartbeatMs),
                    std::chrono::milliseconds(5000));
}

// Sends every daemon a heartbeat every heartbeat_interval(), and gives up a daemon that
// has sent nothing (not even its own heartbeats) for --host-timeout: a host behind a cut
// link, powered off, or a stopped daemon, none of which closes a connection. The timer
// ticks more often than it beats, so that the silence is caught soon after the timeout.
void Job::heartbeat() {
  using namespace std::chrono;
  auto tick = std::clamp(heartbeat_interval() / 5, milliseconds(10), milliseconds(250));
  heartbeat_timer_.expires_after(tick);
  heartbeat_timer_.async_wait([this, tick](boost::system::error_code ec) {
    if (ec || controller_.finished()) return;
    auto now = steady_clock::now();
    // A tick far behind its time means this loop itself stalled (the machine swapped,
    // the driver was stopped): the daemons' frames wait unread in the sockets, and
    // their silence proves nothing.
    bool stalled = now - last_tick_ > tick + std::min(milliseconds(500), opts_.host_timeout / 4);
    last_tick_ = now;
    bool beat = now - last_beat_ >= heartbeat_interval() - tick / 2;
    if (beat) last_beat_ = now;
    std::vector<std::string> silent, unanswered;
    for (auto& [h, d] : daemons_) {
      if (d->closed()) continue;
      if (beat) d->send(msg::Heartbeat{});
      if (stalled) {
        d->heard_now();
        if (!d->ready()) d->expect_answer_by(std::max(d->answer_by(), now + tick));
      } else if (d->ready() && now - d->last_heard() > opts_.host_timeout) {
        silent.push_back(h);
      } else if (!d->ready() && now > d->answer_by()) {
        unanswered.push_back(h);
      }
    }
    if (requester_) requester_->tick(request_view());
    // Failing a host can start an epoch and launch daemons: look each one up afresh.
    for (const auto& h : silent) {
      auto it = daemons_.find(h);
      if (it == daemons_.end() || it->second->closed() || controller_.finished()) continue;
      it->second->lost(fmt::format("heard nothing from it for {:.1f} s (--host-timeout)",
                                   duration<double>(now - it->second->last_heard()).count()));
    }
    for (const auto& h : unanswered) {
      auto it = daemons_.find(h);
      if (it == daemons_.end() || it->second->closed() || controller_.finished()) continue;
      it->second->lost(fmt::format("it did not answer within {}", it->second->answer_limit()));
    }
    heartbeat();
  });
}

void Job::maybe_done() {
  if (!controller_.finished()) return;
  for (auto& [h, d] : daemons_)
    if (!d->closed()) return;
  stop_timer_.cancel();
  preempt_timer_.cancel();
  signals_.cancel();
  if (server_) server_->stop();
  io_.stop();
}

// SIGINT and SIGHUP stop the job at once. SIGTERM, which schedulers send before their
// SIGKILL (Slurm's scancel, preemption and time limit; Kubernetes deleting the pod), first
// asks for a last checkpoint when there is a committed state to save and somewhere to
// save it; a second signal stops the job at once.
void Job::wait_signals() {
  signals_.async_wait([this](boost::system::error_code ec, int sig) {
    if (ec) return;
    if (sig == SIGTERM && begin_preemption(sig)) return wait_signals();
    preempt_timer_.cancel();
    end_job(128 + sig, fmt::format("interrupted by SIG{}; stopping all workers", sigabbrev_np(sig)));
  });
}

// Asks every worker for a checkpoint at its next commit (rank 0 writes it). A daemon's
// notice is not repeated within a second (every daemon of a cancelled job says so at
// once); the driver's own SIGTERM always asks afresh, since it waits for a save that
// answers a request made after it: one a daemon's notice asked for may have been
// written already.
bool Job::request_checkpoint(const std::string& why, bool fresh) {
  if (opts_.preempt_grace.count() == 0 || !server_ || !controller_.keeps_state() || controller_.finished()) return false;
  auto now = std::chrono::steady_clock::now();
  if (!fresh && checkpoint_asked_ && now - *checkpoint_asked_ < std::chrono::seconds(1)) return true;
  checkpoint_asked_ = now;
  server_->request_checkpoint(why);
  return true;
}

bool Job::begin_preemption(int sig) {
  if (preempting_ || !request_checkpoint(fmt::format("SIG{}", sigabbrev_np(sig)), true)) return false;
  preempting_ = true;
  double grace = opts_.preempt_grace.count() / 1000.0;
  events_.emit("preempting", {{"signal", sig}, {"grace", grace}});
  fmt::print(stderr, "elasticrun: SIG{}: the workers' next commit is the last checkpoint; waiting up to {:.1f} s for it\n",
             sigabbrev_np(sig), grace);
  preempt_timer_.expires_after(opts_.preempt_grace);
  preempt_timer_.async_wait([this, sig, grace](boost::system::error_code ec) {
    if (ec) return;
    end_job(128 + sig, fmt::format("interrupted by SIG{}; no checkpoint within {:.1f} s; stopping all workers",
                                   sigabbrev_np(sig), grace));
  });
  return true;
}

// A daemon got a SIGTERM (Slurm signals every step's task; a pod being deleted): its
// workers go on for --preempt-grace, and the job saves what it can meanwhile. The job
// itself goes on: the host's workers leave when the grace is over, as any lost host's.
void Job::on_preempted(const std::string& host, const msg::Preempted& p) {
  events_.emit("host_preempted", {{"host", host}, {"signal", p.signal}});
  bool asked = request_checkpoint(fmt::format("{}'s daemon got SIG{}", host, sigabbrev_np(p.signal)));
  ER_LOG(driver, warn, "{}: its daemon got signal {}; its workers stop within {:.1f} s{}", host, p.signal,
         opts_.preempt_grace.count() / 1000.0, asked ? "; asked the workers for a checkpoint" : "");
}

int Job::run() {
  wait_signals();
  if (auto ok = start(); !ok) {
    end_job(exit_code::kLaunchFailed, ok.error());
  } else {
    last_tick_ = last_beat_ = std::chrono::steady_clock::now();
    heartbeat();
  }
  io_.run();
  daemons_.clear();
  return controller_.finished() ? controller_.exit_code() : exit_code::kLaunchFailed;
}

}  // namespace elasticrun::cmd
