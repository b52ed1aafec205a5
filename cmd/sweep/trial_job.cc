#include "cmd/sweep/trial_job.h"

#include "common/log.h"

#include <boost/asio/local/connect_pair.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/write.hpp>
#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <unistd.h>

namespace elasticrun::sweep {

namespace asio = boost::asio;
using namespace std::chrono_literals;

TrialJob::TrialJob(asio::io_context& io, Callbacks cb, std::filesystem::path events)
    : io_(io), cb_(std::move(cb)), reports_(io), hosts_(io), events_timer_(io), events_path_(std::move(events)) {}

TrialJob::~TrialJob() {
  alive_.reset();
  boost::system::error_code ec;
  reports_.close(ec);
  hosts_.close(ec);
  events_timer_.cancel();
  if (child_ && !child_->reaped()) child_->signal(SIGTERM);
  // ChildProcess's destructor kills it (SIGKILL) if it is still there, and reaps it.
}

Result<std::unique_ptr<TrialJob>> TrialJob::start(asio::io_context& io, const TrialLaunch& launch, Callbacks cb) {
  std::unique_ptr<TrialJob> t(new TrialJob(io, std::move(cb), launch.dir / "events.jsonl"));
  asio::local::stream_protocol::socket theirs(io);
  boost::system::error_code ec;
  asio::local::connect_pair(t->reports_, theirs, ec);
  if (ec) return fail("socketpair: " + ec.message());
  int feed[2];
  if (::pipe2(feed, O_CLOEXEC) != 0) return fail(fmt::format("pipe: {}", std::strerror(errno)));
  t->hosts_.assign(feed[1]);
  std::string output = (launch.dir / "output.log").string();
  int out = ::open(output.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (out < 0) return fail(fmt::format("cannot open {}", output));
  std::error_code fec;
  t->events_offset_ = std::filesystem::exists(t->events_path_) ? std::filesystem::file_size(t->events_path_, fec) : 0;
  ChildSpec spec;
  spec.program = launch.program;
  spec.argv = {launch.program};
  spec.argv.insert(spec.argv.end(), launch.args.begin(), launch.args.end());
  // The job's own options end where the command begins: put ours first.
  spec.argv.insert(spec.argv.begin() + 1,
                   {"--report-fd", "3", "--host-discovery-fd", "4", "--events", t->events_path_.string()});
  spec.env = launch.env;
  spec.in = ChildSpec::Stdio::null;
  spec.fds = {{1, out}, {2, out}, {3, theirs.native_handle()}, {4, feed[0]}};
  spec.death_signal = SIGTERM;  // the job then stops its workers
  // In the sweep's process group (^C in a terminal reaches every job), not one of its
  // own: killing the job must not kill its local daemons with it, which get their death
  // signal (SIGTERM) instead, stop their workers and remove their shared memory.
  spec.own_group = false;
  TrialJob* self = t.get();
  std::weak_ptr<char> alive = t->alive_;
  auto child = ChildProcess::start(io, spec, [self, alive](int, int status) {
    if (alive.expired()) return;
    self->read_new_events();  // its last events come before its end
    if (self->cb_.on_exit) self->cb_.on_exit(status);
  });
  ::close(out);
  ::close(feed[0]);
  theirs.close(ec);
  if (!child) return fail(fmt::format("cannot start {}: {}", launch.program, child.error()));
  t->child_ = std::move(*child);
  t->read_reports();
  t->follow_events();
  t->send_hosts(launch.hosts);  // in the pipe before the job reads it
  return t;
}

void TrialJob::read_reports() {
  std::weak_ptr<char> alive = alive_;
  asio::async_read_until(reports_, in_, '\n', [this, alive](boost::system::error_code ec, std::size_t n) {
    if (alive.expired() || ec) return;  // EOF: the job is ending; its exit follows
    std::string line(asio::buffers_begin(in_.data()), asio::buffers_begin(in_.data()) + static_cast<long>(n));
    in_.consume(n);
    nlohmann::json report;
    try {
      report = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      ER_LOG(driver, warn, "a trial job sent a report that is not JSON: {}", e.what());
      return read_reports();
    }
    if (cb_.on_report) cb_.on_report(report);  // may destroy us
    if (!alive.expired()) read_reports();
  });
}

void TrialJob::answer(std::int64_t step, bool stop) {
  auto line = std::make_shared<std::string>(
      nlohmann::json{{"step", step}, {"decision", stop ? "stop" : "continue"}}.dump() + "\n");
  asio::async_write(reports_, asio::buffer(*line), [line](boost::system::error_code, std::size_t) {});
}

void TrialJob::send_hosts(const std::string& hosts) {
  hosts_next_ = hosts + "\n";  // the empty line that ends a list
  if (hosts_out_.empty()) write_hosts();
}

void TrialJob::write_hosts() {
  hosts_out_ = std::exchange(hosts_next_, {});
  if (hosts_out_.empty()) return;
  std::weak_ptr<char> alive = alive_;
  asio::async_write(hosts_, asio::buffer(hosts_out_), [this, alive](boost::system::error_code ec, std::size_t) {
    if (alive.expired()) return;
    hosts_out_.clear();
    // A job that has ended reads no more: its exit is reported on its own.
    if (!ec) write_hosts();
  });
}

void TrialJob::terminate() const {
  if (child_ && !child_->reaped()) child_->signal(SIGTERM);
}

void TrialJob::follow_events() {
  std::weak_ptr<char> alive = alive_;
  events_timer_.expires_after(250ms);
  events_timer_.async_wait([this, alive](boost::system::error_code ec) {
    if (alive.expired() || ec) return;
    read_new_events();
    if (!alive.expired()) follow_events();
  });
}

void TrialJob::read_new_events() {
  std::ifstream in(events_path_, std::ios::binary);
  if (!in) return;
  in.seekg(static_cast<std::streamoff>(events_offset_));
  std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  events_offset_ += chunk.size();
  events_partial_ += chunk;
  std::weak_ptr<char> alive = alive_;
  std::size_t start = 0;
  for (std::size_t nl; (nl = events_partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string line = events_partial_.substr(start, nl - start);
    try {
      auto ev = nlohmann::json::parse(line);
      if (cb_.on_event) cb_.on_event(ev);
    } catch (const nlohmann::json::exception&) {
    }
    if (alive.expired()) return;
  }
  events_partial_.erase(0, start);
}

}  // namespace elasticrun::sweep
