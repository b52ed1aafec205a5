// The discovery-script host source: runs the user's program, reads what it prints, and
// turns every way it can go wrong into a message instead of a hang or a crash.
//
// How one poll runs:
//  - the script starts in its own process group, stdin from /dev/null, stdout and
//    stderr on async pipes read on the io_context;
//  - it ends when the script has exited AND both pipes reached EOF; when the script
//    exits, whatever it left running in its group is killed, so a forgotten background
//    child cannot hold the pipes open;
//  - a deadline, an output cap or cancel() kill the whole group (SIGKILL to -pgid).
// common/child_process.h starts and reaps the script (by its own pid: other parts of the
// driver have children too).
#include "discovery/host_source.h"
#include "discovery/script_output.h"

#include "common/child_process.h"
#include "common/log.h"

#include <boost/asio.hpp>

#include <fmt/format.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace elasticrun::discovery {
namespace {

namespace asio = boost::asio;

constexpr std::size_t kStderrTail = 1024;

// What the script's exit status means, or an empty string for exit 0.
std::string status_text(int status) {
  if (WIFSIGNALED(status))
    return fmt::format("killed by signal {} ({})", WTERMSIG(status), ::strsignal(WTERMSIG(status)));
  if (WEXITSTATUS(status) != 0) return fmt::format("exited with code {}", WEXITSTATUS(status));
  return {};
}

// The end of stderr, on one line, without bytes that would garble a log.
std::string stderr_excerpt(const std::string& tail, bool cut) {
  std::string s;
  for (char c : tail) s += c == '\n' ? ' ' : (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  while (!s.empty() && s.back() == ' ') s.pop_back();
  if (s.empty()) return {};
  return fmt::format(": {}{}", cut ? "..." : "", s);
}

Result<void> check_executable(const std::string& path, const std::string& what) {
  struct stat st {};
  if (path.empty()) return fail("no " + what + " given");
  if (::stat(path.c_str(), &st) != 0) return fail(fmt::format("{} '{}': {}", what, path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) return fail(fmt::format("{} '{}' is not a regular file", what, path));
  if (::access(path.c_str(), X_OK) != 0) return fail(fmt::format("{} '{}' is not executable", what, path));
  return {};
}

// One poll in flight. Handlers hold it by shared_ptr, so its buffers outlive them;
// once `finished` is set they return without touching the source, which may be gone.
// The script itself belongs to the source (child_), not to the run.
struct Run {
  explicit Run(asio::io_context& io) : out(io), err(io), deadline(io) {}
  asio::posix::stream_descriptor out, err;
  asio::steady_timer deadline;
  std::array<char, 16384> obuf{}, ebuf{};
  std::string output, stderr_tail;
  bool stderr_cut = false;
  int open_pipes = 2;
  bool exited = false;
  int status = 0;
  bool finished = false;
  HostSource::Done done;
};

class ScriptSource final : public HostSource {
 public:
  ScriptSource(asio::io_context& io, ScriptOptions opt) : io_(io), opt_(std::move(opt)) {}
  ~ScriptSource() override;
  void poll(Done done) override;
  void cancel() override {
    ++*gen_;
    abandon();
  }

 private:
  void answer_later(Done done, Result<std::vector<Host>> r);
  Result<void> launch(Run& run);
  void read(const std::shared_ptr<Run>& run, bool is_stdout);
  void on_bytes(Run& run, bool is_stdout, std::size_t n);
  void on_exit(int status);
  void maybe_complete();
  void finish(Result<std::vector<Host>> r);
  void abandon();
  Result<std::vector<Host>> outcome(const Run& run) const;

  asio::io_context& io_;
  ScriptOptions opt_;
  std::shared_ptr<Run> run_;
  std::unique_ptr<ChildProcess> child_;  // the current run's script
  std::vector<std::unique_ptr<ChildProcess>> zombies_;  // killed, not reaped yet
  std::shared_ptr<std::uint64_t> gen_ = std::make_shared<std::uint64_t>(0);  // of answers posted early
};

// Destroying the killed scripts' handles reaps them (waiting a little, never long).
ScriptSource::~ScriptSource() { cancel(); }

void ScriptSource::answer_later(Done done, Result<std::vector<Host>> r) {
  // cancel() must drop this answer too: it bumps the generation.
  asio::post(io_, [gen = gen_, mine = *gen_, done = std::move(done), r = std::move(r)]() mutable {
    if (*gen == mine) done(std::move(r));
  });
}

void ScriptSource::poll(Done done) {
  if (run_) return answer_later(std::move(done), fail("a discovery poll is already running"));
  if (auto ok = check_executable(opt_.path, opt_.what); !ok) return answer_later(std::move(done), Failure{ok.error()});
  auto run = std::make_shared<Run>(io_);
  if (auto started = launch(*run); !started) return answer_later(std::move(done), Failure{started.error()});
  run->done = std::move(done);
  run_ = run;
  read(run, true);
  read(run, false);
  run->deadline.expires_after(opt_.timeout);
  run->deadline.async_wait([this, run](boost::system::error_code ec) {
    if (ec || run->finished) return;
    finish(fail(fmt::format("{} timed out after {:.1f} s", opt_.what, opt_.timeout.count() / 1000.0)));
  });
}

// Starts the script: its own group (so that a timeout kills its children too), dying
// with the driver, stdin from /dev/null, no descriptor of ours.
Result<void> ScriptSource::launch(Run& run) {
  ChildSpec spec;
  spec.program = opt_.path;
  spec.argv = {opt_.path};
  spec.argv.insert(spec.argv.end(), opt_.args.begin(), opt_.args.end());
  spec.in = ChildSpec::Stdio::null;
  spec.out = spec.err = ChildSpec::Stdio::pipe;
  // Leftovers of a finished script are killed: nothing may hold its pipes open.
  spec.kill_group_on_exit = true;
  int error = 0;
  // A killed script of an earlier poll is reaped later: only the current one counts.
  auto on_exit = [this](int pid, int status) {
    if (child_ && child_->pid() == pid) this->on_exit(status);
  };
  auto child = ChildProcess::start(io_, spec, on_exit, &error);
  if (!child)
    // The file exists (checked before), so ENOENT means its "#!" interpreter does not.
    return fail(fmt::format("cannot run {} '{}': {}{}", opt_.what, opt_.path,
                            error ? std::strerror(error) : child.error(),
                            error == ENOENT ? " (is its #! interpreter missing?)" : ""));
  child_ = std::move(*child);
  run.out.assign(child_->take_pipe(1).release());
  run.err.assign(child_->take_pipe(2).release());
  return {};
}

void ScriptSource::read(const std::shared_ptr<Run>& run, bool is_stdout) {
  auto& pipe = is_stdout ? run->out : run->err;
  auto& buf = is_stdout ? run->obuf : run->ebuf;
  pipe.async_read_some(asio::buffer(buf), [this, run, is_stdout](boost::system::error_code ec, std::size_t n) {
    if (run->finished) return;
    on_bytes(*run, is_stdout, n);
    if (run->finished) return;  // the output cap ended the poll
    if (ec) {
      --run->open_pipes;
      maybe_complete();
      return;
    }
    read(run, is_stdout);
  });
}

void ScriptSource::on_bytes(Run& run, bool is_stdout, std::size_t n) {
  if (n == 0) return;
  if (!is_stdout) {
    run.stderr_tail.append(run.ebuf.data(), n);
    if (run.stderr_tail.size() > 2 * kStderrTail) {  // trim in batches, not on every read
      run.stderr_tail.erase(0, run.stderr_tail.size() - kStderrTail);
      run.stderr_cut = true;
    }
    return;
  }
  if (run.output.size() + n > opt_.max_output)
    return finish(fail(fmt::format("{} output exceeds {} (script killed)", opt_.what, human_size(opt_.max_output))));
  run.output.append(run.obuf.data(), n);
}

void ScriptSource::on_exit(int status) {
  if (!run_) return;
  run_->exited = true;
  run_->status = status;
  maybe_complete();
}

void ScriptSource::maybe_complete() {
  if (!run_ || !run_->exited || run_->open_pipes > 0) return;
  finish(outcome(*run_));
}

Result<std::vector<Host>> ScriptSource::outcome(const Run& run) const {
  if (auto st = status_text(run.status); !st.empty())
    return fail(fmt::format("{} {}{}", opt_.what, st, stderr_excerpt(run.stderr_tail, run.stderr_cut)));
  if (!opt_.hosts_output) return std::vector<Host>{};
  auto parsed = parse_script_output(run.output, opt_.default_slots);
  if (!parsed) return fail("discovery script output, " + parsed.error());
  if (!parsed->merged.empty())
    ER_LOG(discovery, debug, "discovery script listed {} more than once; their slots were added up",
           fmt::join(parsed->merged, ", "));
  return std::move(parsed->hosts);
}

// Ends the current poll with `r`. The source is ready for the next poll before the
// callback runs, because the callback may well start one.
void ScriptSource::finish(Result<std::vector<Host>> r) {
  auto run = run_;
  if (!run) return;
  Done done = std::move(run->done);
  abandon();
  if (done) done(std::move(r));
}

// Stops the current poll without answering: kills the group if it still runs (keeping
// its handle, which reaps it, until it has), closes the pipes, and forgets the run.
void ScriptSource::abandon() {
  auto run = std::move(run_);
  if (!run) return;
  run->finished = true;
  std::erase_if(zombies_, [](const auto& z) { return z->reaped(); });
  if (child_ && !child_->reaped()) {
    child_->signal_group(SIGKILL);
    zombies_.push_back(std::move(child_));
  }
  child_.reset();
  boost::system::error_code ec;
  run->out.close(ec);
  run->err.close(ec);
  run->deadline.cancel();
}

}  // namespace

std::unique_ptr<HostSource> make_script_source(boost::asio::io_context& io, ScriptOptions options) {
  return std::make_unique<ScriptSource>(io, std::move(options));
}

}  // namespace elasticrun::discovery
