// The sweep driver's own declarations, shared by its three files: sweep.cc (the event
// loop: trials started, reports answered, exits handled, signals), sweep_setup.cc (the
// experiment created or resumed, the trials' ranking, the pool following its hosts) and
// sweep_view.cc (the lines, the live table, the summary). Not for anyone else: the
// sweep's interface is sweep.h.
#pragma once

#include "cmd/events.h"
#include "cmd/sweep/experiment.h"
#include "cmd/sweep/pool.h"
#include "cmd/sweep/scheduler.h"
#include "cmd/sweep/space.h"
#include "cmd/sweep/sweep_options.h"
#include "cmd/sweep/trial_job.h"
#include "discovery/host_source.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include <csignal>
#include <nlohmann/json.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace elasticrun::sweep {

using Clock = std::chrono::steady_clock;

// A configuration on one line: "lr=0.1 batch=32".
std::string compact(const nlohmann::json& config);

class Sweep {
 public:
  Sweep(boost::asio::io_context& io, SweepOptions o) : io_(io), o_(std::move(o)), signals_(io, SIGINT, SIGTERM), tick_(io) {}
  int run();

 private:
  struct Trial {
    TrialRecord rec;
    std::unique_ptr<TrialJob> job;
    int workers = 0;             // in its latest epoch
    std::string share;           // its share of the pool its job was last sent
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
  std::string share_of(const Trial& t) const;
  void send_share(Trial& t);
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

  boost::asio::io_context& io_;
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
  boost::asio::signal_set signals_;
  boost::asio::steady_timer tick_;
  bool tty_ = false;
  int table_lines_ = 0;
  int exit_code_ = -1;
  int interrupted_ = 0;
  Clock::time_point start_ = Clock::now();
  UsageMeter usage_;
  std::string self_;
};

}  // namespace elasticrun::sweep
