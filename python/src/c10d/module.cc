// elasticrun._c10d: the torch.distributed backend "elasticrun" (process_group.h), as a
// subclass of torch's own Python type for c10d::ProcessGroup. elasticrun.torch registers
// it with torch.distributed.Backend.register_backend when it is imported.
//
// It must share pybind11's internals with torch._C (the same PYBIND11_INTERNALS_ID:
// pybind11 2.10 and gcc's C++ ABI for both, as Debian builds them), or torch would not
// know the type of the objects made here; the module says so at import when it differs.
#include "c10d/process_group.h"
#include "c10d/tensors.h"
#include "engine.h"
#include "process_engine.h"

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

namespace {

// elasticrun.torch's allreduce_ on a plain tensor, checked in C++: a torch.Tensor (or
// Parameter) on the CPU, dense, contiguous, without autograd, of a type the library
// reduces. Reduces it in place (as _core's allreduce_inplace_ptr does) and returns true;
// returns false, having done nothing, for anything else, which the Python path then
// takes (and refuses with Horovod's errors where it must). The Python-level checks of the
// same cost about 0.5 us of an 8-byte allreduce's 1.2.
bool allreduce_inplace(py::handle obj, int op) {
  using namespace elasticrun;
  using namespace elasticrun::python;
  if (!THPVariable_CheckExact(obj.ptr())) return false;
  const at::Tensor& t = THPVariable_Unpack(obj.ptr());
  if (!t.device().is_cpu() || t.layout() != at::kStrided || t.requires_grad() || !t.is_contiguous()) return false;
  auto type = elasticrun::python::c10d::library_type(t.scalar_type());
  if (!type) return false;
  if (op < 0 || op > static_cast<int>(ReduceOp::prod)) return false;
  Request r{Request::Kind::allreduce, t.data_ptr(), t.data_ptr(), static_cast<std::size_t>(t.numel()), *type,
            static_cast<ReduceOp>(op)};
  r.check = shape_check();
  Engine& e = process_engine();
  py::gil_scoped_release nogil;
  e.run([r](Context& ctx) { execute(ctx, r); });
  return true;
}

}  // namespace

PYBIND11_MODULE(_c10d, m) {
  using elasticrun::python::c10d::ProcessGroup;
  m.doc() = "The torch.distributed backend 'elasticrun' (internal: import elasticrun.torch)";
  // torch's ProcessGroup type must be registered before ours derives from it.
  py::module_ torch_c = py::module_::import("torch._C");
  if (py::str(torch_c.attr("_PYBIND11_BUILD_ABI")).cast<std::string>() != PYBIND11_BUILD_ABI)
    throw std::runtime_error("elasticrun._c10d was built with pybind11 ABI " PYBIND11_BUILD_ABI
                             ", torch with another: rebuild against the torch this Python imports");
  py::module_::import("torch.distributed");

  py::class_<ProcessGroup, ::c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroup>>(m, "ProcessGroupElasticrun",
                                                                                     R"(The elasticrun backend's process group.

Made by torch.distributed.init_process_group("elasticrun") (or new_group(backend="elasticrun")),
once elasticrun.torch has been imported. rank and size must be elasticrun's own.)")
      .def(py::init([](int rank, int size) { return c10::make_intrusive<ProcessGroup>(rank, size); }),
           py::arg("rank"), py::arg("size"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("epoch", &ProcessGroup::epoch, "The elasticrun epoch this group was made in")
      .def_property_readonly("_completion_threads", &ProcessGroup::completion_threads,
                             "Threads started to complete its futures (tests)")
      .def_property_readonly("_inline_runs", &ProcessGroup::inline_runs,
                             "Collectives it ran on the calling thread (tests)")
      .def(
          "_quiesce",
          [](ProcessGroup& pg, double seconds) {
            return pg.quiesce(std::chrono::milliseconds(static_cast<long>(seconds * 1000)));
          },
          py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
          "Wait until no future of this group is being completed (before the interpreter finalizes)");
  m.def("allreduce_inplace", &allreduce_inplace, py::arg("tensor"), py::arg("op"),
        "elasticrun.torch's allreduce_ fast path: true when it reduced the tensor in place, false when the "
        "tensor needs the Python path");
}
