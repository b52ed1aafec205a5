// The driver's handle on one host's elasticrund.
//
// DaemonLink turns the daemon's byte stream into events; subclasses own the
// transport: a child process on pipes (ChildDaemon, here: the daemon itself, or srun
// running it on another node of a Slurm allocation), an SSH channel or a
// TCP connection to a systemd daemon (tcp_daemon.h). Closing the link makes the daemon
// kill its workers and exit.
#pragma once

#include "common/frame.h"
#include "common/messages.h"
#include "common/result.h"

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace elasticrun::cmd {

struct DaemonEvents {
  std::function<void(const std::string& host, const msg::Started&)> on_started;
  std::function<void(const std::string& host, const msg::Output&)> on_output;
  std::function<void(const std::string& host, const msg::Exited&)> on_exited;
  std::function<void(const std::string& host, const msg::SpawnFailed&)> on_spawn_failed;
  std::function<void(const std::string& host, const msg::PortReserved&)> on_port_reserved;
  std::function<void(const std::string& host, const msg::Preempted&)> on_preempted;
  // The link ended: after a shutdown (clean = true), or unexpectedly with a reason.
  std::function<void(const std::string& host, bool clean, const std::string& why)> on_closed;
};

class DaemonLink {
 public:
  DaemonLink(std::string host, DaemonEvents ev) : host_(std::move(host)), ev_(std::move(ev)) {}
  virtual ~DaemonLink() = default;
  const std::string& host() const { return host_; }
  template <class M>
  void send(const M& m) {
    send_frame(msg::to_frame(m));
  }
  virtual void send_frame(const Frame& f) = 0;
  // Asks the daemon to stop its workers (SIGTERM, SIGKILL after `grace`) and exit.
  void shutdown(std::chrono::milliseconds grace);
  // Ends the link at once; the daemon notices and kills its workers.
  virtual void close() = 0;
  bool closed() const { return closed_; }
  // The daemon answered (its ready frame arrived).
  bool ready() const { return ready_; }
  // When the last frame came from the daemon (its heartbeats keep this fresh).
  std::chrono::steady_clock::time_point last_heard() const { return last_heard_; }
  // Forget the silence so far: the driver itself was not listening (its loop stalled).
  void heard_now() { last_heard_ = std::chrono::steady_clock::now(); }
  // When the daemon must have answered (its ready frame) by: the driver gives up a daemon
  // that is started or connected but never answers (a hung start, a wrong program).
  // `limit` says which one, for the message ("12.0 s (--host-timeout)").
  std::chrono::steady_clock::time_point answer_by() const { return answer_by_; }
  const std::string& answer_limit() const { return answer_limit_; }
  void expect_answer_by(std::chrono::steady_clock::time_point t, std::string limit = {}) {
    answer_by_ = t;
    if (!limit.empty()) answer_limit_ = std::move(limit);
  }
  // Gives the daemon up for gone (it fell silent), as if its link had broken.
  void lost(const std::string& why) { report_closed(why); }

 protected:
  // Feed bytes read from the daemon. Returns false (and reports) on a bad stream.
  bool on_bytes(std::span<const std::uint8_t> data);
  // Or whole frames, for a transport that parses them itself.
  bool on_frame(const Frame& f);
  void report_closed(const std::string& why);
  bool shutting_down_ = false;

 private:
  void dispatch(const Frame& f);
  std::string host_;
  DaemonEvents ev_;
  FrameParser parser_;
  bool ready_ = false;
  bool closed_ = false;
  std::chrono::steady_clock::time_point last_heard_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point answer_by_ = std::chrono::steady_clock::time_point::max();
  std::string answer_limit_;
};

// Starts `daemon_path --stdio` as a child of this process for host `host`.
Result<std::unique_ptr<DaemonLink>> launch_local_daemon(boost::asio::io_context& io, const std::string& host,
                                                        const std::string& daemon_path,
                                                        const std::string& log_level, DaemonEvents ev);

// Starts `daemon_path --stdio` on `host` as a step of the Slurm allocation this process
// runs in: `srun_path` (a child of this process) with one task on that node, sharing the
// allocation's resources with the other steps (--overlap), so that Slurm accounts for
// the daemon and its workers and cleans them up with the job. srun carries the frames
// over the task's stdin and stdout (unbuffered) as SSH does; the link ends when srun
// does.
Result<std::unique_ptr<DaemonLink>> launch_srun_daemon(boost::asio::io_context& io, const std::string& host,
                                                       const std::string& daemon_path, const std::string& log_level,
                                                       const std::string& srun_path, DaemonEvents ev);

// srun's arguments for that (argv[0] included), for the tests.
std::vector<std::string> srun_daemon_argv(const std::string& srun_path, const std::string& host,
                                          const std::string& daemon_path, const std::string& log_level);

}  // namespace elasticrun::cmd
