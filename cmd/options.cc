#include "cmd/options.h"

#include "common/cli.h"
#include "common/env.h"
#include "common/executable.h"
#include "common/messages.h"
#include "common/python_command.h"
#include "common/writable_dir.h"
#include "discovery/slurm.h"

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

extern char** environ;

namespace elasticrun::cmd {
namespace {

namespace po = boost::program_options;

po::options_description build_description() {
  po::options_description d("options");
  d.add_options()
      ("help,h", "print this help and exit")
      ("version", "print the version and exit")
      ("np", po::value<int>(), "number of worker processes (default: every slot offered)")
      ("hosts,H", po::value<std::string>(), "hosts as host:slots,host:slots,... (default: inside a Slurm allocation its nodes, with SLURM_TASKS_PER_NODE slots; else localhost:NP)")
      ("hostfile", po::value<std::string>(), "file of hosts, one per line: 'host slots=N'")
      ("slots-per-host", po::value<int>()->default_value(1), "slots of a host listed without a count")
      ("output-filename", po::value<std::string>(), "also write each rank's output to DIR/rank.N/{stdout,stderr}")
      ("start-timeout", po::value<double>()->default_value(60), "seconds for every worker to start and join")
      ("host-timeout", po::value<double>()->default_value(net::kDefaultHostTimeout.count() / 1000.0), "seconds of silence (no heartbeat) after which a host is taken for gone, 1..86400")
      ("worker-timeout", po::value<double>()->default_value(kDefaultWorkerTimeout.count() / 1000.0), "seconds a worker (one using libelasticrun) may send nothing, not even its library's heartbeats, before it is failed as stopped or frozen; 0: never; else 1..86400")
      ("daemon-path", po::value<std::string>(), "path of elasticrund (default: beside elasticrun, then PATH)")
      ("env,x", po::value<std::vector<std::string>>(), "pass VAR (from this environment) or VAR=VALUE to the workers; repeatable")
      ("log-level", po::value<std::string>(), "error|warn|info|debug, or per component: warn,rendezvous=debug")
      ("ssh-port,p", po::value<int>(), "SSH port of remote hosts (default: ssh config, then 22)")
      ("ssh-identity-file,i", po::value<std::string>(), "SSH private key (default: $ELASTICRUN_SSH_KEY, else agent and default keys)")
      ("ssh-known-hosts", po::value<std::string>(), "known_hosts file (default: $ELASTICRUN_SSH_KNOWN_HOSTS, else ~/.ssh/known_hosts)")
      ("ssh-config", po::value<std::string>(), "ssh config file (default: $ELASTICRUN_SSH_CONFIG, else ~/.ssh/config)")
      ("ssh-host-key-checking", po::value<std::string>()->default_value("yes"), "yes|accept-new|no: unknown host keys are refused, recorded, or accepted; a changed key is always refused")
      ("ssh-connect-timeout", po::value<double>()->default_value(10.0), "seconds to connect and authenticate to a remote host (SSH, or a daemon with --daemon-port)")
      ("launcher", po::value<std::string>()->default_value("auto"), "auto|ssh|srun: how daemons start on other hosts: over SSH, or as steps of the Slurm allocation (srun); auto: srun inside an allocation, else SSH")
      ("daemon-port", po::value<int>(), "use the elasticrund --listen already running on every host at this TCP port (default: $ELASTICRUN_DAEMON_PORT; else start daemons locally or over SSH)")
      ("daemon-secret-file", po::value<std::string>(), "cluster secret shared with those daemons (default: $ELASTICRUN_DAEMON_SECRET_FILE, else /etc/elasticrun/secret)")
      ("events", po::value<std::string>(), "append JSON lines describing the job's events to FILE")
      ("checkpoint-dir", po::value<std::string>(), "the elastic State also writes its committed state to DIR (on a filesystem every host sees); the job goes on from the newest intact checkpoint there when every worker holding its state is lost, and a new run with the same DIR resumes from it (default: $ELASTICRUN_CHECKPOINT_DIR)")
      ("checkpoint-every", po::value<long long>()->default_value(10), "with --checkpoint-dir: a checkpoint every N commits (0: not by count)")
      ("checkpoint-interval", po::value<double>()->default_value(60.0), "with --checkpoint-dir: a checkpoint at the first commit SECONDS after the last one (0: not by time)")
      ("preempt-grace", po::value<double>()->default_value(20.0), "with --checkpoint-dir: on SIGTERM (elasticrun's own, or a daemon's: a scheduler ending the job), the workers' next commit is also a checkpoint; elasticrun waits up to SECONDS for it before stopping them (0: stop at once)")
      ("report-fd", po::value<std::string>(), "write each report of rank 0 as a JSON line to the connected socket N and read the decision (continue or stop) back from it (default: log reports, always continue)")
      ("min-np", po::value<int>(), "elastic: fewest workers to keep training with (default: -np)")
      ("max-np", po::value<int>(), "elastic: most workers to run (default: every slot offered)")
      ("host-discovery-script", po::value<std::string>(), "elastic: executable printing the available hosts, one 'host[:slots]' per line")
      ("host-discovery-fd", po::value<std::string>(), "elastic: read the available hosts from the inherited pipe or socket N instead: lists of 'host[:slots]' lines, each ended by an empty line, sent whenever they change")
      ("discovery-interval", po::value<double>()->default_value(1.0), "elastic: seconds between discovery runs")
      ("discovery-timeout", po::value<double>()->default_value(10.0), "elastic: seconds a discovery run may take")
      ("elastic-timeout", po::value<double>()->default_value(600.0), "elastic: seconds to wait for --min-np slots before failing")
      ("rendezvous-timeout", po::value<double>()->default_value(60.0), "elastic: seconds a worker has to (re-)join a new epoch")
      ("reset-limit", po::value<int>()->default_value(0), "elastic: fail after this many resets (0: no limit)")
      ("max-restarts", po::value<std::string>(), "restart mode (programs that keep no state with libelasticrun, such as torchrun scripts): a failed worker or a change of hosts stops every worker and starts them all again; fail after N restarts after failures (changes of hosts do not count)")
      ("preload", po::value<std::string>(), "Python jobs: modules (comma-separated: torch,torch.distributed) that a fork server on each host imports once; the workers start as its forks, not as new interpreters")
      ("run-id", po::value<std::string>(), "the job's id for its workers (TORCHELASTIC_RUN_ID; default: a random one)")
      ("blacklist-cooldown-range", po::value<std::vector<double>>()->multitoken(), "elastic: MIN MAX seconds a failed host stays out (doubling per failure); default: for good")
      ("request-hosts-script", po::value<std::string>(), "elastic: run 'SCRIPT request N' for N more slots up to --max-np, 'SCRIPT release HOST...' for hosts the job does not use (what it obtains, discovery must list)")
      ("request-interval", po::value<double>()->default_value(60), "elastic: seconds between two requests, and between two releases, of --request-hosts-script")
      ("verbose,v", "same as --log-level info");
  return d;
}

// Built once: every parse used to rebuild its forty-odd descriptions, which took most of
// the time options_fuzz spends per input.
const po::options_description& describe() {
  static const po::options_description d = build_description();
  return d;
}

// Index of the first argument that is the user's command: the first word that is not
// an option or an option's value, or the one after "--". Everything from there on
// passes through untouched, so the program's own flags never reach our parser.
Result<std::size_t> find_command(const po::options_description& d, int argc, const char* const* argv,
                                 bool& dashdash) {
  dashdash = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      dashdash = true;
      return static_cast<std::size_t>(i);
    }
    if (a.size() < 2 || a[0] != '-') return static_cast<std::size_t>(i);
    bool is_long = a[1] == '-';
    std::string name = a.substr(is_long ? 2 : 1);
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      name = name.substr(0, eq);
      inline_value = true;
    }
    // "--=x": program_options matches an empty name with every option that has no short
    // form and throws ambiguous_option from find_nothrow().
    if (name.empty()) return fail(fmt::format("unknown option '{}'", a));
    // mpirun-style single-dash long options (-np) are accepted as long ones.
    const po::option_description* o = is_long || name.size() > 1 ? d.find_nothrow(name, false, false, false)
                                                                  : nullptr;
    if (!o && !is_long) {
      // program_options keys short options with their dash ("-H").
      o = d.find_nothrow("-" + name.substr(0, 1), false, false, false);
      if (o && name.size() > 1) inline_value = true;  // -H<value> / -xVAR
    }
    if (!o) return fail(fmt::format("unknown option '{}'", a));
    // Options take one value, except the two-value --blacklist-cooldown-range MIN MAX.
    unsigned values = std::min(o->semantic()->max_tokens(), 2u);
    if (values > 0 && !inline_value) i += static_cast<int>(values);
  }
  return static_cast<std::size_t>(argc);
}

Result<std::chrono::milliseconds> seconds(const po::variables_map& vm, const char* name, bool allow_zero = false) {
  double v = vm[name].as<double>();
  // Below a millisecond a positive value would become 0: an instant timeout.
  if (!(v >= 0 && v < 1e7) || (!allow_zero && !(v >= 0.001)))
    return fail(fmt::format("--{} must be a {} number of seconds{}", name, allow_zero ? "non-negative" : "positive",
                            allow_zero ? "" : " (at least 0.001)"));
  return std::chrono::milliseconds(static_cast<long long>(v * 1000));
}

// The elastic flags; elastic mode is on with a discovery script or --min-np.
Result<void> parse_elastic(const po::variables_map& vm, Options& o) {
  o.elastic = vm.count("host-discovery-script") || o.discovery_fd >= 0 || vm.count("min-np");
  if (vm.count("host-discovery-script")) o.discovery_script = vm["host-discovery-script"].as<std::string>();
  if (!o.discovery_script.empty() && o.discovery_fd >= 0)
    return fail("give --host-discovery-script or --host-discovery-fd, not both");
  if (vm.count("min-np") && (o.min_np = vm["min-np"].as<int>()) < 1)
    return fail(fmt::format("--min-np {}: need at least one process", o.min_np));
  if (vm.count("max-np") && (o.max_np = vm["max-np"].as<int>()) < 1)
    return fail(fmt::format("--max-np {}: need at least one process", o.max_np));
  o.reset_limit = vm["reset-limit"].as<int>();
  if (o.reset_limit < 0) return fail("--reset-limit must be 0 (no limit) or more");
  struct {
    const char* name;
    std::chrono::milliseconds* out;
  } durations[] = {{"discovery-interval", &o.discovery_interval}, {"discovery-timeout", &o.discovery_timeout},
                   {"elastic-timeout", &o.elastic_timeout}, {"rendezvous-timeout", &o.rendezvous_timeout}};
  for (auto& d : durations) {
    auto v = seconds(vm, d.name);
    if (!v) return Failure{v.error()};
    *d.out = *v;
  }
  if (vm.count("blacklist-cooldown-range")) {
    auto r = vm["blacklist-cooldown-range"].as<std::vector<double>>();
    if (r.size() != 2 || !(r[0] >= 0.001) || !(r[1] >= r[0]) || r[1] > 1e7)
      return fail("--blacklist-cooldown-range takes two numbers of seconds, MIN MAX, with 0 < MIN <= MAX "
                  "(MIN at least 0.001)");
    o.blacklist_cooldown = {std::chrono::milliseconds(static_cast<long long>(r[0] * 1000)),
                            std::chrono::milliseconds(static_cast<long long>(r[1] * 1000))};
  }
  auto ri = seconds(vm, "request-interval");
  if (!ri) return Failure{ri.error()};
  o.request_interval = *ri;
  if (vm.count("request-hosts-script")) {
    o.request_hosts_script = vm["request-hosts-script"].as<std::string>();
    if (!o.discovered())
      return fail("--request-hosts-script needs --host-discovery-script or --host-discovery-fd: the hosts it "
                  "obtains reach the job through discovery");
    if (::access(o.request_hosts_script.c_str(), X_OK) != 0)
      return fail(fmt::format("--request-hosts-script '{}': {}", o.request_hosts_script, std::strerror(errno)));
  }
  return {};
}

// A timeout of 1 to 86400 seconds (the range the daemon's Config carries), or 0 for
// off where `zero_is_off`.
Result<std::chrono::milliseconds> timeout_seconds(const po::variables_map& vm, const char* name, bool zero_is_off) {
  double v = vm[name].as<double>();
  if (!((zero_is_off && v == 0) || (v >= 1 && v <= msg::kMaxHostTimeoutMs / 1000)))
    return fail(fmt::format("--{} must be {}a number of seconds from 1 to 86400", name, zero_is_off ? "0 (off) or " : ""));
  return std::chrono::milliseconds(static_cast<long long>(v * 1000));
}

std::string flag_or_env(const po::variables_map& vm, const char* flag, const char* env) {
  if (vm.count(flag)) return vm[flag].as<std::string>();
  const char* v = std::getenv(env);
  return v ? v : "";
}

Result<void> parse_ssh(const po::variables_map& vm, SshOptions& s) {
  if (vm.count("ssh-port") && ((s.port = vm["ssh-port"].as<int>()) < 1 || s.port > 65535))
    return fail(fmt::format("--ssh-port {} out of range 1..65535", s.port));
  s.identity_file = flag_or_env(vm, "ssh-identity-file", env::kSshKey);
  s.known_hosts = flag_or_env(vm, "ssh-known-hosts", env::kSshKnownHosts);
  s.config_file = flag_or_env(vm, "ssh-config", env::kSshConfig);
  std::string check = vm["ssh-host-key-checking"].as<std::string>();
  if (check == "yes") s.host_key_check = HostKeyCheck::yes;
  else if (check == "accept-new") s.host_key_check = HostKeyCheck::accept_new;
  else if (check == "no") s.host_key_check = HostKeyCheck::no;
  else return fail(fmt::format("--ssh-host-key-checking '{}': expected yes, accept-new or no", check));
  auto t = seconds(vm, "ssh-connect-timeout");
  if (!t) return Failure{t.error()};
  s.connect_timeout = *t;
  return {};
}

// The default forwarding policy (env::kForwarded); -x entries come after, and win.
std::vector<std::string> forwarded_environment() {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    std::string_view name = kv.substr(0, eq);
    bool pass = false;
    for (const char* p : env::kForwardedPrefixes) pass = pass || (name.starts_with(p) && name.size() > std::strlen(p));
    for (const char* n : env::kForwarded) pass = pass || name == n;
    if (pass) out.emplace_back(kv);
  }
  return out;
}

Result<void> parse_daemon(const po::variables_map& vm, Options& o) {
  std::string port;
  if (vm.count("daemon-port")) port = std::to_string(vm["daemon-port"].as<int>());
  else if (const char* p = std::getenv(env::kDaemonPort); p && *p) port = p;
  if (!port.empty()) {
    int v = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), v);
    if (ec != std::errc() || end != port.data() + port.size() || v < 1 || v > 65535)
      return fail(fmt::format("--daemon-port '{}' out of range 1..65535", port));
    o.daemon_port = v;
  }
  o.daemon_secret_file = flag_or_env(vm, "daemon-secret-file", env::kDaemonSecretFile);
  if (o.daemon_secret_file.empty()) o.daemon_secret_file = "/etc/elasticrun/secret";
  const std::string launcher = vm["launcher"].as<std::string>();
  const char* job_id = std::getenv("SLURM_JOB_ID");
  if (launcher == "srun" || (launcher == "auto" && job_id && *job_id)) {
    o.launcher = Options::Launcher::srun;
    const char* path = std::getenv("PATH");
    auto srun = find_executable("srun", path ? path : "");
    if (!srun)
      return fail(launcher == "srun" ? "--launcher srun: srun is not in PATH"
                                     : "inside a Slurm allocation (SLURM_JOB_ID is set) but srun is not in PATH: "
                                       "give --launcher ssh");
    o.srun_path = *srun;
  } else if (launcher != "auto" && launcher != "ssh") {
    return fail(fmt::format("--launcher '{}': use auto, ssh or srun", launcher));
  }
  return {};
}

// The checkpoint directory is made absolute (workers start in the driver's directory,
// but not necessarily on its machine) and checked writable here, so that a wrong one
// is a usage error before any worker runs.
Result<void> parse_checkpoint(const po::variables_map& vm, Options& o) {
  o.checkpoint_dir = flag_or_env(vm, "checkpoint-dir", env::kCheckpointDir);
  bool tuned = !vm["checkpoint-every"].defaulted() || !vm["checkpoint-interval"].defaulted() ||
               !vm["preempt-grace"].defaulted();
  if (o.checkpoint_dir.empty()) {
    if (tuned) return fail("--checkpoint-every, --checkpoint-interval and --preempt-grace need --checkpoint-dir");
    return {};
  }
  auto grace = seconds(vm, "preempt-grace", true);
  if (!grace) return Failure{grace.error()};
  if (*grace > std::chrono::milliseconds(msg::kMaxPreemptGraceMs))
    return fail(fmt::format("--preempt-grace must be at most {} seconds", msg::kMaxPreemptGraceMs / 1000));
  o.preempt_grace = *grace;
  o.checkpoint_every = vm["checkpoint-every"].as<long long>();
  if (o.checkpoint_every < 0) return fail("--checkpoint-every must be 0 (not by count) or more commits");
  auto interval = seconds(vm, "checkpoint-interval", true);
  if (!interval) return Failure{interval.error()};
  o.checkpoint_interval = *interval;
  if (o.checkpoint_every == 0 && o.checkpoint_interval.count() == 0)
    return fail("--checkpoint-every 0 and --checkpoint-interval 0: no checkpoint would ever be written");
  std::error_code ec;
  auto abs = std::filesystem::absolute(o.checkpoint_dir, ec);
  if (ec) return fail(fmt::format("--checkpoint-dir '{}': {}", o.checkpoint_dir, ec.message()));
  o.checkpoint_dir = abs.lexically_normal().string();
  if (auto ok = check_writable_dir(o.checkpoint_dir); !ok) return fail("--checkpoint-dir: " + ok.error());
  o.env.push_back(fmt::format("{}={}", env::kCheckpointDir, o.checkpoint_dir));
  o.env.push_back(fmt::format("{}={}", env::kCheckpointEvery, o.checkpoint_every));
  o.env.push_back(fmt::format("{}={}", env::kCheckpointInterval, o.checkpoint_interval.count() / 1000.0));
  return {};
}

// Restart mode and torchrun's run id.
Result<void> parse_restarts(const po::variables_map& vm, Options& o) {
  if (vm.count("max-restarts")) {
    std::string v = vm["max-restarts"].as<std::string>();
    int n = -1;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || end != v.data() + v.size() || n < 0 || n > 1000000)
      return fail(fmt::format("--max-restarts '{}': expected a number of restarts, 0 to 1000000", v));
    if (!vm["reset-limit"].defaulted())
      return fail("give --max-restarts (restart mode) or --reset-limit (elastic jobs that recover in process), not both");
    o.max_restarts = n;
  }
  if (vm.count("run-id")) {
    o.run_id = vm["run-id"].as<std::string>();
    bool ok = !o.run_id.empty() && o.run_id.size() <= 128 &&
              std::all_of(o.run_id.begin(), o.run_id.end(),
                          [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("._:-", c); });
    if (!ok) return fail(fmt::format("--run-id '{}': expected 1 to 128 letters, digits, '.', '_', ':' or '-'", o.run_id));
  }
  return {};
}

// --preload's module names, in order, each once. Whether the command is one the fork
// server can run is the job's to say (a note, not an error: the job runs either way).
Result<void> parse_preload(const po::variables_map& vm, Options& o) {
  if (!vm.count("preload")) return {};
  std::string v = vm["preload"].as<std::string>();
  std::size_t at = 0;
  while (true) {
    auto comma = v.find(',', at);
    std::string name = v.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (!is_dotted_module_name(name))
      return fail(fmt::format("--preload '{}': {} is not a module name (expected dotted Python names, comma-separated: "
                              "torch,torch.distributed)", v, name.empty() ? "an empty name" : "'" + name + "'"));
    if (std::find(o.preload.begin(), o.preload.end(), name) == o.preload.end()) o.preload.push_back(name);
    if (comma == std::string::npos) return {};
    at = comma + 1;
  }
}

// An inherited descriptor, checked now so that a wrong one is a usage error with its
// reason rather than a job whose reports or hosts go nowhere. -1: the option is absent.
Result<int> inherited_fd(const po::variables_map& vm, const char* name, const char* carries) {
  if (!vm.count(name)) return -1;
  std::string v = vm[name].as<std::string>();
  int fd = -1;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), fd);
  if (ec != std::errc() || end != v.data() + v.size() || fd < 0)
    return fail(fmt::format("--{} '{}': expected a file descriptor number", name, v));
  if (fd <= 2) return fail(fmt::format("--{} {}: standard input, output and error cannot carry {}", name, fd, carries));
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail(fmt::format("--{} {}: not an open file descriptor", name, fd));
  return fd;
}

bool stream_socket(int fd) {
  struct stat st {};
  int type = 0;
  socklen_t len = sizeof type;
  return ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 &&
         type == SOCK_STREAM;
}

Result<void> parse_fds(const po::variables_map& vm, Options& o) {
  auto r = inherited_fd(vm, "report-fd", "reports");
  if (!r) return Failure{r.error()};
  if (*r >= 0 && !stream_socket(*r))
    return fail(fmt::format("--report-fd {}: not a stream socket (give one end of a connected socket pair)", *r));
  auto h = inherited_fd(vm, "host-discovery-fd", "host lists");
  if (!h) return Failure{h.error()};
  struct stat st {};
  if (*h >= 0 && !stream_socket(*h) && !(::fstat(*h, &st) == 0 && S_ISFIFO(st.st_mode)))
    return fail(fmt::format("--host-discovery-fd {}: not a pipe or a stream socket", *h));
  if (*h >= 0 && *h == *r) return fail(fmt::format("--host-discovery-fd and --report-fd are both {}: give each a descriptor of its own", *h));
  o.report_fd = *r;
  o.discovery_fd = *h;
  return {};
}

}  // namespace

std::string usage() {
  std::ostringstream s;
  s << "usage: elasticrun [options] [--] command [args...]\n"
       "       elasticrun sweep [options] -- command [args...]   (hyperparameter search: elasticrun sweep --help)\n"
       "A program called 'sweep' runs as: elasticrun -- sweep\n\n"
    << describe();
  return s.str();
}

Result<ParseOutcome> parse_options(int argc, const char* const* argv) {
  const auto& desc = describe();
  bool dashdash = false;
  auto cmd_at = find_command(desc, argc, argv, dashdash);
  if (!cmd_at) return Failure{cmd_at.error()};
  // Rewrite "-np" to "--np" so program_options sees a long option.
  std::vector<std::string> head;
  for (std::size_t i = 1; i < *cmd_at; ++i) {
    std::string a = argv[i];
    if (a == "-np" || a.rfind("-np=", 0) == 0) a = "-" + a;
    head.push_back(a);
  }
  auto parsed = cli::parse(head, desc);
  if (!parsed) return Failure{parsed.error()};
  po::variables_map& vm = *parsed;
  ParseOutcome out;
  if (vm.count("help")) {
    out.print = usage();
    return out;
  }
  if (vm.count("version")) {
    out.print = std::string("elasticrun ") + ELASTICRUN_VERSION + "\n";
    return out;
  }
  Options o;
  for (std::size_t i = *cmd_at + (dashdash ? 1 : 0); i < static_cast<std::size_t>(argc); ++i)
    o.command.emplace_back(argv[i]);
  if (o.command.empty()) return fail("no command given");
  o.slots_per_host = vm["slots-per-host"].as<int>();
  if (o.slots_per_host < 1 || o.slots_per_host > discovery::kMaxSlotsPerHost)
    return fail(fmt::format("--slots-per-host {} out of range 1..{}", o.slots_per_host, discovery::kMaxSlotsPerHost));
  if (vm.count("np")) {
    o.np = vm["np"].as<int>();
    if (o.np < 1) return fail(fmt::format("-np {}: need at least one process", o.np));
  }
  if (auto ok = parse_fds(vm, o); !ok) return Failure{ok.error()};
  if (auto ok = parse_elastic(vm, o); !ok) return Failure{ok.error()};
  if (auto ok = parse_restarts(vm, o); !ok) return Failure{ok.error()};
  if (auto ok = parse_preload(vm, o); !ok) return Failure{ok.error()};
  if (auto ok = parse_ssh(vm, o.ssh); !ok) return Failure{ok.error()};
  if (auto ok = parse_daemon(vm, o); !ok) return Failure{ok.error()};
  if (vm.count("hosts") && vm.count("hostfile")) return fail("give -H or --hostfile, not both");
  if (o.discovered() && (vm.count("hosts") || vm.count("hostfile")))
    return fail(fmt::format("give --host-discovery-{} or -H/--hostfile, not both", o.discovery_fd >= 0 ? "fd" : "script"));
  if (vm.count("hosts")) {
    auto h = discovery::parse_host_list(vm["hosts"].as<std::string>(), o.slots_per_host);
    if (!h) return fail("-H: " + h.error());
    o.hosts = std::move(*h);
  } else if (vm.count("hostfile")) {
    auto h = discovery::read_hostfile(vm["hostfile"].as<std::string>(), o.slots_per_host);
    if (!h) return Failure{h.error()};
    o.hosts = std::move(*h);
  } else if (!o.discovered()) {
    auto slurm = discovery::slurm_allocation([](const char* name) { return std::getenv(name); }, o.slots_per_host);
    if (!slurm) return fail("in a Slurm allocation: " + slurm.error());
    if (*slurm) {
      o.hosts = std::move(**slurm);
      o.slurm_hosts = true;
    } else {
      o.hosts = {{"localhost", o.np > 0 ? o.np : 1}};
    }
  }
  int offered = 0;  // by a fixed host list (-H, --hostfile, the default)
  for (const auto& h : o.hosts) offered += h.slots;
  if (!o.discovered()) {
    if (o.np == 0) o.np = o.elastic ? std::min(offered, o.max_np > 0 ? o.max_np : offered) : offered;
    if (o.np > offered && !o.elastic)
      return fail(fmt::format("-np {} but the hosts offer only {} slots", o.np, offered));
  }
  if (o.elastic) {
    if (o.min_np == 0) o.min_np = std::max(1, o.np);
    if (o.max_np > 0 && o.max_np < o.min_np)
      return fail(fmt::format("--max-np {} is below --min-np {}", o.max_np, o.min_np));
    // A fixed host list never offers more than it does now: waiting --elastic-timeout
    // for slots it cannot have would only delay the same failure.
    if (!o.discovered() && o.min_np > offered)
      return fail(fmt::format("--min-np {} but the hosts offer only {} slots (a fixed host list; give a "
                              "--host-discovery-script for hosts that come later)",
                              o.min_np, offered));
  }
  double st = vm["start-timeout"].as<double>();
  if (!(st > 0 && st < 1e6)) return fail("--start-timeout must be a positive number of seconds");
  o.start_timeout = std::chrono::milliseconds(static_cast<long long>(st * 1000));
  auto ht = timeout_seconds(vm, "host-timeout", false);
  if (!ht) return Failure{ht.error()};
  o.host_timeout = o.ssh.keep_alive = *ht;
  auto wt = timeout_seconds(vm, "worker-timeout", true);
  if (!wt) return Failure{wt.error()};
  o.worker_timeout = *wt;
  if (vm.count("events")) o.events_file = vm["events"].as<std::string>();
  if (vm.count("output-filename")) o.output_dir = vm["output-filename"].as<std::string>();
  if (vm.count("daemon-path")) o.daemon_path = vm["daemon-path"].as<std::string>();
  if (vm.count("verbose")) o.log_level = "info";
  if (vm.count("log-level")) o.log_level = vm["log-level"].as<std::string>();
  o.env = forwarded_environment();
  if (vm.count("env")) {
    auto given = env_entries(vm["env"].as<std::vector<std::string>>());
    if (!given) return Failure{given.error()};
    o.env.insert(o.env.end(), given->begin(), given->end());
  }
  if (auto ok = parse_checkpoint(vm, o); !ok) return Failure{ok.error()};
  return out.options = std::move(o), out;
}

Result<std::vector<std::string>> env_entries(const std::vector<std::string>& given) {
  std::vector<std::string> out;
  for (const auto& v : given) {
    if (v.empty() || v[0] == '=') return fail(fmt::format("-x '{}': expected VAR or VAR=VALUE", v));
    if (v.find('=') != std::string::npos) out.push_back(v);
    else if (const char* val = std::getenv(v.c_str())) out.push_back(v + "=" + val);
  }
  return out;
}

}  // namespace elasticrun::cmd
