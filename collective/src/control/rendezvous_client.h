// A worker's connection to the rendezvous server.
//
// Connect and authenticate (HMAC challenge-response with the job secret), join an
// epoch, then use it as the communicator's Store (address exchange) and for
// barriers. A reader thread owns the socket's input: it routes replies to the
// waiting callers by request id and turns pushed notifications (abort,
// hosts-updated, shutdown) into the AbortSignal, which interrupts every wait; a
// checkpoint request is only counted, for the durable checkpoints (api/durable.h). If the
// connection drops, the signal is raised too: a worker never waits on a dead server.
// A heartbeat thread sends a heartbeat as often as the server asked in its JoinOk,
// whatever the program's own threads are doing (a long step, a blocked collective): the
// server takes a worker that sends nothing for its worker timeout for stopped or frozen
// (rendezvous/liveness.h).
#pragma once

#include "control/abort_signal.h"
#include "control/store.h"

#include "common/auth.h"
#include "common/frame.h"
#include "common/messages.h"
#include "common/socket_options.h"

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace elasticrun::collective {

class RendezvousClient final : public Store {
 public:
  // Connects to "host:port", authenticates and joins the current epoch as (host, slot);
  // throws Error/ProtocolError/TimeoutError. A driver that falls silent (cut link,
  // host down) is given up a little after `keep_alive`, the job's host timeout
  // (net::keep_alive).
  RendezvousClient(const std::string& addr, const auth::Secret& secret, const std::string& host, int slot,
                   std::uint64_t epoch, Clock::time_point deadline,
                   std::chrono::milliseconds keep_alive = net::kDefaultHostTimeout);
  ~RendezvousClient() override;
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  const msg::JoinOk& joined() const { return joined_; }
  // Waits for an epoch >= min_epoch and takes this worker's place in it. Throws Error
  // when the worker is not in that epoch (removed), TimeoutError past the deadline.
  // Clears the abort signal: notices for the epochs before the new one are stale.
  msg::JoinOk rejoin(std::uint64_t min_epoch, Clock::time_point deadline);
  // The newest epoch the server announced as hosts-updated (0 if none newer than ours).
  bool hosts_updated() const { return updated_epoch_.load() > joined_epoch_.load(); }
  // How many times the driver asked for a checkpoint at the next commit
  // (NotifyKind::checkpoint: the job is being ended from outside).
  std::uint64_t checkpoint_requests() const { return checkpoint_requests_.load(); }
  // The newest epoch any notification announced.
  std::uint64_t announced_epoch() const { return announced_epoch_.load(); }
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Clock::time_point deadline) override;
  void barrier(const std::string& name, Clock::time_point deadline);
  // Sends rank 0's report (`metrics`: a JSON object of numbers, as text) and waits for
  // the driver's decision. A refusal is an Error, or HostsUpdated when a newer epoch was
  // announced (the server takes reports of the current epoch only); an abort or a lost
  // connection is WorkersFailed, the deadline TimeoutError.
  msg::Decision report(std::int64_t step, const std::string& metrics, Clock::time_point deadline);
  // Tells the driver what durable checkpointing did (no reply; any thread). False if the
  // connection could not take it.
  bool note(const msg::CheckpointNote& n);
  // Tells the driver this worker's elastic state finished a sync at `commits` commits: it
  // holds the job's committed state from now on (no reply). False if the connection
  // could not take it.
  bool synced(std::uint64_t commits);
  // Tells the server this worker is ending on purpose, then closes.
  void leave();

  const std::shared_ptr<AbortSignal>& abort_signal() const { return abort_; }

 private:
  struct Reply {
    std::optional<Frame> frame;
    std::string error;
  };
  // Sends `f` (request id `req`) and waits for its reply frame.
  Frame call(std::uint64_t req, const Frame& f, Clock::time_point deadline, const char* what,
             bool abortable = true);
  void open(const std::string& addr, Clock::time_point deadline, std::chrono::milliseconds keep_alive);
  void handshake(const auth::Secret& secret, Clock::time_point deadline);
  void reader();
  void on_notify(const msg::Notify& n);
  void fail_all(const std::string& why);
  void beat(std::chrono::milliseconds every);

  int fd_ = -1;
  FdChannel channel_;
  Frame hello_;  // the server's, read by open()
  std::shared_ptr<AbortSignal> abort_;
  std::mutex write_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, Reply> replies_;  // requests awaiting a reply
  std::uint64_t next_req_ = 1;
  bool closed_ = false;
  std::string closed_why_;
  msg::JoinOk joined_;
  std::atomic<std::uint64_t> joined_epoch_{0}, updated_epoch_{0}, announced_epoch_{0}, aborted_epoch_{0};
  std::atomic<std::uint64_t> checkpoint_requests_{0};
  std::thread reader_;
  // The heartbeat thread; beat_stop_ (under beat_mu_) ends it.
  std::mutex beat_mu_;
  std::condition_variable beat_cv_;
  bool beat_stop_ = false;
  std::thread beater_;
};

}  // namespace elasticrun::collective
