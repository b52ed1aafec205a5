#include "issue.h"

#include "process_engine.h"

#include <algorithm>
#include <chrono>

namespace elasticrun::python {

Handle::Handle(std::shared_ptr<Completion> c, py::object keep, std::shared_ptr<void> views,
               std::function<py::object()> result)
    : completion_(std::move(c)), keep_(std::move(keep)), views_(std::move(views)), result_(std::move(result)) {}

Handle::~Handle() {
  if (completion_ && !completion_->done()) orphans().push_back({completion_, std::move(keep_), std::move(views_)});
}

std::vector<Handle::Orphan>& Handle::orphans() {
  static auto* o = new std::vector<Orphan>;  // never destroyed: no Python objects freed at exit
  return *o;
}

py::object Handle::wait(std::optional<double> timeout) {
  auto deadline = timeout ? std::chrono::steady_clock::now() +
                                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(*timeout))
                          : std::chrono::steady_clock::time_point::max();
  for (;;) {
    bool done;
    {
      py::gil_scoped_release nogil;
      done = completion_->wait_for(std::chrono::milliseconds(50));
    }
    if (done) break;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (std::chrono::steady_clock::now() >= deadline)
      throw TimeoutError("wait: the collective did not complete within the timeout");
  }
  views_.reset();
  keep_ = py::none();
  return result_();
}

std::function<py::object()> yields(py::object o) {
  return [o = std::move(o)] { return o; };
}

void sweep_orphans(bool all) {
  auto& o = Handle::orphans();
  if (o.empty()) return;
  if (all) {
    for (auto& h : o) {
      py::gil_scoped_release nogil;
      try {
        while (!h.completion->wait_for(std::chrono::hours(1))) {
        }
      } catch (...) {
        // Its error belonged to whoever would have waited.
      }
    }
  }
  o.erase(std::remove_if(o.begin(), o.end(), [](const Handle::Orphan& h) { return h.completion->done(); }), o.end());
}

py::object issue(Task task, bool async, py::object keep, std::function<py::object()> result,
                 std::shared_ptr<void> views, const Named& named) {
  Engine& e = process_engine();
  sweep_orphans(false);
  if (!async) {
    {
      py::gil_scoped_release nogil;
      e.run(task, named);
    }
    return result();
  }
  std::shared_ptr<Completion> c;
  {
    py::gil_scoped_release nogil;
    c = e.submit(std::move(task), named);
  }
  return py::cast(std::make_unique<Handle>(std::move(c), std::move(keep), std::move(views), std::move(result)));
}

}  // namespace elasticrun::python
