// elasticrun._core: the pybind11 bindings of libelasticrun that the Python package
// (python/elasticrun) builds on. Collectives take any C-contiguous buffer-protocol
// object (numpy arrays, bytearray, memoryview ...) without copying it; the torch layer
// passes raw tensor pointers through the *_ptr forms. The GIL is released for every wait.
#include "api/context_internal.h"
#include "buffers.h"
#include "checkpoints.h"
#include "engine.h"
#include "issue.h"
#include "process_engine.h"

#include <common/log.h>
#include <elasticrun/device.hpp>
#include <elasticrun/elasticrun.hpp>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace elasticrun::python {
namespace {

Engine& engine() { return process_engine(); }

int world_size() {
  engine();
  return elasticrun::size();
}

void do_init() {
  py::gil_scoped_release nogil;
  start_process_engine();
}

// Lets what was issued finish (a dropped handle's collective too: the peers may still be
// on their way to it) for kShutdownGrace; what is left then is abandoned, with a warning.
void do_shutdown() {
  flush_checkpoints();
  const auto deadline = std::chrono::steady_clock::now() + kShutdownGrace;
  bool done = sweep_orphans(deadline);
  {
    py::gil_scoped_release nogil;
    done = engine().drain_until(deadline) && done;
    if (!done) {
      ER_LOG(collective, warn, "shutdown(): collectives issued here were still pending after {} s: abandoned",
             kShutdownGrace.count());
      abandon_collectives("shutdown() abandoned the collective: its peers did not issue it within " +
                          std::to_string(kShutdownGrace.count()) + " s");
    }
  }
  if (!done) sweep_orphans(std::chrono::steady_clock::time_point::max());
  py::gil_scoped_release nogil;
  stop_process_engine();
}

py::array new_array(DataType t, const std::vector<py::ssize_t>& shape) {
  return py::array(py::dtype(format_of(t)), shape);
}

ReduceOp op_of(int op) {
  if (op < 0 || op > static_cast<int>(ReduceOp::prod))
    throw py::value_error(fmt::format("unknown reduction op {}: use elasticrun.Sum, Average, Min, Max or Product", op));
  return static_cast<ReduceOp>(op);
}

// Makes sure `out` matches `in` in type and element count.
void check_same(const View& in, const View& out, const char* what) {
  if (in.type != out.type || in.count != out.count)
    throw py::value_error(fmt::format("{}: the output holds {} {} elements, the input {} {}", what, out.count,
                                      name_of(out.type), in.count, name_of(in.type)));
}

py::object allreduce(py::object x, int op, py::object out, double prescale, double postscale, bool async) {
  auto in = std::make_shared<View>(view_of(x, false, "allreduce"));
  py::object result = out.is_none() ? py::object(new_array(in->type, in->shape())) : out;
  auto o = std::make_shared<View>(view_of(result, true, "allreduce"));
  check_same(*in, *o, "allreduce");
  Request r{Request::Kind::allreduce, in->data(), o->data(), in->count, in->type, op_of(op)};
  r.prescale = prescale, r.postscale = postscale;
  r.check = shape_check();
  return issue([r](Context& ctx) { execute(ctx, r); }, async, py::make_tuple(x, result), yields(result),
               std::make_shared<std::pair<std::shared_ptr<View>, std::shared_ptr<View>>>(in, o));
}

py::object broadcast(py::object x, int root, bool async) {
  auto v = std::make_shared<View>(view_of(x, true, "broadcast"));
  Request r{Request::Kind::broadcast, nullptr, v->data(), v->count, v->type};
  r.root = root;
  r.check = shape_check();
  return issue([r](Context& ctx) { execute(ctx, r); }, async, x, yields(x), v);
}

// Allgather along the first dimension, which may differ between ranks: the ranks first
// exchange (rows, elements per row, type), so that a disagreement on the rest of the
// shape or the type is an error on every rank rather than a hang, then gather.
struct Gathered {
  std::vector<std::uint8_t> bytes;
  std::vector<std::int64_t> rows;
};

// Gives `r` the key of `name` (none for an empty name, or on a process set, whose
// collectives go by order) and returns how the engine queues it: the name held while
// the collective is in flight.
Named named_request(Request& r, const std::string& name) {
  Named named;
  if (name.empty() || r.set != 0) return named;
  r.key = named.key = name_key(name);
  named.unique = true;
  named.name = name;
  return named;
}

// A task that gathers every rank's rows (of `per_row` elements of `type`, from `data`)
// into `got`: first every rank's (rows, elements per row, type), by `exchange` (an
// allgather request whose buffers and count are filled in here: give it the check, the
// process set and the name), then the rows. Rows that differ beyond the first dimension
// are an Error on every rank.
Task gather_rows(const void* data, std::int64_t rows, std::int64_t per_row, DataType type, Request exchange,
                 std::shared_ptr<Gathered> got) {
  exchange.kind = Request::Kind::allgather;
  exchange.count = 3;
  exchange.type = DataType::i64;
  return [=](Context& ctx) mutable {
    Communicator& comm = communicator(ctx, exchange.set, exchange.members);
    const int n = comm.size();
    std::int64_t mine[3] = {rows, per_row, static_cast<std::int64_t>(type)};
    std::vector<std::int64_t> all(3 * static_cast<std::size_t>(n));
    exchange.in = mine;
    exchange.out = all.data();
    execute(ctx, exchange);
    std::vector<std::size_t> counts(n);
    got->rows.clear();
    for (int q = 0; q < n; ++q) {
      const std::int64_t* m = &all[3 * q];
      if (m[1] != per_row || m[2] != mine[2])
        throw Error(fmt::format("allgather: the ranks' tensors differ beyond the first dimension: rank {} has {} {} "
                                "elements per row, rank {} has {} {}",
                                comm.rank(), per_row, name_of(type), q, m[1], name_of(static_cast<DataType>(m[2]))));
      got->rows.push_back(m[0]);
      counts[q] = static_cast<std::size_t>(m[0] * per_row);
    }
    std::size_t total = 0;
    for (auto c : counts) total += c;
    got->bytes.resize(total * size_of(type));
    comm.allgatherv(data, got->bytes.data(), counts, type);
  };
}

py::object allgather(py::object x, bool async) {
  auto in = std::make_shared<View>(view_of(x, false, "allgather"));
  auto shape = in->shape();
  const std::int64_t rows = shape.empty() ? 1 : shape[0];
  const std::int64_t per_row = static_cast<std::int64_t>(in->row_elements());
  auto got = std::make_shared<Gathered>();
  const DataType type = in->type;
  Task task = gather_rows(in->data(), rows, per_row, type, Request{}, got);
  // The output's size is known only after the exchange: the gathered bytes become a
  // numpy array when the result is asked for.
  auto to_array = [type, got, shape]() -> py::object {
    std::vector<py::ssize_t> s = shape.empty() ? std::vector<py::ssize_t>{0} : shape;
    py::ssize_t total_rows = 0;
    for (auto r : got->rows) total_rows += r;
    s[0] = total_rows;
    py::array a = new_array(type, s);
    std::memcpy(a.mutable_data(), got->bytes.data(), got->bytes.size());
    return a;
  };
  return issue(std::move(task), async, x, to_array, in);
}

py::object reduce_scatter(py::object x, int op, bool async) {
  auto in = std::make_shared<View>(view_of(x, false, "reduce_scatter"));
  int n = world_size();
  auto shape = in->shape();
  if (shape.empty() || shape[0] % n != 0)
    throw py::value_error(fmt::format("reduce_scatter: the first dimension ({}) must be a multiple of size() ({})",
                                      shape.empty() ? 0 : shape[0], n));
  shape[0] /= n;
  py::array result = new_array(in->type, shape);
  auto o = std::make_shared<View>(view_of(result, true, "reduce_scatter"));
  Request r{Request::Kind::reduce_scatter, in->data(), o->data(), o->count, in->type, op_of(op)};
  r.check = shape_check();
  return issue([r](Context& ctx) { execute(ctx, r); }, async, py::make_tuple(x, result), yields(result),
               std::make_shared<std::pair<std::shared_ptr<View>, std::shared_ptr<View>>>(in, o));
}

py::object alltoall(py::object x, py::object out, bool async) {
  auto in = std::make_shared<View>(view_of(x, false, "alltoall"));
  int n = world_size();
  if (in->count % static_cast<std::size_t>(n) != 0)
    throw py::value_error(fmt::format("alltoall: {} elements do not split into size() ({}) equal blocks", in->count, n));
  py::object result = out.is_none() ? py::object(new_array(in->type, in->shape())) : out;
  auto o = std::make_shared<View>(view_of(result, true, "alltoall"));
  check_same(*in, *o, "alltoall");
  Request r{Request::Kind::alltoall, in->data(), o->data(), in->count / n, in->type};
  r.check = shape_check();
  return issue([r](Context& ctx) { execute(ctx, r); }, async, py::make_tuple(x, result), yields(result),
               std::make_shared<std::pair<std::shared_ptr<View>, std::shared_ptr<View>>>(in, o));
}

// The torch layer's asynchronous allgather: one task that first agrees and exchanges
// every rank's row count (rows of `row_elements` elements of type `type`, from `data`),
// then gathers them into memory of its own. The result, once done: (the gathered bytes
// as a numpy uint8 array, without a copy; every rank's row count). In a task of its own
// so that it waits in the queue like any other (a named one can be run out of order).
py::object allgather_ptr(std::uintptr_t data, std::int64_t rows, std::int64_t row_elements, int type, bool check,
                         py::object keep, int set, std::vector<int> members, const std::string& name) {
  if (type < 0 || type > static_cast<int>(DataType::i64)) throw py::value_error("unknown element type code");
  Request exchange;
  exchange.check = check;
  exchange.set = set;
  exchange.members = std::move(members);
  exchange.reorderable = true;
  const Named named = named_request(exchange, name);
  auto got = std::make_shared<Gathered>();
  Task task = gather_rows(reinterpret_cast<const void*>(data), rows, row_elements, static_cast<DataType>(type),
                          std::move(exchange), got);
  auto cache = std::make_shared<py::object>();  // the result, made once (wait() may be called again)
  auto result = [got, cache]() -> py::object {
    if (!*cache) {
      auto* owner = new std::vector<std::uint8_t>(std::move(got->bytes));
      py::capsule free_it(owner, [](void* p) { delete static_cast<std::vector<std::uint8_t>*>(p); });
      py::array a(py::dtype::of<std::uint8_t>(), {static_cast<py::ssize_t>(owner->size())}, {1}, owner->data(),
                  free_it);
      *cache = py::make_tuple(a, got->rows);
    }
    return *cache;
  };
  return issue(std::move(task), true, keep, result, {}, named);
}

// The torch layer's path: raw pointers of tensors it keeps alive (`keep`), the type by
// the library's code, no buffer protocol (it has no bfloat16). `device` >= 0: CUDA
// tensors on that device, reduced through NCCL on `stream` (Request::device).
py::object ptr_collective(const std::string& kind, std::uintptr_t in, std::uintptr_t out, std::size_t count,
                          int type, int op, int root, double prescale, double postscale, bool async,
                          py::object keep, bool check, int device, std::uintptr_t stream, std::int64_t shape,
                          int set, std::vector<int> members, const std::string& name) {
  if (type < 0 || type > static_cast<int>(DataType::i64)) throw py::value_error("unknown element type code");
  Request r;
  if (kind == "allreduce") r.kind = Request::Kind::allreduce;
  else if (kind == "broadcast") r.kind = Request::Kind::broadcast;
  else if (kind == "allgather") r.kind = Request::Kind::allgather;
  else if (kind == "reduce_scatter") r.kind = Request::Kind::reduce_scatter;
  else if (kind == "alltoall") r.kind = Request::Kind::alltoall;
  else throw py::value_error("unknown collective '" + kind + "'");
  r.in = reinterpret_cast<const void*>(in), r.out = reinterpret_cast<void*>(out);
  r.count = count, r.type = static_cast<DataType>(type), r.op = op_of(op), r.root = root;
  r.prescale = prescale, r.postscale = postscale;
  r.check = check;
  r.shape = shape;
  r.device = device < 0 ? -1 : device;
  r.stream = reinterpret_cast<void*>(stream);
  r.set = set;
  r.members = std::move(members);
  r.reorderable = true;
  const Named named = named_request(r, name);
  return issue([r](Context& ctx) { execute(ctx, r); }, async, keep, yields(py::none()), {}, named);
}

}  // namespace
}  // namespace elasticrun::python

PYBIND11_MODULE(_core, m) {
  using namespace elasticrun;
  using namespace elasticrun::python;
  m.doc() = "libelasticrun bindings (internal: use the elasticrun package)";

  py::register_exception<DuplicateName>(m, "DuplicateNameError", PyExc_ValueError);
  auto base = py::register_exception<Error>(m, "ElasticrunError", PyExc_RuntimeError);
  py::register_exception<WorkersFailed>(m, "WorkersFailedError", base.ptr());
  py::register_exception<HostsUpdated>(m, "HostsUpdatedError", base.ptr());
  py::register_exception<TimeoutError>(m, "ElasticTimeoutError", base.ptr());
  py::register_exception<ProtocolError>(m, "ProtocolError", base.ptr());

  m.def("init", &do_init, "Join the job (reads the ELASTICRUN_* environment the daemon set)");
  m.def("shutdown", &do_shutdown, "Leave the job; collectives after it raise");
  m.def("is_initialized", &process_engine_started);
  m.def("rank", [] { return engine(), elasticrun::rank(); });
  m.def("size", [] { return engine(), elasticrun::size(); });
  m.def("local_rank", [] { return engine(), elasticrun::local_rank(); });
  m.def("local_size", [] { return engine(), elasticrun::local_size(); });
  m.def("cross_rank", [] { return engine(), elasticrun::cross_rank(); });
  m.def("cross_size", [] { return engine(), elasticrun::cross_size(); });
  m.def("epoch", [] { return engine(), elasticrun::context().topology().epoch; });
  m.def("host", [] { return engine(), elasticrun::context().topology().host; });
  m.def("resets", [] { return engine(), elasticrun::context().resets(); });
  m.def("hosts_updated", [] { return engine(), elasticrun::context().hosts_updated(); });
  define_checkpoints(m, []() -> Context& { return engine(), elasticrun::context(); });
  m.def(
      "abandon",
      [] {
        Engine& e = engine();
        py::gil_scoped_release nogil;
        e.drain();
        elasticrun::context().abandon();
      },
      "After a failure, before restoring: tear the epoch's transport down, so that no transfer of it lands "
      "in a buffer afterwards");
  m.def(
      "state_synced",
      [](std::uint64_t commits) {
        engine();
        ContextInternals::state_synced(elasticrun::context(), commits);
      },
      "The end of an elastic state's sync: tells the driver this worker holds the job's state (at `commits` "
      "commits), so that it may be rank 0 of a later epoch");
  m.def(
      "rejoin",
      [] {
        Engine& e = engine();
        py::gil_scoped_release nogil;
        e.drain();  // nothing of the old epoch may run on the new communicator
        elasticrun::context().rejoin();
      },
      "Wait for the next epoch and take this worker's place in it");

  m.def(
      "report",
      [](std::int64_t step, const std::map<std::string, double>& metrics) {
        Engine& e = engine();
        bool stop = false;
        py::gil_scoped_release nogil;
        e.run([&](Context& ctx) { stop = ctx.report(step, metrics); });  // after what was issued before it
        return stop;
      },
      py::arg("step"), py::arg("metrics"), "Report progress to the driver; true when it decided to stop (collective)");
  m.def("should_stop", [] { return engine(), elasticrun::context().should_stop(); });

  py::class_<Handle>(m, "Handle", "A pending asynchronous collective")
      .def("poll", &Handle::poll, "True once the collective has completed (its error, if any, is raised by wait)")
      .def("wait", &Handle::wait, py::arg("timeout") = py::none(),
           "Wait for the collective and return its result; raises its error");

  m.def("allreduce", &python::allreduce, py::arg("tensor"), py::arg("op") = 0, py::arg("out") = py::none(),
        py::arg("prescale_factor") = 1.0, py::arg("postscale_factor") = 1.0, py::arg("async_") = false);
  m.def("broadcast", &python::broadcast, py::arg("tensor"), py::arg("root_rank") = 0, py::arg("async_") = false);
  m.def("allgather", &python::allgather, py::arg("tensor"), py::arg("async_") = false);
  m.def("reduce_scatter", &python::reduce_scatter, py::arg("tensor"), py::arg("op") = 0, py::arg("async_") = false);
  m.def("alltoall", &python::alltoall, py::arg("tensor"), py::arg("out") = py::none(), py::arg("async_") = false);
  m.def(
      "barrier",
      [](bool async, int set, std::vector<int> members, std::optional<bool> check) {
        Request r;  // a barrier
        r.check = check ? *check : shape_check();  // with the agreement, a joined rank takes part
        r.set = set;
        r.members = std::move(members);
        r.reorderable = true;
        Named named;
        if (set == 0) r.key = named.key = barrier_key();  // may run before named collectives issued earlier
        return issue([r](Context& ctx) { execute(ctx, r); }, async, py::none(), yields(py::none()), {}, named);
      },
      py::arg("async_") = false, py::arg("set") = 0, py::arg("members") = std::vector<int>{},
      py::arg("check") = py::none(),
      "Returns once every rank (of process set `set`, whose members are `members`) has called it");
  m.def(
      "join_round",
      [](std::int64_t rounds) {
        JoinRound j;
        Engine& e = engine();
        {
          py::gil_scoped_release nogil;
          e.run([&](Context& ctx) { j = join_round(ctx, rounds); });  // after what was issued before
        }
        return py::make_tuple(j.done, j.last, j.take_part, std::string(kind_name(j.kind)), j.count,
                              static_cast<int>(j.type), static_cast<int>(j.op), j.on_device);
      },
      py::arg("rounds"),
      "One round of join(): (done, last rank to join, take part, kind, count, type code, op, on GPU); see "
      "engine.h");
  m.def("ptr_collective", &ptr_collective, py::arg("kind"), py::arg("inp"), py::arg("out"), py::arg("count"),
        py::arg("dtype"), py::arg("op") = 0, py::arg("root") = 0, py::arg("prescale") = 1.0,
        py::arg("postscale") = 1.0, py::arg("async_") = false, py::arg("keep") = py::none(),
        py::arg("check") = false, py::arg("device") = -1, py::arg("stream") = 0, py::arg("shape") = 0,
        py::arg("set") = 0, py::arg("members") = std::vector<int>{}, py::arg("name") = std::string());
  m.def("allgather_ptr", &allgather_ptr, py::arg("data"), py::arg("rows"), py::arg("row_elements"),
        py::arg("dtype"), py::arg("check") = true, py::arg("keep") = py::none(), py::arg("set") = 0,
        py::arg("members") = std::vector<int>{}, py::arg("name") = std::string(),
        "Asynchronous allgather of rows from a raw pointer: a Handle giving (bytes, rows per rank)");
  m.def(
      "device_status",
      [] {
        std::string why;
        bool ok = device::available(&why);
        return py::make_tuple(ok, why);
      },
      "(True, '') when collectives on CUDA memory can run here (an NCCL build and a visible device), "
      "else (False, the reason)");
  m.def("nccl_version", &device::nccl_version,
        "NCCL_VERSION_CODE of the NCCL libelasticrun was built with, 0 without its NCCL backend");
  // The torch layer's hot path (allreduce_ on a plain tensor): four arguments, no
  // keyword handling, synchronous, checked as set_shape_check says.
  m.def(
      "allreduce_inplace_ptr",
      [](std::uintptr_t p, std::size_t count, int type, int op) {
        if (type < 0 || type > static_cast<int>(DataType::i64)) throw py::value_error("unknown element type code");
        Request r{Request::Kind::allreduce, reinterpret_cast<const void*>(p), reinterpret_cast<void*>(p), count,
                  static_cast<DataType>(type), op_of(op)};
        r.check = shape_check();
        issue([r](Context& ctx) { execute(ctx, r); }, false, py::none(), yields(py::none()));
      },
      py::arg("ptr"), py::arg("count"), py::arg("dtype"), py::arg("op"));
  m.def(
      "set_shape_check", &set_shape_check, py::arg("on"),
      "Whether collectives on buffers first check that every rank passes the same count and type");
  m.def("shape_check", &shape_check);
  m.def(
      "_set_name_hold", [](double ms) { set_name_hold(std::chrono::microseconds(std::llround(ms * 1000))); },
      py::arg("ms"), "How long a named handle's name stays pending after its issue (HOROVOD_CYCLE_TIME)");
  m.def("_drain", [] {
    Engine& e = engine();
    py::gil_scoped_release nogil;
    e.drain();
  });

  m.attr("SUM") = static_cast<int>(ReduceOp::sum);
  m.attr("AVERAGE") = static_cast<int>(ReduceOp::avg);
  m.attr("MIN") = static_cast<int>(ReduceOp::min);
  m.attr("MAX") = static_cast<int>(ReduceOp::max);
  m.attr("PRODUCT") = static_cast<int>(ReduceOp::prod);
  py::dict types;
  for (DataType t : {DataType::f16, DataType::bf16, DataType::f32, DataType::f64, DataType::i8, DataType::u8,
                     DataType::i32, DataType::i64})
    types[name_of(t)] = static_cast<int>(t);
  m.attr("DTYPES") = types;
}
