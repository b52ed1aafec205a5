// How the _core bindings hand a collective to the process's engine: at once and
// synchronously, or queued behind a Handle that Python keeps, and what becomes of a
// Handle dropped before its collective completed. GIL held in every function here.
#pragma once

#include "buffers.h"  // py
#include "engine.h"

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
  Handle(std::shared_ptr<Completion> c, py::object keep, std::shared_ptr<void> views,
         std::function<py::object()> result);
  ~Handle();
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  bool poll() const { return completion_->done(); }
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
};

// The result of a collective whose output exists before it runs.
std::function<py::object()> yields(py::object o);

// Releases the buffers of dropped handles whose collectives are done; with `all`, waits
// (GIL released) for the others first (at shutdown).
void sweep_orphans(bool all);

// Runs `task` synchronously (GIL released) and returns result(), or queues it and
// returns a Handle that keeps `keep` and `views` alive and yields result(). Tasks capture
// raw pointers only: a task may be destroyed on the engine's thread, without the GIL,
// where releasing a buffer view (PyBuffer_Release) must not happen. `named`: see Engine.
py::object issue(Task task, bool async, py::object keep, std::function<py::object()> result,
                 std::shared_ptr<void> views = {}, const Named& named = {});

}  // namespace elasticrun::python
