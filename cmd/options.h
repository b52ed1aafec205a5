// elasticrun's command line. Each flag is declared once (options.cc) with its default
// and help; `--help` and man/elasticrun.1 describe the same set.
#pragma once

#include "cmd/ssh_daemon.h"
#include "common/result.h"
#include "common/socket_options.h"
#include "discovery/hosts.h"

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace elasticrun::cmd {

// --worker-timeout's default: a healthy worker's library beats every second, so it is
// failed only after missing four beats in a row (man/elasticrun.1 says why that is safe).
inline constexpr std::chrono::milliseconds kDefaultWorkerTimeout{5000};

struct Options {
  int np = 0;  // 0: every slot offered
  std::vector<discovery::Host> hosts;
  int slots_per_host = 1;
  std::string output_dir;
  std::string log_level;
  std::string daemon_path;
  std::vector<std::string> env;  // KEY=VALUE for the workers
  std::chrono::milliseconds start_timeout{60000};
  // A host whose daemon sends nothing for this long is taken for gone (its workers
  // fail), and its daemon stops its workers when the driver is that silent.
  std::chrono::milliseconds host_timeout = net::kDefaultHostTimeout;
  // A worker that joined the rendezvous and then sends nothing, not even its library's
  // heartbeats, for this long is failed (stopped, frozen); 0: never.
  std::chrono::milliseconds worker_timeout = kDefaultWorkerTimeout;
  std::vector<std::string> command;

  // Elastic mode: on with --host-discovery-script, --host-discovery-fd or --min-np.
  bool elastic = false;
  int min_np = 0, max_np = 0;  // 0: min = np, max = no cap
  std::string discovery_script;
  // --host-discovery-fd: an inherited pipe or stream socket on which host lists arrive
  // (discovery/feed_source.cc); -1: none.
  int discovery_fd = -1;
  // The hosts come from discovery (a script or a feed), not from -H / --hostfile.
  bool discovered() const { return !discovery_script.empty() || discovery_fd >= 0; }
  std::chrono::milliseconds discovery_interval{1000};
  std::chrono::milliseconds discovery_timeout{10000};
  std::chrono::milliseconds elastic_timeout{600000};
  std::chrono::milliseconds rendezvous_timeout{60000};
  int reset_limit = 0;  // 0: unlimited
  // Restart mode (--max-restarts): a failure or a change of hosts restarts every worker;
  // this many restarts after failures. nullopt: elastic jobs recover in process.
  std::optional<int> max_restarts;
  // torchrun's TORCHELASTIC_RUN_ID (--run-id); empty: the driver makes one up.
  std::string run_id;
  // --preload: modules each host's fork server imports once (daemon/fork_server.h);
  // empty: every worker is a new process.
  std::vector<std::string> preload;
  std::optional<std::pair<std::chrono::milliseconds, std::chrono::milliseconds>> blacklist_cooldown;
  // --request-hosts-script (cmd/host_requests.h): asks for slots up to --max-np and gives
  // back unused hosts, at most once per request_interval each; empty: never.
  std::string request_hosts_script;
  std::chrono::milliseconds request_interval{60000};
  std::string events_file;
  // --report-fd: a connected stream socket on which each report is asked about
  // (cmd/report_channel.h); -1: none, every report is answered "continue".
  int report_fd = -1;

  SshOptions ssh;  // for hosts that are not this machine
  // How daemons start on the hosts that are not this machine: over SSH, or as steps of
  // the Slurm allocation this process runs in (srun). --launcher auto picks srun inside
  // an allocation (SLURM_JOB_ID set), SSH elsewhere.
  enum class Launcher { ssh, srun };
  Launcher launcher = Launcher::ssh;
  std::string srun_path;  // resolved when launcher is srun
  // The hosts came from the Slurm allocation's environment (no -H, --hostfile or discovery).
  bool slurm_hosts = false;

  // Reach every host's long-running `elasticrund --listen` on this port instead of
  // starting a daemon (locally or over SSH); 0: start one.
  int daemon_port = 0;
  std::string daemon_secret_file;  // the cluster secret for daemon_port
  // Durable checkpoints of the elastic State (collective/src/api/durable.h): the
  // directory, absolute and checked writable; empty: none. Passed to the workers as
  // ELASTICRUN_CHECKPOINT_*.
  std::string checkpoint_dir;
  long long checkpoint_every = 10;                    // commits; 0: not by count
  std::chrono::milliseconds checkpoint_interval{60000};  // 0: not by time
  // How long a SIGTERM (the driver's, or a daemon's: msg::Preempted) waits for the
  // workers' last checkpoint before the workers are stopped; 0 without --checkpoint-dir.
  std::chrono::milliseconds preempt_grace{0};
};

// What parse() decided: run a job, or print something and exit.
struct ParseOutcome {
  std::optional<Options> options;
  std::string print;  // help or version text, printed to stdout with exit 0
};

Result<ParseOutcome> parse_options(int argc, const char* const* argv);
// -x's values as KEY=VALUE: VAR=VALUE as given, VAR with this process's value (left out
// when unset).
Result<std::vector<std::string>> env_entries(const std::vector<std::string>& given);
std::string usage();

}  // namespace elasticrun::cmd
