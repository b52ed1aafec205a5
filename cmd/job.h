// The job: owns the rendezvous server, the host watcher (elastic mode), one DaemonLink
// per host and the epoch controller, and wires them together.
//
// Everything runs on one io_context thread; nothing here blocks. Every phase has a
// deadline (join, re-join, elastic wait, stop grace), so the driver always ends.
//
// The decisions (epochs, failures, deadlines) are the EpochController's (controller.h):
// Job feeds it the events of the daemons, the rendezvous server and discovery, carries
// out its commands, and wakes it at its next deadline.
//
//   job.cc           starting, daemons, heartbeats, stopping
//   job_commands.cc  feeding the controller, carrying out its commands
#pragma once

#include "cmd/controller.h"
#include "cmd/daemon_link.h"
#include "cmd/events.h"
#include "cmd/host_requests.h"
#include "cmd/options.h"
#include "cmd/output.h"
#include "cmd/report_channel.h"
#include "common/auth.h"
#include "discovery/host_lookup.h"
#include "discovery/host_source.h"
#include "rendezvous/server.h"

#include <boost/asio.hpp>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace elasticrun::cmd {

class Job {
 public:
  explicit Job(Options opts);
  ~Job();
  // Runs the job to its end; returns the process exit status.
  int run();

 private:
  // job.cc: starting, the daemons, heartbeats, stopping
  Result<void> start();
  void start_hosts();
  RequestView request_view() const;
  Result<std::string> daemon_path() const;
  DaemonEvents daemon_events();
  // Runs `then` once `host`'s name has been looked up (HostLookups: never on this
  // thread), after what was asked earlier for that host; nothing once the job is over.
  void with_host(const std::string& host, std::function<void(const discovery::HostPlace&)> then);
  DaemonLink* ensure_daemon(const std::string& host, const discovery::HostPlace& place);
  void on_daemon_closed(const std::string& host, bool clean, const std::string& why);
  void on_report(const rendezvous::WorkerPlace& p, std::uint64_t epoch, std::int64_t step,
                 const nlohmann::json& metrics, rendezvous::ReportAnswer answer);
  void on_checkpoint(const rendezvous::WorkerPlace& p, const msg::CheckpointNote& n);
  // Preemption (--preempt-grace): a SIGTERM asks the workers for a last checkpoint.
  void wait_signals();
  bool begin_preemption(int sig);
  void on_preempted(const std::string& host, const msg::Preempted& p);
  bool request_checkpoint(const std::string& why, bool fresh = false);
  void stop_everything(const std::string& message);
  void maybe_done();
  void heartbeat();
  std::chrono::milliseconds heartbeat_interval() const;

  // job_commands.cc: feeding the controller, carrying out its commands
  // An event for the controller, given the time it is delivered at.
  using Event = std::function<void(EpochController&, TimePoint now)>;
  void feed(Event event);
  void end_job(int code, std::string message);
  void carry_out(const Command& c);
  void spawn(const command::Spawn& s);
  void launch(DaemonLink& d, const command::Spawn& s, const std::string& master_addr);
  void reserve_port(const command::ReservePort& r);
  void note_omp_default(int local_workers);
  void signal_worker(const Place& p, int sig);
  void arm_controller_timer();

  Options opts_;
  boost::asio::io_context io_;
  discovery::HostLookups lookups_;  // whether a host is this machine, our address towards it
  auth::Secret secret_;
  std::optional<auth::Secret> cluster_secret_;  // with --daemon-port
  std::string daemon_path_, rendezvous_addr_, cwd_;
  std::string run_id_;  // TORCHELASTIC_RUN_ID
  bool omp_noted_ = false;
  std::unique_ptr<rendezvous::Server> server_;
  EpochController controller_;
  std::unique_ptr<discovery::HostWatcher> watcher_;
  std::unique_ptr<HostRequester> requester_;  // --request-hosts-script
  std::map<std::string, std::unique_ptr<DaemonLink>> daemons_;
  OutputRouter output_;
  EventLog events_;
  std::unique_ptr<ReportChannel> reports_;  // with --report-fd
  boost::asio::signal_set signals_;
  // controller_timer_ wakes the controller at its next deadline; stop_timer_ cuts off
  // daemons that do not stop; heartbeat_timer_ beats and watches the daemons.
  boost::asio::steady_timer controller_timer_, stop_timer_, heartbeat_timer_;
  // Preemption: the driver's own SIGTERM waits on preempt_timer_ for the checkpoint it
  // asked for (preempting_); checkpoint_asked_ is when the workers were last asked.
  boost::asio::steady_timer preempt_timer_;
  bool preempting_ = false;
  std::optional<std::chrono::steady_clock::time_point> checkpoint_asked_;
  std::chrono::steady_clock::time_point last_tick_{}, last_beat_{};  // of the heartbeat timer
  // Events that arrive while commands are being carried out (a daemon that cannot
  // start) wait their turn: the controller sees one event at a time.
  bool carrying_out_ = false;
  std::deque<Event> deferred_;
};

}  // namespace elasticrun::cmd
