#include "checkpoints.h"

#include "api/durable.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace elasticrun::python {
namespace {

constexpr const char* kKind = "python";

// The settings are read at first use after init(): `durable` is null without a directory.
struct Slot {
  bool made = false;
  std::unique_ptr<Durable> durable;
};
Slot& slot() {
  static Slot s;
  return s;
}

Durable* durable(Context& ctx) {
  Slot& s = slot();
  if (!s.made) {
    s.durable = Durable::from_settings(ctx);
    s.made = true;
  }
  return s.durable.get();
}

}  // namespace

void flush_checkpoints() {
  auto d = std::move(slot().durable);
  slot().made = false;
  py::gil_scoped_release nogil;
  d.reset();
}

void define_checkpoints(py::module_& m, std::function<Context&()> context) {
  m.def("checkpoint_enabled", [context] { return durable(context()) != nullptr; },
        "Whether durable checkpoints are on (ELASTICRUN_CHECKPOINT_DIR)");
  m.def(
      "checkpoint_due",
      [context](std::uint64_t commit) {
        Durable* d = durable(context());
        return d && d->due(commit);
      },
      "Whether this rank writes a checkpoint of commit number `commit`");
  m.def(
      "checkpoint_save",
      [context](std::uint64_t commit, py::bytes data) {
        Durable* d = durable(context());
        if (!d) throw Error("durable checkpoints are off (ELASTICRUN_CHECKPOINT_DIR is not set)");
        char* p = nullptr;
        py::ssize_t n = 0;
        if (PyBytes_AsStringAndSize(data.ptr(), &p, &n) != 0) throw py::error_already_set();
        std::vector<std::byte> payload(reinterpret_cast<std::byte*>(p), reinterpret_cast<std::byte*>(p) + n);
        py::gil_scoped_release nogil;
        d->save(commit, kKind, {{"pickle", static_cast<std::uint32_t>(DataType::u8), static_cast<std::uint64_t>(n)}},
                payload);
      },
      "Hands a pickled state to the writer thread");
  m.def(
      "checkpoint_load",
      [context]() -> py::object {
        Durable* d = durable(context());
        if (!d) return py::none();
        std::optional<collective::checkpoint::Loaded> l;
        {
          py::gil_scoped_release nogil;
          l = d->load(kKind, {});
        }
        if (!l) return py::none();
        return py::make_tuple(l->manifest.commit,
                              py::bytes(reinterpret_cast<const char*>(l->payload.data()), l->payload.size()));
      },
      "(commit, pickled state) of the newest intact checkpoint, or None");
  m.def("checkpoint_flush", &flush_checkpoints, "Waits for the checkpoint writes in progress");
}

}  // namespace elasticrun::python
