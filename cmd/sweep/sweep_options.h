// `elasticrun sweep`'s command line: the pool of hosts, the search space and scheduler,
// how big each trial may be, the experiment directory, and the trial program.
#pragma once

#include "common/result.h"
#include "discovery/hosts.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace elasticrun::sweep {

struct SweepOptions {
  // The pool: a fixed host list, or a discovery script polled every discovery_interval.
  std::vector<discovery::Host> hosts;
  std::string discovery_script;
  std::chrono::milliseconds discovery_interval{1000};
  int slots_per_host = 1;

  std::string space_file;  // the search space (JSON); see elasticrun-sweep(1)
  std::string metric;      // the reported metric the scheduler ranks by
  bool maximize = false;   // --mode max
  int num_samples = 1;
  std::string scheduler = "fifo";
  nlohmann::json scheduler_params = nlohmann::json::object();
  int trial_min_np = 1, trial_max_np = 1;
  int max_concurrent = 0;  // 0: as many as the pool holds
  std::string dir;         // the experiment directory
  bool resume = false;
  std::uint64_t seed = 0;
  std::string events_file;
  std::string log_level;
  std::vector<std::string> env;           // -x, passed to every trial's elasticrun
  std::vector<std::string> trial_args;    // --trial-arg: more elasticrun options per trial
  std::vector<std::string> command;
};

struct SweepParse {
  std::optional<SweepOptions> options;
  std::string print;  // --help
};

// argv[0] is "sweep".
Result<SweepParse> parse_sweep_options(int argc, const char* const* argv);

}  // namespace elasticrun::sweep
