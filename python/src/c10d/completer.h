// Runs the completions of a process group's work off the engine's thread.
//
// Completing a torch future runs its callbacks on the completing thread, and a callback
// may issue another collective and wait for it (DDP's PowerSGD hook does). On the
// engine's thread that wait would never end: the engine runs one collective at a time.
// On a single thread of our own it would not end either, when the completion of the
// inner collective queues behind the callback waiting for it. So one thread runs the
// completions, and a watchdog adds one when completions are queued, every thread is
// busy, and none was taken for kGrace: those threads wait inside callbacks. Threads stay
// until the Completer is destroyed.
//
// The destructor first waits until every expected completion has been taken by a
// thread, so that the engine never posts to a Completer that is gone.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>

namespace elasticrun::python::c10d {

class Completer {
 public:
  // At most this many threads; beyond it a completion waits for a free one.
  static constexpr std::size_t kMaxThreads = 64;
  // How long queued completions wait on busy threads before the watchdog adds one.
  static constexpr std::chrono::milliseconds kGrace{2};

  Completer();
  ~Completer();
  Completer(const Completer&) = delete;
  Completer& operator=(const Completer&) = delete;

  // A completion will be posted (a collective was queued on the engine).
  void expect();
  // An expected completion will not come after all (the collective was never queued).
  void forget();
  // Runs `f` on a thread of this Completer, after expect(); `f` must not throw.
  void post(std::function<void()> f);
  // Waits up to `timeout` until nothing is expected, queued or running; false if that
  // did not happen in time. Before the interpreter finalizes: a thread still returning
  // from a Python callback then would be ended by it mid-way (and abort the process).
  bool quiesce(std::chrono::milliseconds timeout);
  // Threads started to run completions so far (for tests).
  std::size_t threads() const;

 private:
  struct State;
  static void run(std::shared_ptr<State> s);
  static void watch(std::shared_ptr<State> s);
  std::shared_ptr<State> state_;  // shared with the threads, which may outlive this
};

}  // namespace elasticrun::python::c10d
