// HostWatcher: polls a HostSource on a schedule and turns answers into change reports.
//
// Lifetime rule: every asynchronous handler captures a weak reference to `alive_` and
// returns at once if the watcher is gone, and every user callback may destroy or stop
// the watcher, so after calling one we check again before touching members.
#include "discovery/host_source.h"

#include "common/log.h"

#include <fmt/format.h>

namespace elasticrun::discovery {
namespace {

std::string describe(const std::vector<Host>& hosts) {
  std::string s;
  for (const auto& h : hosts) s += fmt::format("{}{}:{}", s.empty() ? "" : ",", h.name, h.slots);
  return s.empty() ? "(none)" : s;
}

bool power_of_two(std::uint64_t n) { return n != 0 && (n & (n - 1)) == 0; }

}  // namespace

HostWatcher::HostWatcher(boost::asio::io_context& io, std::unique_ptr<HostSource> source,
                         std::chrono::milliseconds interval, Callbacks callbacks)
    : io_(io), source_(std::move(source)), interval_(interval), cb_(std::move(callbacks)), timer_(io) {}

HostWatcher::~HostWatcher() { stop(); }

void HostWatcher::start() {
  if (running_) return;
  running_ = true;
  poll_once();
}

void HostWatcher::stop() {
  running_ = false;
  again_ = false;
  ++timer_gen_;
  timer_.cancel();
  if (polling_) source_->cancel();  // drops the callback: on_result will not run
  polling_ = false;
}

void HostWatcher::poll_now() {
  if (!running_) return;
  poll_once();
}

void HostWatcher::poll_once() {
  if (polling_) {
    again_ = true;  // one extra poll after this one is enough, however many were asked
    return;
  }
  ++timer_gen_;  // a timer handler already queued must not start a second poll
  timer_.cancel();
  polling_ = true;
  source_->poll([this, alive = std::weak_ptr<char>(alive_)](Result<std::vector<Host>> r) {
    if (alive.expired()) return;
    on_result(std::move(r));
  });
}

void HostWatcher::on_result(Result<std::vector<Host>> r) {
  polling_ = false;
  if (!running_) return;
  std::weak_ptr<char> alive = alive_;
  if (!r) {
    if (!have_good_) {
      // Without one good answer there is nothing to fall back on: the job cannot start.
      running_ = false;
      ER_LOG(discovery, error, "first host discovery failed: {}", r.error());
      if (cb_.on_fatal) cb_.on_fatal(r.error());
      return;
    }
    report_error(r.error());
    if (alive.expired()) return;
  } else {
    if (repeats_ > 0)
      ER_LOG(discovery, info, "host discovery works again after {} failed poll(s)", repeats_);
    last_error_.clear();
    repeats_ = 0;
    if (!have_good_ || *r != current_) {
      ER_LOG(discovery, info, "hosts {}: {}", have_good_ ? "changed" : "found", describe(*r));
      current_ = std::move(*r);
      have_good_ = true;
      if (cb_.on_change) cb_.on_change(current_);
      if (alive.expired()) return;
    }
  }
  schedule_next();
}

// A script that keeps failing the same way would fill the log at one line per
// interval; log the 1st, 2nd, 4th, 8th... repeat instead, but tell the caller each time.
void HostWatcher::report_error(const std::string& why) {
  if (why == last_error_) {
    ++repeats_;
  } else {
    last_error_ = why;
    repeats_ = 1;
  }
  if (power_of_two(repeats_))
    ER_LOG(discovery, warn, "host discovery failed{}, keeping {}: {}",
           repeats_ > 1 ? fmt::format(" ({} times in a row)", repeats_) : "", describe(current_), why);
  if (cb_.on_error) cb_.on_error(why);
}

void HostWatcher::schedule_next() {
  if (!running_) return;
  if (again_) {
    again_ = false;
    poll_once();
    return;
  }
  std::uint64_t gen = ++timer_gen_;
  timer_.expires_after(interval_);
  timer_.async_wait([this, gen, alive = std::weak_ptr<char>(alive_)](boost::system::error_code ec) {
    if (ec || alive.expired() || gen != timer_gen_ || !running_) return;
    poll_once();
  });
}

}  // namespace elasticrun::discovery
