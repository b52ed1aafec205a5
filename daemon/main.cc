// elasticrund: the per-host supervisor of training processes.
//
//   elasticrund --stdio      control channel on stdin/stdout (started by elasticrun,
//                            locally or over SSH); exits when the channel closes.
//   elasticrund --listen ADDR:PORT --secret-file FILE
//                            long-running (systemd): serves jobs from drivers that
//                            prove the cluster secret, one job process each.
#include "common/auth.h"
#include "common/cli.h"
#include "common/fd_limit.h"
#include "common/log.h"
#include "common/shm_dirs.h"
#include "daemon/job_records.h"
#include "daemon/listener.h"
#include "daemon/supervisor.h"

#include <boost/asio.hpp>
#include <boost/program_options.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <functional>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

namespace po = boost::program_options;

namespace {

constexpr const char* kUsage =
    "usage: elasticrund --stdio [--log-level LEVEL]\n"
    "       elasticrund --listen [ADDR:]PORT [--secret-file FILE] [--state-dir DIR] [--log-level LEVEL]\n";
constexpr const char* kDefaultSecretFile = "/etc/elasticrun/secret";

int usage_error(const std::string& what) {
  std::cerr << "elasticrund: " << what << "\n" << kUsage;
  return 2;
}

// Reads the pad a listening daemon hands its job process (see Listener).
std::optional<elasticrun::auth::Secret> read_pad(int fd) {
  elasticrun::auth::Secret pad{};
  std::size_t off = 0;
  while (off < pad.size()) {
    ssize_t n = ::read(fd, pad.data() + off, pad.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    off += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return pad;
}

int run_stdio(elasticrun::daemon::SupervisorOptions options) {
  // Reclaim what daemons that died before us left behind (Mesos's recover()).
  elasticrun::shm_dirs::remove_stale();
  boost::asio::io_context io;
  int exit_code = 0;
  // stdin/stdout are the control channel: move them out of the way (close-on-exec),
  // so that nothing else reads or writes there.
  int in = ::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3);
  int out = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (in < 0 || out < 0) {
    std::perror("elasticrund: control channel");
    return 1;
  }
  if (int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC); null >= 0) {
    ::dup2(null, STDIN_FILENO);
    ::close(null);
  }
  ::dup2(STDERR_FILENO, STDOUT_FILENO);
  elasticrun::daemon::Supervisor sup(
      io, in, out,
      [&](int code) {
        exit_code = code;
        io.stop();
      },
      std::move(options));
  // SIGTERM is how schedulers end a job (Slurm's scancel, preemption and time limit
  // signal every step's task: this daemon under srun, not its workers). Where the driver
  // asked for it (Config::preempt_grace_ms) the workers keep running a while, for the
  // job's last checkpoint; a second signal, or any other, stops them at once.
  boost::asio::signal_set signals(io, SIGINT, SIGTERM, SIGHUP);
  std::function<void()> wait_signal = [&] {
    signals.async_wait([&](boost::system::error_code ec, int sig) {
      if (ec) return;
      if (sig == SIGTERM && sup.defer_stop(sig)) return wait_signal();
      ER_LOG(daemon, info, "received signal {}; stopping all workers", sig);
      sup.stop(std::chrono::milliseconds(2000), 128 + sig);
    });
  };
  wait_signal();
  sup.start();
  io.run();
  return exit_code;
}

// "ADDR:PORT", "[V6ADDR]:PORT", ":PORT" or "PORT".
bool parse_listen(const std::string& spec, std::string& addr, std::uint16_t& port) {
  std::string p = spec;
  addr = "0.0.0.0";
  if (auto colon = spec.rfind(':'); colon != std::string::npos) {
    std::string a = spec.substr(0, colon);
    if (a.size() >= 2 && a.front() == '[' && a.back() == ']') a = a.substr(1, a.size() - 2);
    if (!a.empty()) addr = a;
    p = spec.substr(colon + 1);
  }
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) return false;
  unsigned long v = std::stoul(p);
  if (v > 65535) return false;
  port = static_cast<std::uint16_t>(v);
  return true;
}

std::string default_state_dir() {
  if (::geteuid() == 0) return "/run/elasticrund";
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x) return std::string(x) + "/elasticrund";
  return "/tmp/elasticrund-" + std::to_string(::geteuid());
}

// Why the state directory cannot be trusted, or "". Its job records name processes
// that reclaim_jobs kills: a directory another user can write to (one planted as
// /tmp/elasticrund-UID, or a symbolic link there, which its owner can point elsewhere)
// would let that user have any of this user's processes killed.
std::string untrusted_state_dir(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return std::strerror(errno);
  if (S_ISLNK(st.st_mode)) return "it is a symbolic link (name the directory itself)";
  if (!S_ISDIR(st.st_mode)) return "it is not a directory";
  if (st.st_uid != ::geteuid())
    return "it belongs to uid " + std::to_string(st.st_uid) + ", not to this daemon's (" +
           std::to_string(::geteuid()) + ")";
  if (st.st_mode & 077) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return std::string("other users have access to it (mode ") + mode + ")";
  }
  return "";
}

int run_listen(elasticrun::daemon::ListenOptions options, const std::string& secret_file) {
  using namespace elasticrun;
  auto secret = auth::read_secret_file(secret_file);
  if (!secret) {
    std::cerr << "elasticrund: " << secret.error() << "\n";
    return 1;
  }
  options.secret = *secret;
  std::error_code ec;
  std::filesystem::create_directories(options.state_dir, ec);
  ::chmod(options.state_dir.c_str(), 0700);  // fails where it is not ours; checked next
  if (auto why = untrusted_state_dir(options.state_dir); !why.empty()) {
    std::cerr << "elasticrund: refusing state directory '" << options.state_dir << "': " << why << "\n";
    return 1;
  }
  // One listening daemon per state directory: a second would reclaim the first's jobs.
  std::string lock_path = options.state_dir + "/lock";
  int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock < 0) {
    std::cerr << "elasticrund: cannot use state directory '" << options.state_dir << "': " << std::strerror(errno) << "\n";
    return 1;
  }
  if (::flock(lock, LOCK_EX | LOCK_NB) != 0) {
    std::cerr << "elasticrund: another elasticrund --listen uses state directory '" << options.state_dir << "'\n";
    return 1;
  }
  auto reclaimed = daemon::reclaim_jobs(options.state_dir);
  if (reclaimed.jobs > 0)
    ER_LOG(daemon, warn, "reclaimed {} job(s) left by an earlier daemon; killed {} leftover worker group(s)",
           reclaimed.jobs, reclaimed.groups);
  shm_dirs::remove_stale();

  // Job processes run this very binary, even after an upgrade replaced the file.
  options.self_exe = "/proc/self/exe";

  boost::asio::io_context io;
  daemon::Listener listener(io, options);
  if (auto ok = listener.start(); !ok) {
    std::cerr << "elasticrund: " << ok.error() << "\n";
    return 1;
  }
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code e, int sig) {
    if (e) return;
    ER_LOG(daemon, info, "received signal {}; stopping every job", sig);
    listener.stop(std::chrono::milliseconds(5000), [&] { io.stop(); });
  });
  boost::asio::signal_set hup(io, SIGHUP);
  std::function<void()> ignore_hup = [&] {
    hup.async_wait([&](boost::system::error_code e, int) {
      if (e) return;
      ER_LOG(daemon, info, "SIGHUP ignored (restart the daemon to read a new secret)");
      ignore_hup();
    });
  };
  ignore_hup();
  // Signals are handled from here on: one line a supervisor (or a test) can wait for
  // before it signals us. The port is the real one when 0 was asked.
  std::cerr << "elasticrund: listening on " << options.address << ":" << listener.port() << std::endl;
  io.run();
  ::close(lock);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  elasticrun::log::set_program("elasticrund");
  elasticrun::raise_open_file_limit();
  po::options_description desc("elasticrund options");
  desc.add_options()
      ("help,h", "print this help and exit")
      ("version", "print the version and exit")
      ("stdio", "serve one job on stdin/stdout (how elasticrun starts the daemon)")
      ("listen", po::value<std::string>(), "[ADDR:]PORT: serve jobs from drivers that prove the cluster secret")
      ("secret-file", po::value<std::string>(), "the cluster secret (64 hex digits; default /etc/elasticrun/secret)")
      ("state-dir", po::value<std::string>(), "where jobs record their workers (default /run/elasticrund for root)")
      ("job-pad-fd", po::value<int>(), "internal: a job handed over by --listen")
      ("log-level", po::value<std::string>(), "error|warn|info|debug, or per component: info,daemon=debug");
  auto parsed = elasticrun::cli::parse(std::vector<std::string>(argv + 1, argv + argc), desc);
  if (!parsed) return usage_error(parsed.error());
  po::variables_map& vm = *parsed;
  if (vm.count("help")) {
    std::cout << kUsage << desc;
    return 0;
  }
  if (vm.count("version")) {
    std::cout << "elasticrund " << ELASTICRUN_VERSION << "\n";
    return 0;
  }
  std::string log_level = vm.count("log-level") ? vm["log-level"].as<std::string>() : "";
  if (!log_level.empty() && !elasticrun::log::configure(log_level)) {
    std::cerr << "elasticrund: bad --log-level '" << log_level << "'\n";
    return 2;
  }
  std::string state_dir = vm.count("state-dir") ? vm["state-dir"].as<std::string>() : "";
  if (vm.count("stdio") && vm.count("listen")) return usage_error("--stdio and --listen exclude each other");
  if (vm.count("stdio")) {
    elasticrun::daemon::SupervisorOptions options;
    options.state_dir = state_dir;
    if (vm.count("job-pad-fd")) {
      options.secret_pad = read_pad(vm["job-pad-fd"].as<int>());
      if (!options.secret_pad) {
        std::cerr << "elasticrund: --job-pad-fd: cannot read the pad\n";
        return 1;
      }
    }
    return run_stdio(std::move(options));
  }
  if (vm.count("listen")) {
    elasticrun::daemon::ListenOptions options;
    if (!parse_listen(vm["listen"].as<std::string>(), options.address, options.port))
      return usage_error("bad --listen '" + vm["listen"].as<std::string>() + "': want [ADDR:]PORT");
    // A daemon's log is its record of who connected: job starts and ends at info.
    if (log_level.empty()) elasticrun::log::configure("info");
    options.log_level = log_level;
    options.state_dir = state_dir.empty() ? default_state_dir() : state_dir;
    return run_listen(std::move(options), vm.count("secret-file") ? vm["secret-file"].as<std::string>() : kDefaultSecretFile);
  }
  return usage_error("choose a mode (--stdio or --listen)");
}
