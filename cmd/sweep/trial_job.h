// One trial's elastic job: a child `elasticrun` (this very binary) fed the trial's share
// of the pool on a pipe (its --host-discovery-fd), its reports coming in on a socket
// (its --report-fd) and answered there, and its --events file followed.
//
// Lifetime: owned by the sweep; no callback runs after it is destroyed, and a callback
// may destroy it. Destroying it with the job still running kills the job's elasticrun
// (its daemons then stop their workers: their death signal).
#pragma once

#include "common/child_process.h"
#include "common/result.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace elasticrun::sweep {

struct TrialLaunch {
  std::string program;             // the elasticrun binary
  std::vector<std::string> args;   // its options, without --report-fd, --host-discovery-fd and --events
  std::string hosts;               // its first share of the pool ("host:slots" lines)
  std::vector<std::string> env;    // KEY=VALUE, all of it
  std::filesystem::path dir;       // the trial's directory: events.jsonl, output.log
};

class TrialJob {
 public:
  struct Callbacks {
    // A report of rank 0 ({"step", "metrics", ...}); answer it with answer().
    std::function<void(const nlohmann::json& report)> on_report;
    // A line of the job's --events.
    std::function<void(const nlohmann::json& event)> on_event;
    // The job ended: its raw wait status.
    std::function<void(int status)> on_exit;
  };
  static Result<std::unique_ptr<TrialJob>> start(boost::asio::io_context& io, const TrialLaunch& launch, Callbacks cb);
  ~TrialJob();
  TrialJob(const TrialJob&) = delete;
  TrialJob& operator=(const TrialJob&) = delete;

  // The decision for the report received last.
  void answer(std::int64_t step, bool stop);
  // The trial's share of the pool changed: "host:slots" lines (the job's feed
  // coalesces: a share sent while an earlier one is still being written replaces it).
  void send_hosts(const std::string& hosts);
  // Asks the job to stop (elasticrun stops its workers: SIGTERM, then SIGKILL).
  void terminate() const;
  int pid() const { return child_->pid(); }

 private:
  TrialJob(boost::asio::io_context& io, Callbacks cb, std::filesystem::path events);
  void read_reports();
  void follow_events();
  void read_new_events();
  void write_hosts();

  boost::asio::io_context& io_;
  Callbacks cb_;
  std::unique_ptr<ChildProcess> child_;
  boost::asio::local::stream_protocol::socket reports_;
  boost::asio::streambuf in_;
  boost::asio::posix::stream_descriptor hosts_;  // the feed's writing end
  std::string hosts_out_;      // being written
  std::string hosts_next_;     // to write after it; empty: nothing
  boost::asio::steady_timer events_timer_;
  std::filesystem::path events_path_;
  std::uintmax_t events_offset_ = 0;
  std::string events_partial_;
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace elasticrun::sweep
