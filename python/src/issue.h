// How the _core bindings hand a collective to the process's engine: at once and
// synchronously, or queued behind a Handle that Python keeps, and what becomes of a
// Handle dropped before its collective completed. GIL held in every function here.
#pragma once

#include "buffers.h"  // py
#include "engine.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace elasticrun::python {

// A pending collective. Holds the buffers it reads and writes until it is done. A handle
// dropped before then does not wait for it (a rank that drops one and goes on to a
// collective the others issued first would wait forever): its buffers go to the
// orphans, released once the collective is done (sweep_orphans).
class Handle {
 public:
  // `name_key`: the key of the collective's unique name (0: none), freed for a new
  // collective once this handle has seen it done (Engine::release).
  Handle(std::shared_ptr<Completion> c, py::object keep, std::shared_ptr<void> views,
         std::function<py::object()> result, std::uint64_t name_key = 0);
  ~Handle();
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  bool poll() const;
  // Waits with the GIL released, in slices, so that Ctrl-C (a KeyboardInterrupt) ends
  // the wait; `timeout` in seconds, none for no limit. Returns the result.
  py::object wait(std::optional<double> timeout);

  struct Orphan {
    std::shared_ptr<Completion> completion;
    py::object keep;
    std::shared_ptr<void> views;
  };
  // The buffers of dropped handles, until swept.
  static std::vector<Orphan>& orphans();

 private:
  std::shared_ptr<Completion> completion_;
  py::object keep_;
  std::shared_ptr<void> views_;  // buffer views: released with the GIL held, here
  std::function<py::object()> result_;
  mutable std::uint64_t name_key_;  // 0 once released
};

// The result of a collective whose output exists before it runs.
std::function<py::object()> yields(py::object o);

// Releases the buffers of dropped handles whose collectives are done, after waiting (GIL
// released) for the others up to `wait_until` (by default not at all); true when none is
// left.
bool sweep_orphans(std::chrono::steady_clock::time_point wait_until = {});

// shutdown()'s wait: what was issued and not yet done (dropped handles' collectives
// included) may finish for this long; then it is abandoned (fails at once), so that a
// collective no peer will match cannot hold the process for the collective timeout.
inline constexpr std::chrono::seconds kShutdownGrace{10};

// Runs `task` synchronously (GIL released) and returns result(), or queues it and
// returns a Handle that keeps `keep` and `views` alive and yields result(). Tasks capture
// raw pointers only: a task may be destroyed on the engine's thread, without the GIL,
// where releasing a buffer view (PyBuffer_Release) must not happen. `named`: see Engine.
py::object issue(Task task, bool async, py::object keep, std::function<py::object()> result,
                 std::shared_ptr<void> views = {}, const Named& named = {});

}  // namespace elasticrun::python
