// The job controller: owns the rendezvous server, the host watcher (elastic mode), and
// one DaemonLink per host, and turns their events into epochs and the job's outcome.
//
// Everything runs on one io_context thread; nothing here blocks. Every phase has a
// deadline (join, re-join, elastic wait, stop grace), so the driver always ends.
//
//   job.cc     life cycle: start, daemons, worker events, finishing
//   epochs.cc  elastic membership: failures, host changes, new epochs, timeouts
#pragma once

#include "cmd/daemon_link.h"
#include "cmd/events.h"
#include "cmd/options.h"
#include "cmd/output.h"
#include "common/auth.h"
#include "discovery/host_source.h"
#include "rendezvous/membership.h"
#include "rendezvous/server.h"

#include <boost/asio.hpp>

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
  using Place = rendezvous::Place;
  struct Worker {
    int rank = -1;  // in the current epoch
    int pid = 0;
    std::uint64_t joined_epoch = 0;
    // Until when the driver waits for it to join, from the epoch the wait began in, with
    // that wait's limit (--start-timeout until it first joined, then
    // --rendezvous-timeout). Kept across epochs it misses, so that epochs abandoned faster
    // than the limit cannot keep a silent worker in.
    std::chrono::steady_clock::time_point join_deadline{};
    std::uint64_t awaited_from_epoch = 0;
    std::chrono::milliseconds join_limit{0};
    // Which process this is: the epoch it was started in (its ELASTICRUN_EPOCH). A place
    // removed and listed again has a new worker while the old one may still be stopping.
    std::uint64_t started_epoch = 0;
    bool spawn_pending = false;  // waits for the place's previous worker to exit
    bool exited = false;         // its exit was reported
    bool exited_ok = false;      // finished with status 0
  };

  // job.cc
  Result<void> start();
  Result<std::string> daemon_path() const;
  DaemonEvents daemon_events();
  DaemonLink* ensure_daemon(const std::string& host);
  void spawn(const rendezvous::WorkerPlace& w);
  void send_spawn(DaemonLink& d, const Place& p, const Worker& w);
  void spawn_deferred(const Place& p);
  bool retire(const Place& p, int sig);
  void signal_worker(const Place& p, int sig);
  void on_started(const std::string& host, const msg::Started& s);
  void on_exited(const std::string& host, const msg::Exited& e);
  void on_daemon_closed(const std::string& host, bool clean, const std::string& why);
  void on_joined(const rendezvous::WorkerPlace& p, std::uint64_t epoch);
  void finish(int code, const std::string& message);
  void maybe_done();
  void heartbeat();
  std::chrono::milliseconds heartbeat_interval() const;
  Worker* worker(const std::string& host, std::uint32_t slot);
  Worker* worker(const rendezvous::WorkerPlace& p);
  Worker* process_at(const std::string& host, std::uint32_t slot);
  std::string describe(const Place& p) const;

  // epochs.cc
  void start_watcher();
  void on_hosts(const std::vector<discovery::Host>& hosts);
  void on_worker_failed(const Place& p, const std::string& why);
  void on_epoch_abandoned(const Place& p, std::uint64_t epoch);
  void reconcile();
  void begin_epoch(rendezvous::Plan plan, msg::NotifyKind kind, const std::string& reason);
  void remove_worker(const Place& p);
  void arm_join_timer();
  std::vector<Place> not_joined() const;
  void on_join_timeout(std::uint64_t epoch);
  void wait_for_slots();
  std::set<Place> alive() const;
  bool all_finished() const;

  Options opts_;
  boost::asio::io_context io_;
  auth::Secret secret_;
  std::optional<auth::Secret> cluster_secret_;  // with --daemon-port
  std::string daemon_path_, rendezvous_addr_, cwd_;
  std::unique_ptr<rendezvous::Server> server_;
  rendezvous::Membership membership_;
  std::unique_ptr<discovery::HostWatcher> watcher_;
  rendezvous::Assignment assignment_;  // epoch 0: none yet
  std::map<std::string, std::unique_ptr<DaemonLink>> daemons_;
  // The worker each place has now (in the current epoch, or about to leave it), and
  // the workers stopped (removed or failed) whose exit the daemon has not reported yet.
  // A place's next worker starts only once its retired one exited: at most one process
  // per place, so that the daemon's reports and kills by slot name one process, and two
  // never share a slot's device or shared-memory directory.
  std::map<Place, Worker> workers_, retired_;
  OutputRouter output_;
  EventLog events_;
  boost::asio::signal_set signals_;
  boost::asio::steady_timer join_timer_, elastic_timer_, stop_timer_, cooldown_timer_, abandon_timer_,
      heartbeat_timer_;
  std::chrono::steady_clock::time_point last_tick_{}, last_beat_{};  // of the heartbeat timer
  bool abandon_pending_ = false;
  bool waiting_for_slots_ = false;
  bool epoch_broken_ = false;  // a failure happened since the current epoch started
  std::string broken_reason_;
  int resets_ = 0;
  int exit_code_ = -1;
};

}  // namespace elasticrun::cmd
