// The rendezvous server: workers connect, authenticate with the job secret, join the
// current epoch, exchange addresses through a key-value table, meet at barriers, and
// keep the connection open so that the server can push notifications (abort,
// hosts-updated) and learn of a worker's end when the connection closes.
//
// It runs on the driver's io_context, single-threaded. A frame that fails to parse
// or authenticate closes that connection with a logged reason and touches nothing else.
#pragma once

#include "common/accept_loop.h"
#include "common/auth.h"
#include "common/messages.h"
#include "common/socket_options.h"
#include "rendezvous/assignment.h"
#include "rendezvous/liveness.h"
#include "rendezvous/metrics.h"
#include "rendezvous/session.h"

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

namespace elasticrun::rendezvous {

struct ServerLimits {
  std::size_t max_connections = 65536;
  std::size_t max_keys = 1 << 20;
  std::size_t max_value = 1 << 20;
  std::chrono::milliseconds handshake_timeout{10000};
  // Connections in their handshake (not yet authenticated and joined) at once: at this
  // many, the next connections are accepted but wait, in the order they came, for one of
  // those to join or be cut off at handshake_timeout; so peers that never authenticate
  // delay the workers by a handshake timeout at most, and cannot take every connection.
  std::size_t max_handshakes = 1024;
  // One worker's requests waiting on the server at once (key-value gets of keys not set
  // yet, barriers, re-joins): one more is answered an error.
  std::size_t max_waiting = 1024;
  // Bytes waiting to be written to one worker: a worker that does not read its
  // connection is cut off at this (and reported lost), not buffered without end.
  std::size_t max_send_queue = std::size_t{64} << 20;
  // The job's host timeout, for worker connections' TCP keep-alive (net::keep_alive):
  // a worker behind a cut link is failed a little after it.
  std::chrono::milliseconds keep_alive = net::kDefaultHostTimeout;
  // The longest metrics text of a report (rendezvous/metrics.h).
  std::size_t max_report = kMaxMetricsText;
  // A joined worker that sends nothing, not even the heartbeats its library sends every
  // heartbeat_interval() of this (JoinOk says how often), for this long is given up
  // (elasticrun --worker-timeout; rendezvous/liveness.h). 0: never.
  std::chrono::milliseconds worker_timeout{0};
};

// Answers one report, once; a copy answers the same report (the first call wins).
using ReportAnswer = std::function<void(msg::Decision)>;

class Server : private SessionHost {
 public:
  struct Callbacks {
    // A joined worker's connection closed without a leave message.
    std::function<void(const WorkerPlace&, std::uint64_t epoch)> on_worker_lost;
    // A joined worker sent nothing for ServerLimits::worker_timeout (`silent`: how long
    // exactly): the server closed its connection (this, not on_worker_lost, reports it).
    std::function<void(const WorkerPlace&, std::uint64_t epoch, std::chrono::milliseconds silent)>
        on_worker_silent;
    std::function<void(const WorkerPlace&, std::uint64_t epoch)> on_worker_joined;
    // A worker of the current `epoch` asked for a later one: it saw the epoch fail (a
    // collective timed out, a transport error) before anything told the driver.
    std::function<void(const WorkerPlace&, std::uint64_t epoch)> on_epoch_abandoned;
    // Rank 0 of the current `epoch` reported `step` with `metrics` (a flat JSON object of
    // finite numbers, checked). The decision goes back through `answer`, at once or
    // later from the same io_context; it may be called once, after the session closed
    // or the server stopped too (then it does nothing). Without this callback every
    // report is answered keep_going.
    std::function<void(const WorkerPlace&, std::uint64_t epoch, std::int64_t step, const nlohmann::json& metrics,
                       ReportAnswer answer)>
        on_report;
    // A worker's durable checkpointing saved, restored, skipped a file or failed
    // (ELASTICRUN_CHECKPOINT_DIR); `epoch` is the worker's. Path and detail are cut to
    // kMaxNoteText bytes.
    std::function<void(const WorkerPlace&, std::uint64_t epoch, const msg::CheckpointNote&)> on_checkpoint;
    // A joined worker's elastic state finished its sync in `epoch` (the worker's): it
    // holds the job's committed state, `commits` of them.
    std::function<void(const WorkerPlace&, std::uint64_t epoch, std::uint64_t commits)> on_synced;
  };
  static constexpr std::size_t kMaxNoteText = 4096;
  // Frames to many workers at once leave in slices of this many, this far apart (send_paced).
  static constexpr std::size_t kFanOut = 256;
  static constexpr std::chrono::milliseconds kFanOutPause{1};

  Server(boost::asio::io_context& io, const auth::Secret& secret,
         const boost::asio::ip::tcp::endpoint& bind, Callbacks cb = {}, ServerLimits limits = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  std::uint16_t port() const;
  // Installs a new epoch and pushes `kind` to every worker still in an older one.
  // After an abort (a failure) older epochs end at once: their pending requests fail.
  // After hosts_updated (hosts only added) older epochs keep serving their key-value
  // tables and barriers until their last worker has re-joined, since their
  // communicators stay in use until the workers' next commit.
  void start_epoch(Assignment a, msg::NotifyKind kind, const std::string& reason);
  void notify_all(msg::NotifyKind kind, const std::string& reason);
  // Asks every worker for a durable checkpoint at its next commit (NotifyKind::checkpoint),
  // and every worker that joins from now on too: a worker started after the request (a
  // new epoch's) may be the rank 0 that commits next.
  void request_checkpoint(const std::string& reason);
  // The current epoch is broken and no next one can start yet: interrupt its workers
  // (they wait in rejoin for the next epoch) and end its key-value table and barriers.
  void abort_epoch(const std::string& reason);
  const Assignment& assignment() const { return assignment_; }
  std::size_t connections() const { return sessions_.size(); }
  void stop();

 private:
  // A request waiting on the server; `hold` counts it against its session's
  // max_waiting for as long as it waits (Session::hold_wait).
  struct Waiter {
    std::weak_ptr<Session> session;
    std::uint64_t req;
    std::shared_ptr<boost::asio::steady_timer> timer;
    std::shared_ptr<void> hold;
    int rank = -1;  // at a barrier
  };
  // The ranks waiting at a barrier, and how many waiters each has there: one that times
  // out leaves it (its rank no longer counts as arrived unless it waits there again).
  struct BarrierState {
    std::vector<Waiter> waiters;
    std::map<int, int> arrived;
  };
  // What one epoch's workers share: its size, key-value table and barriers.
  struct EpochState {
    int size = 0;
    std::map<std::string, wire::Bytes> kv;
    std::multimap<std::string, Waiter> kv_waiters;
    std::map<std::string, BarrierState> barriers;
    std::map<std::pair<std::string, int>, std::uint32_t> joins;  // by place: how many times it joined
  };

  void on_socket(boost::asio::ip::tcp::socket sock);
  // SessionHost: what sessions ask of the server.
  void on_join(const std::shared_ptr<Session>& s, const msg::Join& j) override;
  void on_rejoin(const std::shared_ptr<Session>& s, const msg::Rejoin& r) override;
  void on_kv_set(const std::shared_ptr<Session>& s, msg::KvSet m) override;
  void on_kv_get(const std::shared_ptr<Session>& s, const msg::KvGet& m) override;
  void on_barrier(const std::shared_ptr<Session>& s, const msg::Barrier& m) override;
  void on_report(const std::shared_ptr<Session>& s, msg::Report m) override;
  void on_checkpoint_note(const std::shared_ptr<Session>& s, const msg::CheckpointNote& m) override;
  void on_synced(const std::shared_ptr<Session>& s, const msg::Synced& m) override;
  void on_heard(Session& s) override;
  void on_handshake_over(Session& s) override;
  void on_leave(Session& s) override;
  void on_closed(const std::shared_ptr<Session>& s, bool clean) override;
  // Every liveness tick: gives up the workers silent for the worker timeout.
  void watch_liveness();
  // The answer to a join or re-join of place `p` in the current epoch (counted: join_seq).
  msg::JoinOk join_ok(std::uint64_t req, const WorkerPlace& p);
  void answer_rejoin(const std::shared_ptr<Session>& s, std::uint64_t req);
  // The session's epoch state, or null (and an error sent for `req`) if it ended.
  EpochState* epoch_of(const std::shared_ptr<Session>& s, std::uint64_t req);
  // Whether `s` may have one more request waiting; if not, `req` is answered an error.
  bool may_wait(const std::shared_ptr<Session>& s, std::uint64_t req, const char* what);
  void barrier_timed_out(std::uint64_t epoch, const std::string& name, boost::asio::steady_timer* timer);
  void end_epoch(std::uint64_t epoch);
  // A frame for a worker, sent if it is still in an epoch before `before` by then.
  static constexpr std::uint64_t kAnyEpoch = ~std::uint64_t{0};
  struct Outgoing {
    std::weak_ptr<Session> session;
    Frame frame;
    std::uint64_t before = kAnyEpoch;
  };
  void fan_out(const msg::Notify& n, std::uint64_t before);
  void send_paced(std::vector<Outgoing> out);
  void collect_epochs();
  void place(const std::shared_ptr<Session>& s, const WorkerPlace& p, std::uint64_t epoch);

  boost::asio::io_context& io_;
  auth::Secret secret_;
  boost::asio::ip::tcp::acceptor acceptor_;
  AcceptLoop accept_;
  Callbacks cb_;
  ServerLimits limits_;
  Assignment assignment_;
  std::set<std::shared_ptr<Session>> sessions_;
  std::map<std::uint64_t, EpochState> epochs_;
  std::map<std::uint64_t, int> members_;  // joined sessions per epoch
  std::size_t keys_ = 0;  // across all epochs, for the limit
  struct PendingRejoin {
    std::weak_ptr<Session> session;
    std::uint64_t req, min_epoch;
    std::shared_ptr<void> hold;
  };
  std::size_t handshaking_ = 0;  // sessions started and not joined yet, for max_handshakes
  // Accepted connections whose handshake waits for one of those to end, oldest first.
  std::deque<std::weak_ptr<Session>> admission_;
  std::vector<PendingRejoin> rejoins_;
  std::string checkpoint_reason_;  // request_checkpoint's, for the workers that join later
  // With a worker timeout: the joined sessions, by when last heard from, checked on one
  // timer (not one per session).
  std::optional<Liveness<Session*>> liveness_;
  boost::asio::steady_timer liveness_timer_;
  // Read by the fan-out's later slices, which may run after the server is gone.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace elasticrun::rendezvous
