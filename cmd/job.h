// The job controller: owns the rendezvous server and one DaemonLink per host, and
// turns their events into the job's outcome.
//
// All of it runs on one io_context thread; nothing here blocks. Every phase has a
// deadline (start timeout, stop grace), so the driver always exits.
#pragma once

#include "cmd/daemon_link.h"
#include "cmd/options.h"
#include "cmd/output.h"
#include "common/auth.h"
#include "rendezvous/assignment.h"
#include "rendezvous/server.h"

#include <boost/asio.hpp>

#include <map>
#include <memory>
#include <string>

namespace elasticrun::cmd {

class Job {
 public:
  explicit Job(Options opts);
  ~Job();
  // Runs the job to its end; returns the process exit status.
  int run();

 private:
  struct Worker {
    int rank = 0;
    int pid = 0;
    bool started = false, joined = false, exited = false;
  };

  Result<void> start();
  Result<std::string> daemon_path() const;
  void spawn_workers(DaemonLink& d);
  void on_exited(const std::string& host, const msg::Exited& e);
  void on_closed(const std::string& host, bool clean, const std::string& why);
  void on_start_timeout();
  // Prints `message` (if any), stops everything, and exits with `code`.
  void finish(int code, const std::string& message);
  void maybe_done();
  Worker* worker(const std::string& host, std::uint32_t slot);

  Options opts_;
  boost::asio::io_context io_;
  auth::Secret secret_;
  std::unique_ptr<rendezvous::Server> server_;
  rendezvous::Assignment assignment_;
  std::map<std::string, std::unique_ptr<DaemonLink>> daemons_;
  std::map<std::pair<std::string, std::uint32_t>, Worker> workers_;
  OutputRouter output_;
  boost::asio::signal_set signals_;
  boost::asio::steady_timer start_timer_, stop_timer_;
  int exit_code_ = -1;
  int joined_ = 0;
};

}  // namespace elasticrun::cmd
