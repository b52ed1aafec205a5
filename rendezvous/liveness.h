// Which joined workers have fallen silent (elasticrun --worker-timeout).
//
// A worker's library sends a heartbeat on its rendezvous connection every
// heartbeat_interval(timeout), from a thread of its own (collective's
// RendezvousClient), whatever its program is doing: a long step, a blocked collective,
// a rendezvous call. So a worker that sent nothing at all for `timeout` is not busy but
// stopped (SIGSTOP), frozen, or cut off; its owner fails it.
//
// Pure, with the time passed in. The watched keys are kept in the order last heard
// from: hearing one is O(1), and a check looks only at the longest silent. The owner
// runs check() every tick() on one timer. A check far behind its time means the owner
// itself stalled (the machine swapped, the driver was stopped): the workers' frames
// wait unread in the sockets and their silence proves nothing, so every key counts as
// heard at that check.
#pragma once

#include <algorithm>
#include <chrono>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace elasticrun::rendezvous {

using LivenessClock = std::chrono::steady_clock;

// Five beats per timeout: a worker is failed only after missing four in a row.
inline std::chrono::milliseconds heartbeat_interval(std::chrono::milliseconds timeout) { return timeout / 5; }

template <class Key>
class Liveness {
 public:
  using TimePoint = LivenessClock::time_point;
  struct Silent {
    Key key;
    std::chrono::milliseconds silent;  // since it was last heard from
  };

  explicit Liveness(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  std::chrono::milliseconds timeout() const { return timeout_; }
  // How often check() should run: a silent key is found at most this long after its
  // timeout.
  std::chrono::milliseconds tick() const {
    return std::clamp(timeout_ / 20, std::chrono::milliseconds(10), std::chrono::milliseconds(250));
  }
  // Starts watching `key`, heard from now.
  void watch(const Key& key, TimePoint now) {
    forget(key);
    where_[key] = order_.insert(order_.end(), Entry{key, now});
  }
  // `key` was heard from now; nothing if it is not watched.
  void heard(const Key& key, TimePoint now) {
    auto it = where_.find(key);
    if (it == where_.end()) return;
    it->second->last = now;
    order_.splice(order_.end(), order_, it->second);
  }
  void forget(const Key& key) {
    auto it = where_.find(key);
    if (it == where_.end()) return;
    order_.erase(it->second);
    where_.erase(it);
  }
  std::size_t size() const { return order_.size(); }

  // The keys silent for the timeout or longer by `now`, longest silent first; they are
  // no longer watched.
  std::vector<Silent> check(TimePoint now) {
    std::vector<Silent> out;
    bool stalled = last_check_ && now - *last_check_ > tick() + stall_slack();
    last_check_ = now;
    if (stalled) {
      for (auto& e : order_) e.last = now;
      return out;
    }
    while (!order_.empty() && now - order_.front().last >= timeout_) {
      const Entry& e = order_.front();
      out.push_back({e.key, std::chrono::duration_cast<std::chrono::milliseconds>(now - e.last)});
      where_.erase(e.key);
      order_.pop_front();
    }
    return out;
  }

 private:
  struct Entry {
    Key key;
    TimePoint last;
  };
  // How late a check may run before it counts as a stall: scheduling noise on a loaded
  // machine is not one.
  std::chrono::milliseconds stall_slack() const { return std::min(std::chrono::milliseconds(500), timeout_ / 4); }

  std::chrono::milliseconds timeout_;
  std::list<Entry> order_;  // least recently heard first
  std::unordered_map<Key, typename std::list<Entry>::iterator> where_;
  std::optional<TimePoint> last_check_;
};

}  // namespace elasticrun::rendezvous
