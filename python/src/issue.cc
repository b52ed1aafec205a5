#include "issue.h"

#include "process_engine.h"

#include <algorithm>
#include <chrono>

namespace elasticrun::python {

Handle::Handle(std::shared_ptr<Completion> c, py::object keep, std::shared_ptr<void> views,
               std::function<py::object()> result, std::uint64_t name_key)
    : completion_(std::move(c)),
      keep_(std::move(keep)),
      views_(std::move(views)),
      result_(std::move(result)),
      name_key_(name_key) {}

namespace {

// The handle's collective is done and the caller has seen it: its name is free.
void release_name(std::uint64_t& key) {
  if (key && process_engine_started()) process_engine().release(key);
  key = 0;
}

}  // namespace

bool Handle::poll() const {
  if (!completion_->done()) return false;
  release_name(name_key_);
  return true;
}

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
  release_name(name_key_);
  views_.reset();
  keep_ = py::none();
  return result_();
}

std::function<py::object()> yields(py::object o) {
  return [o = std::move(o)] { return o; };
}

bool sweep_orphans(std::chrono::steady_clock::time_point wait_until) {
  auto& o = Handle::orphans();
  for (auto& h : o) {
    py::gil_scoped_release nogil;
    try {
      auto left = wait_until - std::chrono::steady_clock::now();
      if (left > decltype(left)::zero())
        h.completion->wait_for(std::chrono::ceil<std::chrono::milliseconds>(std::min<decltype(left)>(left, std::chrono::hours(24))));
    } catch (...) {
      // Its error belonged to whoever would have waited.
    }
  }
  o.erase(std::remove_if(o.begin(), o.end(), [](const Handle::Orphan& h) { return h.completion->done(); }), o.end());
  return o.empty();
}

py::object issue(Task task, bool async, py::object keep, std::function<py::object()> result,
                 std::shared_ptr<void> views, const Named& named) {
  Engine& e = process_engine();
  sweep_orphans();
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
  return py::cast(std::make_unique<Handle>(std::move(c), std::move(keep), std::move(views), std::move(result),
                                          named.unique ? named.key : 0));
}

}  // namespace elasticrun::python
