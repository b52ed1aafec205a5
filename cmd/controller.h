// The epoch controller: every decision of an elastic job, without I/O.
//
// Events come in (hosts discovered, a worker started, joined, exited or was lost, a
// daemon closed, an epoch abandoned, time passed); commands go out, queued in order
// (spawn a worker, signal one, start or abort an epoch, finish the job, tell the user,
// log an event). The controller owns the membership, the assignment, the worker table
// and every deadline of the protocol (joining, the elastic wait, blacklist cool-downs,
// abandoned epochs, SIGTERM-then-SIGKILL). It never reads a clock: each event carries
// its time, and the caller calls tick() at next_deadline(). So the timing rules are
// unit-tested with a fake clock (tests/cmd/controller_test.cc).
//
// Job wires it to the daemons, the rendezvous server and discovery: it feeds events
// and carries out take()'s commands. A command may cause another event (starting a
// daemon can fail at once); the controller is never re-entered, because commands run
// only after the event that queued them has returned.
//
// Every epoch that starts workers first has rank 0's daemon reserve a port there (the
// epoch's MASTER_PORT, torchrun's variable): its spawns wait for the answer.
//
// Restart mode (--max-restarts N, ControllerConfig::max_restarts) is for programs that
// keep no state with libelasticrun, torchrun's scripts: a failure or a change of hosts
// stops every worker and starts a new generation (an epoch of new workers, new ranks, a
// new port); failures count against N, changes of hosts do not.
//
//   controller.cc           workers: started, joined, exited, lost; daemons; finishing
//   controller_epochs.cc    membership: failures, host changes, epochs, deadlines
//   controller_torchrun.cc  torchrun's programs: the epoch's port, error files, restart mode
#pragma once

#include "cmd/torch_env.h"
#include "common/messages.h"
#include "discovery/hosts.h"
#include "rendezvous/assignment.h"
#include "rendezvous/membership.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace elasticrun::cmd {

struct Options;

using TimePoint = std::chrono::steady_clock::time_point;
using Place = rendezvous::Place;  // (host, slot); slot -1: the whole host

struct ControllerConfig {
  bool elastic = false;
  int np = 1, min_np = 1, max_np = 0;  // min_np and max_np: elastic mode only
  std::chrono::milliseconds start_timeout{60000}, rendezvous_timeout{60000}, elastic_timeout{600000};
  int reset_limit = 0;  // 0: unlimited
  std::optional<std::pair<std::chrono::milliseconds, std::chrono::milliseconds>> cooldown;
  // How long a worker's report that it gave up on the epoch waits for a failure that
  // explains it before the epoch is replaced anyway.
  std::chrono::milliseconds abandon_grace{2000};
  // SIGTERM to SIGKILL, for a worker taken out of the job.
  std::chrono::milliseconds stop_grace{2000};
  // --checkpoint-dir: when every worker holding the job's state is gone, an epoch of new
  // workers restores from the newest durable checkpoint instead of the job failing.
  bool durable = false;
  // --max-restarts: restart mode, with this many restarts after failures.
  std::optional<int> max_restarts;
  // Restart mode: rank 0's daemon may host torch's store (ReservePort::host_store). Not
  // when -x sets where the workers find it or who hosts it (MASTER_ADDR, MASTER_PORT,
  // TORCHELASTIC_USE_AGENT_STORE): they would not use ours, or not agree on it.
  bool agent_store = true;

  static ControllerConfig of(const Options& o);
};

// Commands, carried out by the caller in the order queued.
namespace command {
struct Spawn {  // start the place's worker (its daemon first, if need be)
  Place place;
  int rank = 0, size = 0;
  std::uint64_t started_epoch = 0;
  TorchWorker torch;  // its torchrun variables
};
// Before the epoch's workers start: rank 0's daemon (on `host`) reserves the epoch's
// MASTER_PORT; answered by port_reserved(). The daemons of `hosts`, which get workers in
// the epoch, may be started meanwhile. In restart mode the daemon is also asked to host
// torch's store on the port (host_store; msg::ReservePort).
struct ReservePort {
  std::string host;
  std::uint64_t epoch = 0;
  std::vector<std::string> hosts;
  bool host_store = false;
};
struct Signal {  // signal the process at a place, if its daemon is still there
  Place place;
  int signal = 0;
};
struct StartEpoch {
  rendezvous::Assignment assignment;
  msg::NotifyKind kind = msg::NotifyKind::abort;
  std::string reason;
};
struct AbortEpoch {  // the current epoch is broken and no next one can start yet
  std::string reason;
};
struct CloseOutput {  // the process at `place` ended: flush what it wrote
  Place place;
};
struct Say {  // one line for the user, on stderr
  std::string text;
};
struct Emit {  // one line of the --events log
  std::string event;
  nlohmann::json fields;
};
struct Finish {  // the job is over: stop everything
  int code = 0;
  std::string message;
};
}  // namespace command

using Command = std::variant<command::Spawn, command::ReservePort, command::Signal, command::StartEpoch,
                             command::AbortEpoch, command::CloseOutput, command::Say, command::Emit, command::Finish>;

// How a daemon's connection ended.
enum class DaemonEnd { clean, lost, not_started };

class EpochController {
 public:
  explicit EpochController(ControllerConfig cfg);

  // A fixed host list (-H, --hostfile): the job's hosts from the start, no host events.
  void use_hosts(std::vector<discovery::Host> hosts, TimePoint now);
  // The discovery script's latest host list.
  void hosts_changed(const std::vector<discovery::Host>& hosts, TimePoint now);

  void worker_started(const std::string& host, std::uint32_t slot, int pid);
  // From the rendezvous server; `p.started_epoch` says which process it is.
  void worker_joined(const rendezvous::WorkerPlace& p, std::uint64_t epoch);
  // Its elastic state finished a sync in `epoch`, at `commits` commits: it holds the job's
  // state from now on (the holder rule, below).
  void worker_synced(const rendezvous::WorkerPlace& p, std::uint64_t epoch, std::uint64_t commits);
  void worker_lost(const rendezvous::WorkerPlace& p, TimePoint now);  // its connection closed
  // It sent nothing, not even a heartbeat, for `silent` (>= --worker-timeout): the server
  // closed its connection. Failed like a worker that died: the process is killed.
  void worker_silent(const rendezvous::WorkerPlace& p, std::chrono::milliseconds silent, TimePoint now);
  void epoch_abandoned(const rendezvous::WorkerPlace& p, std::uint64_t epoch, TimePoint now);
  // From the daemons.
  void worker_exited(const std::string& host, const msg::Exited& e, TimePoint now);
  void spawn_failed(const std::string& host, std::uint32_t slot, const std::string& why, TimePoint now);
  // Rank 0's daemon reserved `port` for `epoch` (0: it could not, for `error`).
  // `store`: torch's store listens on the port, hosted by the daemon (its workers then
  // get TORCHELASTIC_USE_AGENT_STORE=True).
  void port_reserved(const std::string& host, std::uint64_t epoch, int port, const std::string& error,
                     bool store = false);
  void daemon_closed(const std::string& host, DaemonEnd end, const std::string& why, TimePoint now);
  // From anywhere (a signal, a launch failure): the job ends with `code`.
  void finish(int code, const std::string& message);
  // Acts on every deadline that has passed by `now`.
  void tick(TimePoint now);

  // When tick() has something to do next; nullopt: nothing is due.
  std::optional<TimePoint> next_deadline(TimePoint now) const;
  // The next command to carry out, in order.
  std::optional<Command> take();

  bool finished() const { return exit_code_ >= 0; }
  int exit_code() const { return exit_code_; }
  int resets() const { return resets_; }
  int restarts() const { return restarts_; }  // restart mode: restarts after failures
  const rendezvous::Assignment& assignment() const { return assignment_; }
  // The hosts discovery offers, with their blacklist (for --request-hosts-script).
  const rendezvous::Membership& membership() const { return membership_; }
  // A worker finished its training: the job is ending.
  bool finishing() const { return finishing_; }
  // A worker's elastic State reported a sync: the program keeps a committed state (one
  // that a last checkpoint can save).
  bool keeps_state() const { return syncs_reported_; }
  // The rank of the process running at the place (a stopping one before its
  // successor), for routing its output.
  std::optional<int> rank_at(const std::string& host, std::uint32_t slot) const;

 private:
  struct Worker {
    int rank = -1;  // in the current epoch
    int local_rank = -1;
    int pid = 0;
    std::uint64_t joined_epoch = 0;
    // Until when the driver waits for it to join, from the epoch the wait began in, with
    // that wait's limit (--start-timeout until it first joined, then
    // --rendezvous-timeout). Kept across epochs it misses, so that epochs abandoned faster
    // than the limit cannot keep a silent worker in.
    TimePoint join_deadline{};
    std::uint64_t awaited_from_epoch = 0;
    std::chrono::milliseconds join_limit{0};
    // Which process this is: the epoch it was started in (its ELASTICRUN_EPOCH). A place
    // removed and listed again has a new worker while the old one may still be stopping.
    std::uint64_t started_epoch = 0;
    bool spawn_pending = false;  // waits for the place's previous worker to exit
    bool held = false;           // waits for the epoch's port
    bool failed = false;         // retired for its own failure: its error file tells why
    bool exited = false;         // its exit was reported
    bool exited_ok = false;      // finished with status 0
    bool formed = false;         // was a member of an epoch that formed (every member joined)
    bool synced = false;         // its library reported a completed sync of the elastic state
    std::optional<TimePoint> kill_at;  // retired with SIGTERM: SIGKILL then
  };
  // Why a worker (or a whole host) is failed. The kind decides what happens; the text
  // is for people.
  struct Failure {
    enum class Kind { exited, connection_lost, join_timeout, daemon_lost, worker_timeout, spawn_failed } kind;
    std::string text;
  };

  // controller.cc
  void spawn(const rendezvous::WorkerPlace& w);
  void launch(const Place& p, Worker& w);
  bool retire(const Place& p, int sig, std::optional<TimePoint> kill_at = std::nullopt);
  Worker* worker(const Place& p);
  Worker* worker(const rendezvous::WorkerPlace& p);
  const Worker* process_at(const Place& p) const;
  std::string describe(const Place& p) const;
  void emit(std::string event, nlohmann::json fields);
  void say(std::string text);
  void end(int code, const std::string& message);

  // controller_epochs.cc
  void worker_failed(const Place& p, const Failure& why, TimePoint now);
  void blacklist(const std::string& host, const Failure& why, TimePoint now);
  void reconcile(TimePoint now);
  bool cannot_complete() const;
  void finish_with_survivors(TimePoint now);
  void begin_epoch(rendezvous::Plan plan, msg::NotifyKind kind, const std::string& reason, TimePoint now);
  void remove_worker(const Place& p, TimePoint now);
  std::vector<Place> not_joined() const;
  void join_timeout(TimePoint now);
  void wait_for_slots(TimePoint now);
  std::string beyond_recovery(TimePoint now) const;
  void slots_back(TimePoint now);
  std::set<Place> alive() const;
  bool all_finished() const;
  bool joins_awaited() const;

  // controller_torchrun.cc
  void restart_after(const Place& p, const Failure& why, TimePoint now);
  void reconcile_generation(TimePoint now);
  void stop_generation(TimePoint now);
  void reserve_port(const rendezvous::Plan& plan);
  void report_error(const std::string& host, const Worker& w, const msg::Exited& e);

  ControllerConfig cfg_;
  rendezvous::Membership membership_;
  rendezvous::Assignment assignment_;  // epoch 0: none yet
  // The worker each place has now (in the current epoch, or about to leave it), and
  // the workers stopped (removed or failed) whose exit the daemon has not reported yet.
  // A place's next worker starts only once its retired one exited: at most one process
  // per place, so that the daemon's reports and kills by slot name one process, and two
  // never share a slot's device or shared-memory directory.
  std::map<Place, Worker> workers_, retired_;
  // Hosts whose daemon closed: their workers have no process any more. A spawn there
  // starts a new daemon.
  std::set<std::string> daemon_gone_;
  std::deque<Command> out_;
  std::optional<TimePoint> elastic_deadline_;  // waiting for --min-np slots until then
  std::optional<TimePoint> cooldown_end_;  // the next end of a blacklisted host's cool-down
  std::optional<TimePoint> abandon_deadline_;
  std::string abandoned_by_;
  std::uint64_t abandoned_epoch_ = 0;
  bool epoch_broken_ = false;  // a failure happened since the current epoch started
  std::uint64_t aborted_epoch_ = 0;  // the last epoch AbortEpoch interrupted
  // A worker finished its training (exit 0): the job is ending, and starts no worker.
  bool finishing_ = false;
  // An epoch formed: the job has state, which a new epoch must take from a worker that
  // holds it (or, with --checkpoint-dir, from the newest checkpoint).
  bool state_formed_ = false;
  // The holder rule: which workers hold the job's committed state, so that one of them is
  // rank 0 of the next epoch, whose sync gives it to the others. A worker holds it once
  // its library reported a completed sync (worker_synced), not when it joined: one that
  // joined a grown epoch and lost its rank 0 before the sync reached it holds only its
  // initial state, and as rank 0 it would send that to everyone, losing every commit.
  // Until the first report of the job (a program that keeps no elastic State, or before
  // its first sync ended, when nothing was committed yet) the members of an epoch that
  // formed count, as they always have.
  bool syncs_reported_ = false;
  // The hosts came from -H or --hostfile (use_hosts): the list never changes.
  bool fixed_hosts_ = false;
  std::map<std::string, std::string> ban_reasons_;  // why each blacklisted host was
  bool holds_state(const Worker& w) const { return syncs_reported_ ? w.synced : w.formed; }
  std::string broken_reason_;
  // The port reserved for epoch port_epoch_ on its rank 0's host; spawns of an epoch
  // wait for its port (Worker::held).
  std::uint64_t port_epoch_ = 0;
  int master_port_ = 0;
  bool agent_store_ = false;  // the daemon hosts torch's store on master_port_
  // A worker joined the rendezvous: the program uses libelasticrun, so a worker that does
  // not join is late. Until then (a torchrun script) nobody is waited for, except in an
  // elastic job that recovers in process, which needs the library.
  bool joined_any_ = false;
  std::set<std::string> started_on_;  // hosts where a worker of this job has started
  int resets_ = 0;
  int restarts_ = 0;
  int exit_code_ = -1;
};

}  // namespace elasticrun::cmd
