#include "cmd/sweep/sweep.h"

#include "cmd/events.h"
#include "cmd/exit_codes.h"
#include "cmd/sweep/experiment.h"
#include "cmd/sweep/pool.h"
#include "cmd/sweep/scheduler.h"
#include "cmd/sweep/space.h"
#include "cmd/sweep/trial_job.h"
#include "common/log.h"
#include "discovery/host_source.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace elasticrun::sweep {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw SpaceError(fmt::format("cannot read the space file {}", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// 'it''s' for a /bin/sh script.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string compact(const nlohmann::json& config) {
  std::string out;
  for (const auto& [k, v] : config.items()) {
    if (!out.empty()) out += " ";
    std::string val = v.is_number_float() ? fmt::format("{:.4g}", v.get<double>()) : v.dump();
    out += k + "=" + val;
  }
  return out;
}

// How many times a trial starts again after its job ended with a failed host.
constexpr int kHostLossRestarts = 3;

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  return fmt::format("exited with code {}", WEXITSTATUS(status));
}

class Sweep {
 public:
  Sweep(asio::io_context& io, SweepOptions o) : io_(io), o_(std::move(o)), signals_(io, SIGINT, SIGTERM), tick_(io) {}
  int run();

 private:
  struct Trial {
    TrialRecord rec;
    std::unique_ptr<TrialJob> job;
    int workers = 0;             // in its latest epoch
    bool stopping = false;       // the scheduler stopped it: exit 0 means "stopped"
    bool completed = false;      // ... because it used its whole budget: "finished"
    std::string stop_reason;
    std::string last_failure;  // the latest host its job blacklisted, and why
    std::string fail_reason;   // the sweep ended its job: it is failed for this
    bool lost_host = false;    // a host of its share failed under it
    std::optional<Decision> exploit;  // pbt: continue from another trial once it stopped
    Clock::time_point started{};
  };

  Result<void> prepare();
  void schedule();
  void set_pool(const std::vector<discovery::Host>& hosts);
  void start(Trial& t);
  void write_share(Trial& t);
  void on_report(Trial& t, const nlohmann::json& r);
  void on_event(Trial& t, const nlohmann::json& ev);
  void on_exit(Trial& t, int status);
  void end_trial(Trial& t, const std::string& state, const std::string& why);
  void interrupt(int sig);
  void save(const Trial& t);
  void say(const std::string& line);
  void render();
  void account_usage();
  void summary();
  std::vector<std::string> ranking() const;
  bool better(double a, double b) const { return maximize_ ? a > b : a < b; }
  Trial* find(const std::string& id);

  asio::io_context& io_;
  SweepOptions o_;
  std::optional<Experiment> exp_;
  Space space_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Pool> pool_;
  std::unique_ptr<discovery::HostWatcher> watcher_;
  std::vector<Trial> trials_;
  std::string metric_;
  bool maximize_ = false;
  int min_np_ = 1, max_np_ = 1;
  std::vector<std::string> command_;
  cmd::EventLog events_;
  asio::signal_set signals_;
  asio::steady_timer tick_;
  bool tty_ = false;
  int table_lines_ = 0;
  int exit_code_ = -1;
  int interrupted_ = 0;
  Clock::time_point start_ = Clock::now();
  UsageMeter usage_;
  std::string self_;
};

Sweep::Trial* Sweep::find(const std::string& id) {
  for (auto& t : trials_)
    if (t.rec.id == id) return &t;
  return nullptr;
}

// Reads or creates the experiment, its trials and the scheduler.
Result<void> Sweep::prepare() {
  nlohmann::json spec;
  if (o_.resume) {
    auto x = Experiment::open(o_.dir);
    if (!x) return Failure{x.error()};
    exp_.emplace(std::move(*x));
    spec = exp_->spec();
  } else {
    std::string text;
    try {
      text = read_text(o_.space_file);
      space_ = parse_space(text);
    } catch (const SpaceError& e) {
      return fail(fmt::format("{}: {}", o_.space_file, e.what()));
    }
    spec = {{"space", nlohmann::json::parse(text)}, {"seed", o_.seed}, {"scheduler", o_.scheduler},
            {"scheduler_params", o_.scheduler_params}, {"metric", o_.metric}, {"mode", o_.maximize ? "max" : "min"},
            {"num_samples", o_.num_samples}, {"trial_np", {o_.trial_min_np, o_.trial_max_np}},
            {"command", o_.command}};
    // Checked before anything is written: a bad scheduler parameter leaves no experiment.
    try {
      make_scheduler(o_.scheduler, o_.scheduler_params, space_, o_.maximize ? Mode::max : Mode::min, o_.seed);
    } catch (const std::exception& e) {
      return fail(fmt::format("--scheduler {}: {}", o_.scheduler, e.what()));
    }
    auto x = Experiment::create(o_.dir, spec);
    if (!x) return Failure{x.error()};
    exp_.emplace(std::move(*x));
  }
  try {
    space_ = parse_space(spec.at("space").dump());
    metric_ = spec.at("metric").get<std::string>();
    maximize_ = spec.at("mode").get<std::string>() == "max";
    min_np_ = spec.at("trial_np")[0].get<int>();
    max_np_ = spec.at("trial_np")[1].get<int>();
    command_ = spec.at("command").get<std::vector<std::string>>();
    scheduler_ = make_scheduler(spec.at("scheduler").get<std::string>(), spec.at("scheduler_params"), space_,
                                maximize_ ? Mode::max : Mode::min, spec.at("seed").get<std::uint64_t>());
  } catch (const std::exception& e) {
    return fail(fmt::format("{}/sweep.json: {}", o_.dir, e.what()));
  }
  if (o_.resume) {
    for (auto& r : exp_->trials()) {
      Trial t;
      t.rec = r;
      // A trial that was running when the sweep was killed continues from its checkpoint.
      if (t.rec.state == "running") t.rec.state = "pending", ++t.rec.restarts;
      trials_.push_back(std::move(t));
    }
    if (auto st = exp_->scheduler_state()) {
      try {
        scheduler_->restore(*st);
      } catch (const std::exception& e) {
        return fail(fmt::format("{}/scheduler.json: {}", o_.dir, e.what()));
      }
    } else {
      for (auto& t : trials_) scheduler_->on_trial_added(t.rec.id, t.rec.config);
    }
  } else {
    auto configs = sample(space_, o_.num_samples, o_.seed);
    int width = std::max<int>(4, static_cast<int>(std::to_string(configs.size()).size()));
    for (std::size_t i = 0; i < configs.size(); ++i) {
      Trial t;
      t.rec.id = fmt::format("{:0{}}", i, width);
      t.rec.config = configs[i];
      if (auto ok = exp_->add_trial(t.rec); !ok) return ok;
      scheduler_->on_trial_added(t.rec.id, t.rec.config);
      trials_.push_back(std::move(t));
    }
    if (auto ok = exp_->save_scheduler(scheduler_->state()); !ok) return ok;
  }
  return {};
}

// Trials by their best metric so far, best first; trials without one last.
std::vector<std::string> Sweep::ranking() const {
  std::vector<const Trial*> v;
  for (const auto& t : trials_) v.push_back(&t);
  std::stable_sort(v.begin(), v.end(), [&](const Trial* a, const Trial* b) {
    if (a->rec.best_metric.has_value() != b->rec.best_metric.has_value()) return a->rec.best_metric.has_value();
    return a->rec.best_metric && better(*a->rec.best_metric, *b->rec.best_metric);
  });
  std::vector<std::string> out;
  for (const auto* t : v) out.push_back(t->rec.id);
  return out;
}

// The pool follows the host list; a trial that loses slots shrinks (its elastic job
// follows its new discovery output), one below its MIN waits in its job for slots.
void Sweep::set_pool(const std::vector<discovery::Host>& hosts) {
  std::set<std::string> listed;
  for (const auto& h : hosts) {
    listed.insert(h.name);
    pool_->set_host(h.name, h.slots);
  }
  for (const auto& h : pool_->hosts())
    if (!listed.count(h)) pool_->remove_host(h);
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
    if (t.job) write_share(t);
  account_usage();
  bool all_done = std::all_of(trials_.begin(), trials_.end(), [](const Trial& t) { return t.rec.done(); });
  if (all_done) {
    exit_code_ = 0;
    io_.stop();
  }
}

// The trial's discovery script prints its share of the pool.
void Sweep::write_share(Trial& t) {
  std::string text;
  for (const auto& h : pool_->share(t.rec.id)) text += fmt::format("{}:{}\n", h.host, h.slots);
  fs::path file = exp_->trial_dir(t.rec.id) / "hosts";
  std::ifstream in(file);
  std::stringstream old;
  old << in.rdbuf();
  if (old.str() == text && in) return;
  if (auto ok = write_file_atomically(file, text); !ok) ER_LOG(driver, error, "{}", ok.error());
  if (!old.str().empty())
    events_.emit("trial_resized", {{"trial", t.rec.id}, {"slots", pool_->size(t.rec.id)}});
}

void Sweep::start(Trial& t) {
  fs::path dir = exp_->trial_dir(t.rec.id);
  std::error_code ec;
  fs::create_directories(exp_->checkpoint_dir(t.rec.id), ec);
  write_share(t);
  fs::path script = dir / "hosts.sh";
  if (auto ok = write_file_atomically(script, "#!/bin/sh\nexec cat " + shell_quote((dir / "hosts").string()) + "\n"); !ok)
    return end_trial(t, "failed", ok.error());
  fs::permissions(script, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read, ec);
  TrialLaunch l;
  l.program = self_;
  l.dir = dir;
  l.args = {"--min-np", std::to_string(min_np_), "--max-np", std::to_string(max_np_),
            "--host-discovery-script", script.string(), "--discovery-interval", "0.25"};
  l.args.insert(l.args.end(), o_.trial_args.begin(), o_.trial_args.end());
  if (!o_.log_level.empty()) l.args.insert(l.args.end(), {"--log-level", o_.log_level});
  std::vector<std::string> env = {"ELASTICRUN_TRIAL_CONFIG=" + t.rec.config.dump(), "ELASTICRUN_TRIAL_ID=" + t.rec.id,
                                  "ELASTICRUN_TRIAL_DIR=" + fs::absolute(exp_->checkpoint_dir(t.rec.id)).string()};
  env.insert(env.end(), o_.env.begin(), o_.env.end());
  for (const auto& e : env) l.args.insert(l.args.end(), {"-x", e});
  l.args.push_back("--");
  l.args.insert(l.args.end(), command_.begin(), command_.end());
  for (char** e = environ; *e; ++e) l.env.emplace_back(*e);
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
    (void)exp_->append_result(t.rec.id, line);
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
    t.completed = d.completed;
    t.stop_reason = d.reason;
    if (d.action == Decision::Action::exploit) t.exploit = d;
  }
  t.job->answer(static_cast<std::int64_t>(step), t.stopping);
  (void)exp_->append_result(t.rec.id, line);
  (void)exp_->save_scheduler(scheduler_->state());
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
    (void)write_file_atomically(exp_->trial_dir(t.rec.id) / "params.json", t.rec.config.dump(2) + "\n", true);
    ++t.rec.restarts;
    t.rec.state = "pending";
    save(t);
  } else if (ok) {
    bool cut = t.stopping && !t.completed;
    end_trial(t, cut ? "stopped" : "finished", cut ? "stopped by the scheduler: " + t.stop_reason : "");
  } else {
    t.rec.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    end_trial(t, "failed", "its job " + describe_status(status) + " (see " +
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
  (void)exp_->save_scheduler(scheduler_->state());
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
  if (auto ok = exp_->save_trial(t.rec); !ok) ER_LOG(driver, error, "{}", ok.error());
}

// Plain lines when the output is not a terminal; on one, the table is redrawn below them.
void Sweep::say(const std::string& line) {
  if (tty_ && table_lines_ > 0) fmt::print("\x1b[{}A\x1b[J", table_lines_), table_lines_ = 0;
  fmt::print("{}\n", line);
  std::fflush(stdout);
  if (tty_) render();
}

void Sweep::render() {
  if (!tty_) return;
  std::string out;
  if (table_lines_ > 0) out += fmt::format("\x1b[{}A\x1b[J", table_lines_);
  std::optional<double> best;
  for (const auto& t : trials_)
    if (t.rec.best_metric && (!best || better(*t.rec.best_metric, *best))) best = t.rec.best_metric;
  int lines = 0;
  out += fmt::format("{:<6} {:<9} {:>7} {:>8} {:>12} {:>12}  {}\n", "trial", "state", "workers", "step", metric_,
                     "best", "parameters");
  ++lines;
  for (const auto& t : trials_) {
    if (t.rec.done() && lines > 20) continue;
    out += fmt::format("{:<6} {:<9} {:>7} {:>8} {:>12} {:>12}  {}\n", t.rec.id, t.rec.state,
                       t.job ? std::to_string(t.workers) : "", t.rec.last_step >= 0 ? fmt::format("{:g}", t.rec.last_step) : "",
                       t.rec.last_metric ? fmt::format("{:.6g}", *t.rec.last_metric) : "",
                       t.rec.best_metric ? fmt::format("{:.6g}", *t.rec.best_metric) : "", compact(t.rec.config));
    ++lines;
  }
  out += fmt::format("best {} so far: {}\n", metric_, best ? fmt::format("{:.6g}", *best) : "-");
  ++lines;
  fmt::print("{}", out);
  std::fflush(stdout);
  table_lines_ = lines;
}

void Sweep::summary() {
  const Trial* best = nullptr;
  int counts[4] = {0, 0, 0, 0};
  for (const auto& t : trials_) {
    counts[0] += t.rec.state == "finished";
    counts[1] += t.rec.state == "stopped";
    counts[2] += t.rec.state == "failed";
    counts[3] += !t.rec.done();
    if (t.rec.best_metric && (!best || better(*t.rec.best_metric, *best->rec.best_metric))) best = &t;
  }
  account_usage();
  double util = usage_.utilisation_while_waiting();
  fmt::print("sweep: {} trials: {} finished, {} stopped early, {} failed{}; pool utilisation {:.0f}%\n", trials_.size(),
             counts[0], counts[1], counts[2], counts[3] ? fmt::format(", {} unfinished", counts[3]) : "", util * 100);
  if (best)
    fmt::print("best trial {}: {} = {:.6g} at step {:g}; parameters {}\n", best->rec.id, metric_,
               *best->rec.best_metric, best->rec.last_step, best->rec.config.dump());
  events_.emit("sweep_finished",
               {{"trials", trials_.size()}, {"finished", counts[0]}, {"stopped", counts[1]}, {"failed", counts[2]},
                {"unfinished", counts[3]}, {"utilisation", util},
                {"best", best ? nlohmann::json{{"trial", best->rec.id}, {"metric", *best->rec.best_metric},
                                               {"config", best->rec.config}}
                              : nlohmann::json()}});
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

}  // namespace

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
