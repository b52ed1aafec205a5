// The daemon's side of one job: reads control frames from the driver, spawns and
// kills workers through a Launcher, and reports their output and exits (with what a
// failed worker wrote to its error file). It also holds the port of the epoch's
// MASTER_PORT when the driver asks (port_reservation.h).
//
// When the control channel closes (driver gone, SSH dropped), the driver falls silent
// for the job's host timeout (a cut link), or shutdown arrives, every worker gets
// SIGTERM, then SIGKILL after the grace period, and the supervisor finishes: no
// orphans. It sends the driver heartbeats of its own, so that the driver can tell a
// silent host from a quiet one.
#pragma once

#include "common/auth.h"
#include "common/framed_stream.h"
#include "common/messages.h"
#include "daemon/error_files.h"
#include "daemon/job_records.h"
#include "daemon/launcher.h"
#include "daemon/port_reservation.h"

#include <boost/asio.hpp>

#include <map>
#include <functional>
#include <memory>
#include <optional>

namespace elasticrun::daemon {

struct SupervisorOptions {
  // Set for a job handed over by `elasticrund --listen`: the config's secret arrives
  // XORed with this pad (see auth::wrap_pad).
  std::optional<auth::Secret> secret_pad;
  // Where to record live workers for a restarted daemon (empty: no record).
  std::string state_dir;
};

class Supervisor : private FramedStream::Handler {
 public:
  // Takes ownership of the two descriptors (they may be the same socket).
  Supervisor(boost::asio::io_context& io, int in_fd, int out_fd, std::function<void(int)> on_done,
             SupervisorOptions options = {});
  ~Supervisor();
  void start();
  // Stop every worker, then finish with `exit_code`. The workers' shared-memory and
  // error-file directories go at once (their mappings and open files stay valid).
  void stop(std::chrono::milliseconds grace, int exit_code);
  // The daemon got `signal` from outside (a scheduler's SIGTERM): where the driver's
  // config gives a preemption grace, tells the driver (Preempted) and keeps the workers
  // for that long or until the driver stops them, and returns true; otherwise (no
  // grace, no config yet, already stopping or deferred once) returns false: stop now.
  bool defer_stop(int signal);

 private:
  void release_shared_memory();
  void on_stream_frame(Frame f) override;
  void on_stream_end(const StreamEnd& end) override;
  void on_stream_drained() override;
  void handle(const Frame& f);
  void watch_driver();
  void watch_flush();
  void beat();
  WorkerEvents worker_events();
  void on_spawn(const msg::Spawn& s);
  void on_reserve_port(const msg::ReservePort& r);
  std::vector<std::string> worker_env(const msg::Spawn& s, const std::string& error_file) const;
  template <class M>
  void send(const M& m) {
    send_frame(msg::to_frame(m));
  }
  void send_frame(const Frame& f);
  void finish_if_idle();
  std::string make_shm_dir(std::uint32_t slot);
  void remove_shm_dir(std::uint32_t slot);

  // Output waiting to go to the driver beyond which the workers' pipes are not read
  // (WorkerEvents::hold_output) until it has all gone: the daemon's memory stays bounded
  // when workers write faster than the link carries, and a heartbeat waits behind at
  // most this much.
  static constexpr std::size_t kOutputHold = 1u << 20;

  boost::asio::io_context& io_;
  FramedStream stream_;
  std::function<void(int)> on_done_;
  SupervisorOptions options_;
  std::unique_ptr<JobRecord> record_;
  std::unique_ptr<Launcher> launcher_;
  std::optional<msg::Config> config_;
  bool out_broken_ = false;
  bool stopping_ = false;
  bool preempted_ = false;  // defer_stop took a signal
  int exit_code_ = 0;
  boost::asio::steady_timer kill_timer_, watchdog_, beat_timer_, flush_timer_, preempt_timer_;
  std::uint64_t drains_ = 0;  // times the write queue ran empty (on_stream_drained)
  // Silence from the driver tolerated: msg::kConfigTimeout until the config sets it.
  std::chrono::milliseconds driver_timeout_ = msg::kConfigTimeout;
  bool done_ = false;
  std::map<std::uint32_t, std::string> shm_dirs_;
  std::uint64_t spawned_ = 0;
  ErrorFiles error_files_;
  std::map<int, std::string> error_file_of_;  // by worker pid: the ones we gave out
  PortReservation port_;  // the current epoch's MASTER_PORT, while rank 0 is here
};

}  // namespace elasticrun::daemon
