#include "cmd/sweep/sweep.h"

#include "cmd/exit_codes.h"
#include "cmd/sweep/driver.h"
#include "common/log.h"

#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace elasticrun::sweep {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

// How many times a trial starts again after its job ended with a failed host.
constexpr int kHostLossRestarts = 3;

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  return fmt::format("exited with code {}", WEXITSTATUS(status));
}

}  // namespace

Sweep::Trial* Sweep::find(const std::string& id) {
  for (auto& t : trials_)
    if (t.rec.id == id) return &t;
  return nullptr;
}

// Starts what fits, then hands the spare slots to running trials, best first.
void Sweep::schedule() {
  if (interrupted_ || exit_code_ >= 0) return;
  account_usage();
  int running = 0;
  for (const auto& t : trials_) running += t.job ? 1 : 0;
  for (auto& t : trials_) {
    if (t.rec.state != "pending" || t.job) continue;
    if (o_.max_concurrent > 0 && running >= o_.max_concurrent) break;
    if (!pool_->start(TrialNeed{t.rec.id, min_np_, max_np_}, static_cast<int>(trials_.size())))
      break;  // in order: no overtaking
    start(t);
    if (t.job) ++running;
  }
  pool_->set_ranking(ranking());
  pool_->allocate();
  for (auto& t : trials_)
    if (t.job) send_share(t);
  account_usage();
  bool all_done = std::all_of(trials_.begin(), trials_.end(), [](const Trial& t) { return t.rec.done(); });
  if (all_done) {
    exit_code_ = 0;
    io_.stop();
  }
}

// "host:slots" lines: the trial's share of the pool, as its job's host feed reads it.
std::string Sweep::share_of(const Trial& t) const {
  std::string text;
  for (const auto& h : pool_->share(t.rec.id)) text += fmt::format("{}:{}\n", h.host, h.slots);
  return text;
}

void Sweep::send_share(Trial& t) {
  std::string text = share_of(t);
  if (text == t.share) return;
  t.share = text;
  t.job->send_hosts(text);
  events_.emit("trial_resized", {{"trial", t.rec.id}, {"slots", pool_->size(t.rec.id)}});
}

void Sweep::start(Trial& t) {
  fs::path dir = exp_->trial_dir(t.rec.id);
  std::error_code ec;
  fs::create_directories(exp_->checkpoint_dir(t.rec.id), ec);
  TrialLaunch l;
  l.program = self_;
  l.dir = dir;
  l.hosts = t.share = share_of(t);
  l.args = {"--min-np", std::to_string(min_np_), "--max-np", std::to_string(max_np_)};
  l.args.insert(l.args.end(), o_.trial_args.begin(), o_.trial_args.end());
  if (!o_.log_level.empty()) l.args.insert(l.args.end(), {"--log-level", o_.log_level});
  std::vector<std::string> env = {"ELASTICRUN_TRIAL_CONFIG=" + t.rec.config.dump(), "ELASTICRUN_TRIAL_ID=" + t.rec.id,
                                  "ELASTICRUN_TRIAL_DIR=" + fs::absolute(exp_->checkpoint_dir(t.rec.id)).string()};
  env.insert(env.end(), o_.env.begin(), o_.env.end());
  for (const auto& e : env) l.args.insert(l.args.end(), {"-x", e});
  l.args.push_back("--");
  l.args.insert(l.args.end(), command_.begin(), command_.end());
  // A durable checkpoint directory in the sweep's environment would be every trial's, and
  // one trial would resume from another's state: trials checkpoint in their own
  // ELASTICRUN_TRIAL_DIR instead.
  for (char** e = environ; *e; ++e)
    if (std::string_view(*e).rfind("ELASTICRUN_CHECKPOINT_", 0) != 0) l.env.emplace_back(*e);
  std::string id = t.rec.id;
  TrialJob::Callbacks cb;
  cb.on_report = [this, id](const nlohmann::json& r) { on_report(*find(id), r); };
  cb.on_event = [this, id](const nlohmann::json& ev) { on_event(*find(id), ev); };
  cb.on_exit = [this, id](int status) { on_exit(*find(id), status); };
  auto job = TrialJob::start(io_, l, std::move(cb));
  if (!job) {
    pool_->release(t.rec.id);
    return end_trial(t, "failed", job.error());
  }
  t.job = std::move(*job);
  t.rec.state = "running";
  t.stopping = t.completed = false;
  t.fail_reason.clear();
  t.lost_host = false;
  t.started = Clock::now();
  save(t);
  events_.emit("trial_started", {{"trial", t.rec.id}, {"config", t.rec.config}, {"slots", pool_->size(t.rec.id)},
                                 {"pid", t.job->pid()}, {"restarts", t.rec.restarts}});
  say(fmt::format("trial {} started on {} slots: {}", t.rec.id, pool_->size(t.rec.id), compact(t.rec.config)));
}

// Every rank of the trial waits for the answer: it goes out first, the records after.
void Sweep::on_report(Trial& t, const nlohmann::json& r) {
  double step = r.value("step", -1.0);
  const auto& m = r.value("metrics", nlohmann::json::object());
  nlohmann::json line = {{"step", r.value("step", nlohmann::json(step))}, {"metrics", m},
                         {"t", std::chrono::duration<double>(Clock::now() - start_).count()}, {"size", r.value("size", 0)}};
  if (!m.contains(metric_) || !m[metric_].is_number()) {
    ER_LOG(driver, warn, "trial {} reported step {} without the metric '{}'", t.rec.id, step, metric_);
    t.job->answer(static_cast<std::int64_t>(step), t.stopping);
    exp_->append_result(t.rec.id, line);
    return;
  }
  double v = m[metric_].get<double>();
  t.rec.last_step = step;
  t.rec.last_metric = v;
  if (!t.rec.best_metric || better(v, *t.rec.best_metric)) t.rec.best_metric = v;
  Decision d = t.stopping ? Decision::stop("") : scheduler_->on_result(t.rec.id, step, v);
  bool decided = d.action != Decision::Action::continue_ && !t.stopping;
  if (decided) {
    t.stopping = true;
    pool_->hold(t.rec.id);
    t.completed = d.completed;
    t.stop_reason = d.reason;
    if (d.action == Decision::Action::exploit) t.exploit = d;
  }
  t.job->answer(static_cast<std::int64_t>(step), t.stopping);
  exp_->append_result(t.rec.id, line);
  exp_->save_scheduler(scheduler_->state());
  save(t);
  events_.emit("trial_result", {{"trial", t.rec.id}, {"step", step}, {"metric", v}, {"workers", t.workers}});
  if (!decided) return;
  if (d.action == Decision::Action::exploit) {
    events_.emit("trial_exploit", {{"trial", t.rec.id}, {"step", step}, {"source", d.source_trial}, {"config", d.new_config}});
    say(fmt::format("trial {} at step {:g} continues from trial {} with {}", t.rec.id, step, d.source_trial,
                    compact(d.new_config)));
  } else {
    events_.emit("trial_decision", {{"trial", t.rec.id}, {"step", step}, {"decision", "stop"}, {"reason", d.reason}});
  }
}

void Sweep::on_event(Trial& t, const nlohmann::json& ev) {
  std::string kind = ev.value("event", "");
  if (kind == "epoch_started") t.workers = ev.value("size", t.workers);
  if (kind == "host_blacklisted")
    t.last_failure = fmt::format("{} on host '{}'", ev.value("reason", ""), ev.value("host", ""));
  // Its job blacklisted its own share (its workers keep failing there): nothing the
  // trial holds can run it. It fails rather than wait out --elastic-timeout.
  if (kind == "waiting_for_slots" && t.job && !interrupted_ && t.fail_reason.empty() &&
      pool_->size(t.rec.id) >= min_np_) {
    t.fail_reason = "its workers failed on every host of its share (last: " + t.last_failure + ")";
    pool_->hold(t.rec.id);
    t.job->terminate();
  }
  // The host itself failed (its daemon was lost or could not start): it leaves the pool.
  // A worker that exited, hung or lost its connection is the trial's own failure; the
  // trial's job handles it.
  if (kind == "host_blacklisted" && ev.value("cause", "") == "daemon_lost") {
    t.lost_host = true;
    std::string host = ev.value("host", "");
    auto known = pool_->hosts();
    if (std::find(known.begin(), known.end(), host) != known.end()) {
      pool_->remove_host(host);
      say(fmt::format("host '{}' failed in trial {} ({}); it leaves the pool", host, t.rec.id, ev.value("reason", "")));
      events_.emit("host_removed", {{"host", host}, {"trial", t.rec.id}, {"reason", ev.value("reason", "")}});
      asio::post(io_, [this] { schedule(); });
    }
  }
}

void Sweep::on_exit(Trial& t, int status) {
  auto job = std::move(t.job);  // destroyed when this returns
  account_usage();
  pool_->release(t.rec.id);
  bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (interrupted_) {
    t.rec.state = "pending";  // continues from its checkpoint after --resume
    save(t);
  } else if (!ok && t.lost_host && t.fail_reason.empty() && t.rec.restarts < kHostLossRestarts) {
    // Its job ended because a host failed under it (every holder of its state was
    // there): the trial starts again elsewhere, from its own checkpoint.
    ++t.rec.restarts;
    t.rec.state = "pending";
    save(t);
    say(fmt::format("trial {} lost its host ({}); it starts again from its checkpoint", t.rec.id, t.last_failure));
    events_.emit("trial_restarted", {{"trial", t.rec.id}, {"reason", t.last_failure}, {"restarts", t.rec.restarts}});
  } else if (!t.fail_reason.empty()) {
    t.rec.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    end_trial(t, "failed", t.fail_reason);
  } else if (ok && t.exploit) {
    // pbt: continue from the better trial's checkpoint with the explored configuration.
    Decision d = *t.exploit;
    t.exploit.reset();
    std::error_code ec;
    fs::path mine = exp_->checkpoint_dir(t.rec.id), theirs = exp_->checkpoint_dir(d.source_trial);
    fs::remove_all(mine, ec);
    fs::copy(theirs, mine, fs::copy_options::recursive, ec);
    if (ec) fs::create_directories(mine, ec);
    t.rec.config = d.new_config;
    exp_->save_params(t.rec);
    ++t.rec.restarts;
    t.rec.state = "pending";
    save(t);
  } else if (ok) {
    bool cut = t.stopping && !t.completed;
    end_trial(t, cut ? "stopped" : "finished", cut ? "stopped by the scheduler: " + t.stop_reason : "");
  } else {
    // A job ends at once when its workers failed on every host it may use (no cool-down
    // to wait for): the last of those failures says why.
    t.rec.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::string failed = t.last_failure.empty() ? "" : "; its workers failed (last: " + t.last_failure + ")";
    end_trial(t, "failed", "its job " + describe_status(status) + failed + " (see " +
                               (exp_->trial_dir(t.rec.id) / "output.log").string() + ")");
  }
  if (interrupted_) {
    bool any = std::any_of(trials_.begin(), trials_.end(), [](const Trial& x) { return x.job != nullptr; });
    if (!any) io_.stop();
    return;
  }
  schedule();
}

void Sweep::end_trial(Trial& t, const std::string& state, const std::string& why) {
  t.rec.state = state;
  t.rec.why = why;
  scheduler_->on_trial_finished(t.rec.id);
  exp_->save_scheduler(scheduler_->state());
  save(t);
  events_.emit("trial_ended", {{"trial", t.rec.id}, {"state", state}, {"why", why}, {"step", t.rec.last_step},
                               {"best", t.rec.best_metric ? nlohmann::json(*t.rec.best_metric) : nlohmann::json()}});
  say(fmt::format("trial {} {}{}{}{}", t.rec.id, state,
                  t.rec.last_step >= 0 ? fmt::format(" at step {:g}", t.rec.last_step) : "",
                  t.rec.best_metric ? fmt::format(", best {} {:.6g}", metric_, *t.rec.best_metric) : "",
                  state == "failed" ? ": " + why : ""));
}

// Slot-seconds, busy and available, overall and while some trial waits for slots.
void Sweep::account_usage() {
  bool waiting = std::any_of(trials_.begin(), trials_.end(), [](const Trial& t) { return t.rec.state == "pending"; });
  usage_.record(std::chrono::duration<double>(Clock::now() - start_).count(), pool_->busy_slots(), pool_->total_slots(),
                waiting);
}

void Sweep::save(const Trial& t) {
  exp_->save_trial(t.rec);
}

// The first signal stops every trial's job (each stops its workers) and waits for them;
// a second one does not wait: the jobs are killed at once (their workers die with their
// daemons).
void Sweep::interrupt(int sig) {
  signals_.async_wait([this](boost::system::error_code e, int again) {
    if (!e) interrupt(again);
  });
  if (interrupted_) {
    say("second signal: killing every trial's job now");
    io_.stop();
    return;
  }
  interrupted_ = sig;
  say(fmt::format("interrupted by {}; stopping every trial (continue with --resume)", sig == SIGINT ? "SIGINT" : "SIGTERM"));
  bool any = false;
  for (auto& t : trials_)
    if (t.job) t.job->terminate(), any = true;
  if (!any) io_.stop();
}

int Sweep::run() {
  tty_ = ::isatty(STDOUT_FILENO) != 0;
  std::error_code ec;
  self_ = fs::read_symlink("/proc/self/exe", ec).string();
  if (auto ok = prepare(); !ok) {
    fmt::print(stderr, "elasticrun sweep: {}\n", ok.error());
    return cmd::exit_code::kUsage;
  }
  if (!events_.open(o_.events_file)) {
    fmt::print(stderr, "elasticrun sweep: cannot open --events {}\n", o_.events_file);
    return cmd::exit_code::kUsage;
  }
  events_.emit("sweep_started", {{"trials", trials_.size()}, {"resume", o_.resume}, {"dir", o_.dir}});
  pool_ = std::make_unique<Pool>();
  signals_.async_wait([this](boost::system::error_code e, int sig) {
    if (!e) interrupt(sig);
  });
  // Utilisation: busy slot-seconds over available slot-seconds, while trials wait.
  std::function<void()> account = [&] {
    tick_.expires_after(1s);
    tick_.async_wait([&](boost::system::error_code e) {
      if (e) return;
      account_usage();
      render();
      account();
    });
  };
  account();
  if (o_.discovery_script.empty()) {
    set_pool(o_.hosts);
    asio::post(io_, [this] { schedule(); });
  } else {
    discovery::ScriptOptions so;
    so.path = o_.discovery_script;
    so.default_slots = o_.slots_per_host;
    discovery::HostWatcher::Callbacks cb;
    cb.on_change = [this](const std::vector<discovery::Host>& hosts) {
      set_pool(hosts);
      schedule();
    };
    cb.on_error = [](const std::string& why) { ER_LOG(driver, warn, "pool discovery: {}", why); };
    cb.on_fatal = [this](const std::string& why) {
      fmt::print(stderr, "elasticrun sweep: pool discovery failed: {}\n", why);
      exit_code_ = cmd::exit_code::kLaunchFailed;
      interrupt(SIGTERM);
    };
    watcher_ = std::make_unique<discovery::HostWatcher>(io_, discovery::make_script_source(io_, so),
                                                        o_.discovery_interval, cb);
    watcher_->start();
  }
  io_.run();
  if (watcher_) watcher_->stop();
  // Stopped by a signal: the trials' exits were awaited; whatever still runs is killed
  // with its TrialJob.
  for (auto& t : trials_) t.job.reset();
  summary();
  if (interrupted_) return exit_code_ > 0 ? exit_code_ : 128 + interrupted_;
  bool any_ok = std::any_of(trials_.begin(), trials_.end(),
                            [](const Trial& t) { return t.rec.state == "finished" || t.rec.state == "stopped"; });
  return any_ok ? 0 : cmd::exit_code::kWorkerFailed;
}

int run_sweep(SweepOptions options) {
  asio::io_context io;
  Sweep s(io, std::move(options));
  return s.run();
}

int sweep_main(int argc, const char* const* argv) {
  auto parsed = parse_sweep_options(argc, argv);
  if (!parsed) {
    fmt::print(stderr, "elasticrun sweep: {}\nTry 'elasticrun sweep --help' for more information.\n", parsed.error());
    return cmd::exit_code::kUsage;
  }
  if (!parsed->options) {
    fmt::print("{}", parsed->print);
    return 0;
  }
  if (!parsed->options->log_level.empty() && !log::configure(parsed->options->log_level)) {
    fmt::print(stderr, "elasticrun sweep: bad --log-level '{}'\n", parsed->options->log_level);
    return cmd::exit_code::kUsage;
  }
  return run_sweep(std::move(*parsed->options));
}

}  // namespace elasticrun::sweep
