#include "discovery/host_lookup.h"

#include <boost/asio/post.hpp>

#include <mutex>
#include <thread>
#include <utility>

namespace elasticrun::discovery {


// What the lookup threads share with the owner. `owner` is touched only on the
// io_context's thread (the handlers and the destructor run there); `alive`, `todo` and
// `running` under the mutex. A thread posts its answer only while `alive`, so that
// nothing reaches an io_context that is gone.
struct HostLookups::Shared {
  Shared(boost::asio::io_context* i, Resolve r, int n, HostLookups* o)
      : io(i), resolve(std::move(r)), threads(n), owner(o) {}
  boost::asio::io_context* io;
  Resolve resolve;
  int threads;
  HostLookups* owner;
  std::mutex m;
  bool alive = true;
  std::deque<std::string> todo;
  int running = 0;
};

HostLookups::HostLookups(boost::asio::io_context& io, int threads, Resolve resolve)
    : shared_(std::make_shared<Shared>(&io, std::move(resolve), threads < 1 ? 1 : threads, this)) {}

HostLookups::~HostLookups() {
  std::lock_guard lk(shared_->m);
  shared_->alive = false;
  shared_->owner = nullptr;
  shared_->todo.clear();
}

const HostPlace* HostLookups::find(const std::string& host) const {
  auto it = known_.find(bare_name(host));
  return it == known_.end() ? nullptr : &it->second;
}

void HostLookups::remember(const std::string& host, HostPlace place) {
  if (place.found()) known_[bare_name(host)] = std::move(place);
}

void HostLookups::when_known(const std::string& host, std::function<void(const HostPlace&)> then) {
  std::string key = bare_name(host);
  // Callbacks already waiting for this host go first, even when an answer is known.
  if (auto it = known_.find(key); it != known_.end() && !waiting_.count(key)) return then(it->second);
  auto [it, fresh] = waiting_.try_emplace(key);
  it->second.push_back(std::move(then));
  if (!fresh) return;
  std::lock_guard lk(shared_->m);
  shared_->todo.push_back(key);
  if (shared_->running < shared_->threads) {
    ++shared_->running;
    std::thread([s = shared_] { work(s); }).detach();
  }
}

void HostLookups::arrived(const std::string& key, const HostPlace& place) {
  if (place.found()) known_[key] = place;
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  auto callbacks = std::move(it->second);
  waiting_.erase(it);
  for (auto& then : callbacks) then(place);
}

void HostLookups::work(const std::shared_ptr<Shared>& s) {
  std::unique_lock lk(s->m);
  while (s->alive && !s->todo.empty()) {
    std::string key = std::move(s->todo.front());
    s->todo.pop_front();
    lk.unlock();
    HostPlace place = s->resolve(key);
    lk.lock();
    if (s->alive)
      boost::asio::post(*s->io, [s, key, place] {
        if (s->owner) s->owner->arrived(key, place);
      });
  }
  --s->running;
}

}  // namespace elasticrun::discovery
