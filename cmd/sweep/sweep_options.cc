#include "cmd/sweep/sweep_options.h"

#include "cmd/options.h"

#include "common/cli.h"
#include "discovery/slurm.h"

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <sstream>

namespace elasticrun::sweep {
namespace {

namespace po = boost::program_options;

po::options_description describe() {
  po::options_description d("sweep options");
  d.add_options()
      ("help,h", "print this help and exit")
      ("hosts,H", po::value<std::string>(), "the pool: host:slots,host:slots,... (default: inside a Slurm allocation its nodes, else localhost:1)")
      ("hostfile", po::value<std::string>(), "the pool as a file, one 'host slots=N' per line")
      ("host-discovery-script", po::value<std::string>(), "the pool from an executable printing 'host[:slots]' lines")
      ("discovery-interval", po::value<double>()->default_value(1.0), "seconds between runs of the pool's discovery script")
      ("slots-per-host", po::value<int>()->default_value(1), "slots of a host listed without a count")
      ("space", po::value<std::string>(), "search space file (JSON; see elasticrun-sweep(1))")
      ("metric", po::value<std::string>(), "the reported metric to optimize")
      ("mode", po::value<std::string>()->default_value("min"), "min|max: whether a smaller or a larger metric is better")
      ("num-samples", po::value<int>()->default_value(1), "how many times the grid is repeated with fresh random draws")
      ("scheduler", po::value<std::string>()->default_value("fifo"), "fifo|asha|pbt")
      ("grace-period", po::value<double>(), "asha: first rung, in reported steps (default 1)")
      ("reduction-factor", po::value<double>(), "asha: keep the top 1/F at each rung (default 4)")
      ("max-t", po::value<double>(), "asha: a trial reaching this step is done (default 100)")
      ("asha-rule", po::value<std::string>()->default_value("ray"), "asha: ray (cut-off at the (1-1/F) percentile of earlier values) or strict (only the best floor(n/F) of n go on, as Optuna)")
      ("perturbation-interval", po::value<double>(), "pbt: steps between exploit/explore decisions (required with pbt)")
      ("quantile-fraction", po::value<double>(), "pbt: bottom/top fraction of trials (default 0.25)")
      ("resample-probability", po::value<double>(), "pbt: chance a parameter is resampled, not perturbed (default 0.25)")
      ("trial-np", po::value<std::string>()->default_value("1:1"), "MIN:MAX workers per trial")
      ("max-concurrent", po::value<int>()->default_value(0), "most trials running at once (0: as many as fit)")
      ("dir", po::value<std::string>(), "experiment directory (created; must not hold a sweep unless --resume)")
      ("resume", "continue the sweep in --dir: finished trials stay finished, unfinished ones continue")
      ("seed", po::value<std::uint64_t>()->default_value(0), "seed of the space's random draws and of pbt")
      ("events", po::value<std::string>(), "append JSON lines describing the sweep's events to FILE")
      ("env,x", po::value<std::vector<std::string>>(), "VAR or VAR=VALUE passed to every trial's workers; repeatable")
      ("trial-arg", po::value<std::vector<std::string>>(), "one more elasticrun option for every trial (e.g. --trial-arg=--rendezvous-timeout=10); repeatable")
      ("log-level", po::value<std::string>(), "error|warn|info|debug");
  return d;
}

std::string usage() {
  std::ostringstream s;
  s << "usage: elasticrun sweep [pool] --space FILE --metric NAME --dir EXP [options] -- command [args...]\n\n"
    << describe();
  return s.str();
}

Result<std::pair<int, int>> parse_np_range(const std::string& s) {
  auto colon = s.find(':');
  auto number = [](std::string_view v, int& out) {
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    return ec == std::errc() && end == v.data() + v.size() && out >= 1;
  };
  int lo = 0, hi = 0;
  std::string_view text(s);
  if (colon == std::string::npos) {
    if (!number(text, lo)) return fail(fmt::format("--trial-np '{}': expected MIN:MAX (or N), counts from 1", s));
    return std::pair{lo, lo};
  }
  if (!number(text.substr(0, colon), lo) || !number(text.substr(colon + 1), hi))
    return fail(fmt::format("--trial-np '{}': expected MIN:MAX, counts from 1", s));
  if (hi < lo) return fail(fmt::format("--trial-np '{}': MAX is below MIN", s));
  return std::pair{lo, hi};
}

}  // namespace

Result<SweepParse> parse_sweep_options(int argc, const char* const* argv) {
  std::vector<std::string> head;
  SweepOptions o;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") break;
    head.push_back(a);
  }
  for (int j = i + 1; j < argc; ++j) o.command.emplace_back(argv[j]);
  auto parsed = cli::parse(head, describe());
  if (!parsed) return Failure{parsed.error()};
  po::variables_map& vm = *parsed;
  SweepParse out;
  if (vm.count("help")) {
    out.print = usage();
    return out;
  }
  o.resume = vm.count("resume") > 0;
  if (o.command.empty() && !o.resume) return fail("no trial command given (put it after '--')");
  if (!vm.count("dir")) return fail("--dir EXP is required");
  o.dir = vm["dir"].as<std::string>();
  if (vm.count("space")) o.space_file = vm["space"].as<std::string>();
  if (vm.count("metric")) o.metric = vm["metric"].as<std::string>();
  if (!o.resume && o.space_file.empty()) return fail("--space FILE is required");
  if (!o.resume && o.metric.empty()) return fail("--metric NAME is required");
  std::string mode = vm["mode"].as<std::string>();
  if (mode != "min" && mode != "max") return fail(fmt::format("--mode '{}': expected min or max", mode));
  o.maximize = mode == "max";
  o.num_samples = vm["num-samples"].as<int>();
  if (o.num_samples < 1 || o.num_samples > 100000) return fail("--num-samples must be from 1 to 100000");
  o.scheduler = vm["scheduler"].as<std::string>();
  if (o.scheduler != "fifo" && o.scheduler != "asha" && o.scheduler != "pbt")
    return fail(fmt::format("--scheduler '{}': expected fifo, asha or pbt", o.scheduler));
  for (const char* p : {"grace-period", "reduction-factor", "max-t", "perturbation-interval", "quantile-fraction",
                        "resample-probability"}) {
    if (!vm.count(p)) continue;
    std::string key(p);
    for (auto& c : key)
      if (c == '-') c = '_';
    o.scheduler_params[key] = vm[p].as<double>();
  }
  std::string rule = vm["asha-rule"].as<std::string>();
  if (rule != "ray" && rule != "strict") return fail(fmt::format("--asha-rule '{}': expected ray or strict", rule));
  if (rule == "strict") {
    if (o.scheduler != "asha") return fail("--asha-rule strict needs --scheduler asha");
    o.scheduler_params["strict"] = 1;
  }
  auto np = parse_np_range(vm["trial-np"].as<std::string>());
  if (!np) return Failure{np.error()};
  std::tie(o.trial_min_np, o.trial_max_np) = *np;
  o.max_concurrent = vm["max-concurrent"].as<int>();
  if (o.max_concurrent < 0) return fail("--max-concurrent must be 0 (no limit) or more");
  o.seed = vm["seed"].as<std::uint64_t>();
  o.slots_per_host = vm["slots-per-host"].as<int>();
  if (o.slots_per_host < 1 || o.slots_per_host > discovery::kMaxSlotsPerHost)
    return fail(fmt::format("--slots-per-host {} out of range 1..{}", o.slots_per_host, discovery::kMaxSlotsPerHost));
  int pools = static_cast<int>(vm.count("hosts") + vm.count("hostfile") + vm.count("host-discovery-script"));
  if (pools > 1) return fail("give one of -H, --hostfile and --host-discovery-script");
  if (vm.count("hosts")) {
    auto h = discovery::parse_host_list(vm["hosts"].as<std::string>(), o.slots_per_host);
    if (!h) return fail("-H: " + h.error());
    o.hosts = std::move(*h);
  } else if (vm.count("hostfile")) {
    auto h = discovery::read_hostfile(vm["hostfile"].as<std::string>(), o.slots_per_host);
    if (!h) return Failure{h.error()};
    o.hosts = std::move(*h);
  } else if (vm.count("host-discovery-script")) {
    o.discovery_script = vm["host-discovery-script"].as<std::string>();
  } else {
    // Inside a Slurm allocation its nodes are the pool, as for elasticrun itself.
    auto slurm = discovery::slurm_allocation([](const char* name) { return std::getenv(name); }, o.slots_per_host);
    if (!slurm) return fail("in a Slurm allocation: " + slurm.error());
    o.hosts = *slurm ? std::move(**slurm) : std::vector<discovery::Host>{{"localhost", 1}};
  }
  double di = vm["discovery-interval"].as<double>();
  if (!(di > 0 && di < 1e6)) return fail("--discovery-interval must be a positive number of seconds");
  o.discovery_interval = std::chrono::milliseconds(static_cast<long long>(di * 1000));
  if (vm.count("events")) o.events_file = vm["events"].as<std::string>();
  if (vm.count("log-level")) o.log_level = vm["log-level"].as<std::string>();
  if (vm.count("env")) {
    auto given = cmd::env_entries(vm["env"].as<std::vector<std::string>>());
    if (!given) return Failure{given.error()};
    o.env = std::move(*given);
  }
  if (vm.count("trial-arg")) o.trial_args = vm["trial-arg"].as<std::vector<std::string>>();
  out.options = std::move(o);
  return out;
}

}  // namespace elasticrun::sweep
