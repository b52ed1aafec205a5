#include "cmd/host_requests.h"

#include <boost/asio/post.hpp>

namespace elasticrun::cmd {

std::optional<RequestAction> RequestPolicy::next(RequestClock::time_point now, const RequestView& v) {
  // Which offered hosts have been unused, and since when.
  for (auto it = unused_since_.begin(); it != unused_since_.end();)
    it = v.offered.count(it->first) && !v.in_use.count(it->first) ? std::next(it) : unused_since_.erase(it);
  if (v.running)
    for (const auto& h : v.offered)
      if (!v.in_use.count(h)) unused_since_.emplace(h, now);
  if (!v.running) return std::nullopt;

  auto due = [&](const std::optional<RequestClock::time_point>& last) { return !last || now - *last >= interval_; };
  if (v.max_np > 0 && v.usable_slots < v.max_np && due(last_request_)) {
    last_request_ = now;
    return RequestAction{RequestAction::Kind::request, v.max_np - v.usable_slots, {}};
  }
  std::vector<std::string> idle;
  for (const auto& [host, since] : unused_since_)
    if (now - since >= interval_) idle.push_back(host);
  if (!idle.empty() && due(last_release_)) {
    last_release_ = now;
    return RequestAction{RequestAction::Kind::release, 0, std::move(idle)};
  }
  return std::nullopt;
}

HostRequester::HostRequester(boost::asio::io_context& io, std::string script, std::chrono::milliseconds interval,
                             std::chrono::milliseconds timeout, Done on_done)
    : io_(io), script_(std::move(script)), timeout_(timeout), policy_(interval), on_done_(std::move(on_done)) {}

HostRequester::~HostRequester() { stop(); }

void HostRequester::stop() {
  stopped_ = true;
  if (running_) running_->cancel();
  running_.reset();
}

void HostRequester::tick(const RequestView& v) {
  if (stopped_ || running_) return;
  auto action = policy_.next(RequestClock::now(), v);
  if (!action) return;
  discovery::ScriptOptions so{.path = script_, .timeout = timeout_, .max_output = 64 << 10,
                              .what = "request-hosts script", .hosts_output = false};
  if (action->kind == RequestAction::Kind::request) {
    so.args = {"request", std::to_string(action->slots)};
  } else {
    so.args = {"release"};
    so.args.insert(so.args.end(), action->hosts.begin(), action->hosts.end());
  }
  running_ = discovery::make_script_source(io_, so);
  running_->poll([this, a = *action](Result<std::vector<discovery::Host>> r) {
    // The source may not be destroyed inside its own callback: after it returns.
    boost::asio::post(io_, [src = std::shared_ptr<discovery::HostSource>(std::move(running_))] {});
    if (!stopped_) on_done_(a, r ? std::string() : r.error());
  });
}

}  // namespace elasticrun::cmd
