#include "common/child_process.h"

#include <boost/asio/signal_set.hpp>
#include <boost/process/child.hpp>
#include <boost/process/error.hpp>
#include <boost/process/extend.hpp>
#include <fcntl.h>
#include <fmt/format.h>
#include <linux/close_range.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

namespace elasticrun {
namespace {

namespace asio = boost::asio;
namespace bp = boost::process;

constexpr std::size_t kMaxMappedFds = 16;
// How long a destroyed handle waits for the child it killed.
constexpr std::chrono::milliseconds kReapLimit{1000};

// What failed in the child, sent to the parent through a close-on-exec pipe: end of
// file there means that exec succeeded.
enum Step : int { kDescriptors = 1, kChdir, kExec };
struct ChildError {
  int step = 0, err = 0;
};

// Everything the child needs, made before fork: after it, only async-signal-safe calls.
struct Plan {
  std::vector<std::string> argv_strings, env_strings;
  std::vector<char*> argv, envp;
  std::vector<std::pair<int, int>> fds;  // {child's number, our descriptor}
  std::vector<UniqueFd> child_ends;      // pipe ends and /dev/null, closed once it started
  int high = 3;                          // temporaries and the error pipe go at or above
};

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> p;
  for (auto& s : strings) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

[[noreturn]] void fail_child(int report, int step, int err) {
  ChildError e{step, err};
  [[maybe_unused]] auto n = ::write(report, &e, sizeof e);
  ::_exit(127);
}

// Default dispositions for every signal but those ignored (exec keeps those ignored;
// SIGPIPE goes back to its default all the same, as a fresh program expects it).
void default_signals() {
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction sa {};
    if (::sigaction(sig, nullptr, &sa) != 0) continue;
    if (sa.sa_handler == SIG_IGN && sig != SIGPIPE) continue;
    sa = {};
    sa.sa_handler = SIG_DFL;
    ::sigaction(sig, &sa, nullptr);
  }
}

// Moves the named descriptors to their numbers and marks every other one above stderr
// close-on-exec (not closed: the error pipe must stay open until exec). Sources go to
// temporaries first, so that one mapping cannot overwrite the source of another.
bool map_descriptors(const std::vector<std::pair<int, int>>& fds, int high) {
  int tmp[kMaxMappedFds];
  for (std::size_t i = 0; i < fds.size(); ++i)
    if ((tmp[i] = ::fcntl(fds[i].second, F_DUPFD_CLOEXEC, high)) < 0) return false;
  if (::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC) != 0) {  // kernels before 5.11
    rlimit rl{};
    rlim_t top = ::getrlimit(RLIMIT_NOFILE, &rl) == 0 ? std::min<rlim_t>(rl.rlim_cur, 1u << 20) : 4096;
    for (rlim_t fd = 3; fd < top; ++fd) ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  }
  for (std::size_t i = 0; i < fds.size(); ++i)
    if (::dup2(tmp[i], fds[i].first) < 0) return false;
  return true;
}

// Adds the stdio redirection of `which` (0, 1, 2) to the plan; a pipe's other end goes to `ours`.
Result<void> plan_stdio(Plan& p, int which, ChildSpec::Stdio how, UniqueFd& ours) {
  if (how == ChildSpec::Stdio::inherit) return {};
  if (how == ChildSpec::Stdio::null) {
    UniqueFd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
    if (!null) return fail(fmt::format("cannot open /dev/null: {}", std::strerror(errno)));
    p.fds.emplace_back(which, null.get());
    p.child_ends.push_back(std::move(null));
    return {};
  }
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) return fail(fmt::format("pipe(2) failed: {}", std::strerror(errno)));
  UniqueFd r(ends[0]), w(ends[1]);
  bool child_reads = which == 0;
  p.fds.emplace_back(which, child_reads ? r.get() : w.get());
  p.child_ends.push_back(child_reads ? std::move(r) : std::move(w));
  ours = child_reads ? std::move(w) : std::move(r);
  return {};
}

// KEY=VALUE entries, a later one overriding an earlier one of the same key in its place;
// entries without a key are dropped.
std::vector<std::string> merged_env(const std::vector<std::string>& entries) {
  std::vector<std::string> out;
  std::map<std::string, std::size_t, std::less<>> index;
  for (const auto& kv : entries) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    auto [it, fresh] = index.emplace(kv.substr(0, eq), out.size());
    if (fresh) out.push_back(kv);
    else out[it->second] = kv;
  }
  return out;
}

Result<Plan> make_plan(const ChildSpec& spec, UniqueFd (&ours)[3]) {
  Plan p;
  p.argv_strings = spec.argv.empty() ? std::vector<std::string>{spec.program} : spec.argv;
  p.argv = pointers(p.argv_strings);
  if (spec.env) {
    p.env_strings = merged_env(*spec.env);
    p.envp = pointers(p.env_strings);
  }
  ChildSpec::Stdio stdio[3] = {spec.in, spec.out, spec.err};
  for (int i = 0; i < 3; ++i)
    if (auto ok = plan_stdio(p, i, stdio[i], ours[i]); !ok) return Failure{ok.error()};
  p.fds.insert(p.fds.end(), spec.fds.begin(), spec.fds.end());
  if (p.fds.size() > kMaxMappedFds) return fail("too many descriptors for a child");
  for (auto& [child_fd, fd] : p.fds) p.high = std::max(p.high, child_fd + 1);
  return p;
}

std::string step_text(const ChildError& e) {
  const char* what = e.step == kExec ? "execve failed" : e.step == kChdir ? "chdir failed" : "dup2 failed";
  return fmt::format("{}: {}", what, std::strerror(e.err));
}

// Boost.Process forks and execs; this handler does the rest, as its executor
// (boost/process/detail/posix/executor.hpp in 1.74) calls it:
//  - on_setup, in the parent before fork: the program, argv and environment, from the
//    plan. Not bp::exe and bp::args, which make argv[0] the program's path, nor bp::env,
//    whose key compare reads past shorter entries (AddressSanitizer: heap overflow).
//  - on_exec_setup, in the child: everything else, async-signal-safe only (the executor
//    does nothing of its own between fork and this). Then the executor calls execve.
//  - on_exec_error, in the child when execve failed: reports it through our pipe and
//    exits before the executor would write its own report.
//  - on_fork_error, in the parent: keeps the errno.
// The spawn runs with bp::ignore_error, so the executor makes no error pipe of its own:
// its write end could be a number that a named descriptor is dup2'd onto (its report
// would then go into that descriptor), and ours sits above every named number.
// Stdio goes through the same dup2s as the named descriptors, one mapping for all.
class Spawn : public bp::extend::handler {
 public:
  Spawn(const ChildSpec& spec, Plan& plan, int report) : spec_(spec), plan_(plan), report_(report) {}
  int fork_errno() const { return fork_errno_; }

  template <class Executor>
  void on_setup(Executor& exec) const {
    exec.exe = spec_.program.c_str();
    exec.cmd_line = plan_.argv.data();
    if (spec_.env) exec.env = plan_.envp.data();
  }
  template <class Executor>
  void on_fork_error(Executor&, const std::error_code& ec) const {
    fork_errno_ = ec.value();
  }
  template <class Executor>
  void on_exec_setup(Executor&) const {
    if (spec_.own_group) ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, spec_.death_signal);
    if (::getppid() != parent_) ::_exit(1);  // the parent died before prctl: nobody to die with
    default_signals();
    if (!map_descriptors(plan_.fds, plan_.high)) fail_child(report_, kDescriptors, errno);
    if (!spec_.cwd.empty() && ::chdir(spec_.cwd.c_str()) != 0) fail_child(report_, kChdir, errno);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
  }
  template <class Executor>
  void on_exec_error(Executor&, const std::error_code& ec) const {
    fail_child(report_, kExec, ec.value());
  }

 private:
  const ChildSpec& spec_;
  Plan& plan_;
  int report_;
  pid_t parent_ = ::getpid();
  mutable int fork_errno_ = 0;
};

// Forks and execs through Boost.Process; the child's pid, or -1 if fork failed.
//
// The bp::child is detached at once, so that reaping stays ours, by pid. In 1.74 an
// attached bp::child's destructor asks running(), which is waitpid(pid, WNOHANG) (it
// would take the status), then terminate()s it. Spawning itself neither waits nor
// touches SIGCHLD: that is done only by bp::on_exit (an asio::signal_set on SIGCHLD,
// sigchld_service.hpp), bp::child::wait_for (swaps the SIGCHLD handler,
// wait_for_exit.hpp), bp::group::wait (waitpid(-pgid)), bp::posix::sig and bp::spawn
// (SIGCHLD ignored), none used here. Without bp::posix::use_vfork it forks.
int spawn(Spawn& setup) {
  // No handler of ours may run in the child between fork and exec.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  struct Restore {
    sigset_t& old;
    ~Restore() { ::pthread_sigmask(SIG_SETMASK, &old, nullptr); }
  } restore{old};
  bp::child child(setup, bp::ignore_error);
  child.detach();
  return child.id();
}

// What the child reported through `report` once it exec'd (end of file) or failed.
std::optional<ChildError> read_report(int report) {
  ChildError e;
  ssize_t n;
  while ((n = ::read(report, &e, sizeof e)) < 0 && errno == EINTR) {
  }
  if (n == static_cast<ssize_t>(sizeof e)) return e;
  return std::nullopt;
}

}  // namespace

// Reaps the child on SIGCHLD. Its handlers hold it, not the ChildProcess: a handler
// already queued when the ChildProcess is destroyed finds `owner` null.
struct ChildProcess::Watch : std::enable_shared_from_this<Watch> {
  explicit Watch(asio::io_context& io) : sigchld(io, SIGCHLD) {}
  asio::signal_set sigchld;
  ChildProcess* owner = nullptr;
  OnExit on_exit;

  void arm() {
    sigchld.async_wait([self = shared_from_this()](boost::system::error_code ec, int) {
      if (ec || !self->owner) return;
      if (!self->owner->try_reap()) return self->arm();
      auto done = std::move(self->on_exit);  // it may destroy the ChildProcess
      if (done) done(self->owner->pid_, *self->owner->status_);
    });
  }
};

Result<std::unique_ptr<ChildProcess>> ChildProcess::start(asio::io_context& io, const ChildSpec& spec, OnExit on_exit,
                                                          int* error) {
  UniqueFd ours[3];
  auto plan = make_plan(spec, ours);
  if (!plan) return Failure{plan.error()};
  int report_ends[2];
  if (::pipe2(report_ends, O_CLOEXEC) != 0) return fail(fmt::format("pipe(2) failed: {}", std::strerror(errno)));
  UniqueFd report_r(report_ends[0]), report_w(::fcntl(report_ends[1], F_DUPFD_CLOEXEC, plan->high));
  ::close(report_ends[1]);
  if (!report_w) return fail(fmt::format("fcntl failed: {}", std::strerror(errno)));
  // Watching SIGCHLD before fork, so that an exit at once is not missed.
  auto watch = std::make_shared<Watch>(io);
  Spawn setup(spec, *plan, report_w.get());
  int pid = spawn(setup);
  if (pid < 0) return fail(fmt::format("fork failed: {}", std::strerror(setup.fork_errno())));
  report_w.reset();
  plan->child_ends.clear();
  if (auto e = read_report(report_r.get())) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (error) *error = e->err;
    return fail(step_text(*e));
  }
  std::unique_ptr<ChildProcess> child(new ChildProcess(pid, spec));
  for (int i = 0; i < 3; ++i) child->pipes_[i] = std::move(ours[i]);
  child->watch_ = std::move(watch);
  child->watch_->owner = child.get();
  child->watch_->on_exit = std::move(on_exit);
  child->watch_->arm();
  return child;
}

ChildProcess::~ChildProcess() {
  watch_->owner = nullptr;
  boost::system::error_code ec;
  watch_->sigchld.cancel(ec);
  if (reaped()) return;
  signal_group(SIGKILL);
  wait_for(kReapLimit);
}

UniqueFd ChildProcess::take_pipe(int child_fd) { return std::move(pipes_[child_fd]); }

void ChildProcess::signal(int sig) const {
  if (!reaped()) ::kill(pid_, sig);
}

void ChildProcess::signal_group(int sig) const {
  if (group_) ::kill(-pid_, sig);
  else signal(sig);
}

bool ChildProcess::try_reap() {
  if (status_) return true;
  if (kill_group_) {
    siginfo_t info{};
    if (::waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_) ::kill(-pid_, SIGKILL);
  }
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) status_ = status;
  // Somebody else reaped it (they should not): its status is lost; take it for killed.
  else if (r < 0 && errno == ECHILD) status_ = SIGKILL;
  return status_.has_value();
}

std::optional<int> ChildProcess::wait_for(std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!try_reap() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return status_;
}

}  // namespace elasticrun
