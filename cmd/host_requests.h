// --request-hosts-script: asking the cluster for the slots an elastic job could still use,
// and giving back the hosts it does not use (Elastic Horovod's "resource requests for
// additional workers", left to the orchestration system: a Slurm version submits and
// cancels allocations, scripts/request-hosts/slurm).
//
// The script is run as `SCRIPT request N` (N more slots would bring the job to --max-np)
// and `SCRIPT release HOST...`; whatever it obtains must then appear in the discovery
// script's answers (a request never adds hosts by itself). It is bounded and gentle: one
// run at a time, each kind at most once per --request-interval, killed after
// --discovery-timeout; a failure is logged and tried again after the interval, and never
// ends the job.
#pragma once

#include "discovery/host_source.h"

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace elasticrun::cmd {

using RequestClock = std::chrono::steady_clock;

// What the job looks like now, for the policy.
struct RequestView {
  int max_np = 0;            // 0: no cap, nothing is ever requested
  int usable_slots = 0;      // slots of the hosts discovery lists, blacklisted ones left out
  std::set<std::string> offered;   // hosts discovery lists now (blacklisted ones too)
  std::set<std::string> in_use;    // hosts of the current assignment
  bool running = false;      // an epoch has formed and the job is not ending
};

struct RequestAction {
  enum class Kind { request, release } kind = Kind::request;
  int slots = 0;                    // request
  std::vector<std::string> hosts;   // release, sorted
};

// The decisions, without I/O: a fake clock drives it in the tests.
class RequestPolicy {
 public:
  explicit RequestPolicy(std::chrono::milliseconds interval) : interval_(interval) {}
  // The next run to make now, if any (none while one runs: the caller asks only when idle).
  // A host offered and unused counts as unused only after `interval` of that: one that
  // discovery just added is used at the next epoch.
  std::optional<RequestAction> next(RequestClock::time_point now, const RequestView& v);

 private:
  std::chrono::milliseconds interval_;
  std::optional<RequestClock::time_point> last_request_, last_release_;
  std::map<std::string, RequestClock::time_point> unused_since_;
};

// Runs the script as the policy says. `on_done(action, error)`: error empty on success.
class HostRequester {
 public:
  using Done = std::function<void(const RequestAction&, const std::string& error)>;
  HostRequester(boost::asio::io_context& io, std::string script, std::chrono::milliseconds interval,
                std::chrono::milliseconds timeout, Done on_done);
  ~HostRequester();
  // Starts the next run if the policy wants one and none is running.
  void tick(const RequestView& v);
  void stop();

 private:
  boost::asio::io_context& io_;
  std::string script_;
  std::chrono::milliseconds timeout_;
  RequestPolicy policy_;
  Done on_done_;
  std::unique_ptr<discovery::HostSource> running_;
  bool stopped_ = false;
};

}  // namespace elasticrun::cmd
