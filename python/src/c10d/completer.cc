#include "c10d/completer.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace elasticrun::python::c10d {

struct Completer::State {
  mutable std::mutex mu;
  std::condition_variable work_cv;   // a completion queued, or stop
  std::condition_variable watch_cv;  // completions queued with no thread free, or stop
  std::condition_variable calm_cv;   // expected dropped to 0, or a thread went idle
  std::deque<std::function<void()>> queue;
  std::size_t expected = 0;  // expect()ed and not yet taken off the queue
  std::size_t idle = 0;      // threads waiting for work, or started and not yet waiting
  std::uint64_t taken = 0;   // completions taken off the queue so far
  bool stop = false;
  std::vector<std::thread> threads;
  std::thread watchdog;
};

Completer::Completer() : state_(std::make_shared<State>()) {}

Completer::~Completer() {
  std::vector<std::thread> threads;
  {
    std::unique_lock lock(state_->mu);
    state_->calm_cv.wait(lock, [this] { return state_->expected == 0; });
    state_->stop = true;
    threads.swap(state_->threads);
    if (state_->watchdog.joinable()) threads.push_back(std::move(state_->watchdog));
  }
  state_->work_cv.notify_all();
  state_->watch_cv.notify_all();
  for (auto& t : threads) {
    // Destroyed from one of its own completions (a callback dropped the last reference
    // to the process group): that thread leaves by itself once the callback returns.
    if (t.get_id() == std::this_thread::get_id()) t.detach();
    else t.join();
  }
}

void Completer::expect() {
  std::lock_guard lock(state_->mu);
  ++state_->expected;
}

void Completer::forget() {
  std::lock_guard lock(state_->mu);
  if (--state_->expected == 0) state_->calm_cv.notify_all();
}

void Completer::post(std::function<void()> f) {
  std::lock_guard lock(state_->mu);
  state_->queue.push_back(std::move(f));
  if (state_->threads.empty()) {
    ++state_->idle;
    state_->threads.emplace_back(run, state_);
    state_->watchdog = std::thread(watch, state_);
  } else if (state_->idle > 0) {
    state_->work_cv.notify_one();
  } else {
    state_->watch_cv.notify_one();
  }
}

bool Completer::quiesce(std::chrono::milliseconds timeout) {
  std::unique_lock lock(state_->mu);
  return state_->calm_cv.wait_for(lock, timeout, [this] {
    return state_->expected == 0 && state_->queue.empty() && state_->idle == state_->threads.size();
  });
}

std::size_t Completer::threads() const {
  std::lock_guard lock(state_->mu);
  return state_->threads.size();
}

// Counted idle from its start (by whoever started it), so that the watchdog does not
// start another while this one is on its way.
void Completer::run(std::shared_ptr<State> s) {
  std::unique_lock lock(s->mu);
  for (;;) {
    s->calm_cv.notify_all();
    s->work_cv.wait(lock, [&] { return s->stop || !s->queue.empty(); });
    --s->idle;
    if (s->queue.empty()) return;  // stopped
    auto f = std::move(s->queue.front());
    s->queue.pop_front();
    ++s->taken;
    if (--s->expected == 0) s->calm_cv.notify_all();
    lock.unlock();
    f();
    f = nullptr;  // what it holds (the work, its tensors) goes before the next wait
    lock.lock();
    ++s->idle;
  }
}

void Completer::watch(std::shared_ptr<State> s) {
  std::unique_lock lock(s->mu);
  for (;;) {
    s->watch_cv.wait(lock, [&] { return s->stop || (!s->queue.empty() && s->idle == 0); });
    if (s->stop) return;
    const std::uint64_t taken = s->taken;
    const bool moved = s->watch_cv.wait_for(lock, kGrace, [&] {
      return s->stop || s->queue.empty() || s->idle > 0 || s->taken != taken;
    });
    if (!moved && s->threads.size() < kMaxThreads) {
      ++s->idle;
      s->threads.emplace_back(run, s);
    }
  }
}

}  // namespace elasticrun::python::c10d
