#include "c10d/process_group.h"

#include "c10d/collectives.h"
#include "c10d/tensors.h"
#include "process_engine.h"

#include <Python.h>
#include <c10/util/accumulate.h>
#include <fmt/format.h>

#include <stdexcept>

namespace elasticrun::python::c10d {
namespace {

using ::c10d::OpType;

Request request(Request::Kind kind, const void* in, void* out, std::size_t count, DataType type) {
  Request r;
  r.kind = kind, r.in = in, r.out = out, r.count = count, r.type = type, r.check = shape_check();
  return r;
}

std::uint64_t joined_epoch() {
  TORCH_CHECK(process_engine_started(), "elasticrun: the elasticrun backend needs elasticrun.init() first ",
              "(import elasticrun.torch registers the backend, whose init_process_group joins the job)");
  return elasticrun::context().topology().epoch;
}

// The library's error, of the same type (elasticrun's exception classes in Python),
// with the operation named. The elastic ones also name their Python class in the text:
// torch's autograd engine turns an error that reaches backward() (DDP's reducer waits
// on the futures there) into a RuntimeError with that text only, and
// elasticrun.torch.elastic.run tells a reset from other errors by it.
std::exception_ptr with_context(std::exception_ptr e, const char* what) {
  auto msg = [what](const std::exception& x, const char* cls = nullptr) {
    if (cls) return fmt::format("elasticrun process group: {}: {}: {}", what, cls, x.what());
    return fmt::format("elasticrun process group: {}: {}", what, x.what());
  };
  try {
    std::rethrow_exception(e);
  } catch (const WorkersFailed& x) {
    return std::make_exception_ptr(WorkersFailed(msg(x, "WorkersFailedError")));
  } catch (const HostsUpdated& x) {
    return std::make_exception_ptr(HostsUpdated(msg(x, "HostsUpdatedError")));
  } catch (const TimeoutError& x) {
    return std::make_exception_ptr(TimeoutError(msg(x, "ElasticTimeoutError")));
  } catch (const ProtocolError& x) {
    return std::make_exception_ptr(ProtocolError(msg(x)));
  } catch (const Error& x) {
    return std::make_exception_ptr(Error(msg(x)));
  } catch (const std::exception& x) {
    return std::make_exception_ptr(std::runtime_error(msg(x)));
  } catch (...) {
    return e;
  }
}

std::vector<void*> pointers(const std::vector<at::Tensor>& ts) {
  std::vector<void*> p;
  for (const auto& t : ts) p.push_back(t.data_ptr());
  return p;
}

std::vector<const void*> const_pointers(const std::vector<at::Tensor>& ts) {
  std::vector<const void*> p;
  for (const auto& t : ts) p.push_back(t.data_ptr());
  return p;
}

// A tensor cut into blocks of rows along its first dimension: `splits` rows each, or
// equal shares of `n` when there are no splits (alltoall_base's convention).
template <class B>
std::vector<B> blocks_of(const at::Tensor& t, const std::vector<int64_t>& splits, int n, const char* side) {
  TORCH_CHECK(t.dim() >= 1, "elasticrun: alltoall_base: the ", side, " tensor needs a first dimension to split");
  const int64_t rows = t.size(0);
  const std::size_t row_bytes = t.element_size() * c10::multiply_integers(t.sizes().slice(1));
  std::vector<int64_t> s = splits;
  if (s.empty()) {
    TORCH_CHECK(rows % n == 0, "elasticrun: alltoall_base: ", rows, " rows of the ", side,
                " tensor do not split into ", n, " equal blocks; pass split sizes");
    s.assign(n, rows / n);
  }
  TORCH_CHECK(s.size() == static_cast<std::size_t>(n), "elasticrun: alltoall_base: ", s.size(), " ", side,
              " split sizes for ", n, " ranks");
  int64_t sum = 0;
  for (auto v : s) {
    TORCH_CHECK(v >= 0, "elasticrun: alltoall_base: a negative ", side, " split size");
    sum += v;
  }
  TORCH_CHECK(sum == rows, "elasticrun: alltoall_base: the ", side, " split sizes add up to ", sum, ", the tensor has ",
              rows, " rows");
  std::vector<B> b;
  auto* base = static_cast<char*>(t.data_ptr());
  for (auto v : s) {
    b.push_back({base, static_cast<std::size_t>(v) * row_bytes});
    base += static_cast<std::size_t>(v) * row_bytes;
  }
  return b;
}

}  // namespace

ProcessGroup::ProcessGroup(int rank, int size)
    : ::c10d::ProcessGroup(rank, size), epoch_(joined_epoch()), completer_(std::make_unique<Completer>()) {
  const Topology& t = elasticrun::context().topology();
  TORCH_CHECK(rank == t.rank && size == t.size, "elasticrun: torch.distributed gives this process rank ", rank, " of ",
              size, " (RANK and WORLD_SIZE, or init_process_group's rank and world_size), elasticrun rank ", t.rank,
              " of ", t.size, ": the elasticrun backend's ranks are elasticrun's (pass elasticrun.rank() and "
              "elasticrun.size(), or leave them to the environment the driver sets)");
  init();
}

ProcessGroup::~ProcessGroup() {
  // The completions still to run may be Python callbacks, which take the GIL.
  PyThreadState* saved = Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
  completer_.reset();
  if (saved) PyEval_RestoreThread(saved);
}

int ProcessGroup::root_of(std::int64_t root, const char* what) const {
  TORCH_CHECK(root >= 0 && root < size_, "elasticrun: ", what, ": root rank ", root, " is not a rank of ", size_);
  return static_cast<int>(root);
}

c10::intrusive_ptr<Work> ProcessGroup::enqueue(OpType type, const char* what, Tensors result, Tensors keep,
                                               std::function<void(Context&)> run) {
  std::size_t bytes = 0;
  for (const auto* ts : {&result, &keep})
    for (const auto& t : *ts) bytes += t.nbytes();
  auto work = c10::make_intrusive<Work>(rank_, type, nullptr, std::move(result), std::move(keep));
  // The collective, with the library's errors named after this operation.
  auto body = [what, epoch = epoch_, run = std::move(run)](Context& ctx) {
    try {
      if (ctx.topology().epoch != epoch)
        throw Error(fmt::format("this process group was made in epoch {} and the job is in epoch {} now: make a "
                                "new one (destroy_process_group, then init_process_group)",
                                epoch, ctx.topology().epoch));
      run(ctx);
    } catch (...) {
      std::rethrow_exception(with_context(std::current_exception(), what));
    }
  };
  // Handing a collective to the engine's thread and its completion to the Completer's
  // costs two thread wake-ups (about 30 us on a 2-core machine, against 3 us for the
  // same 8-byte allreduce through elasticrun.torch): more than a small collective takes.
  // So when nothing is queued, a small one runs here and now, in its turn all the same,
  // and its future's callbacks run on this thread (a callback that issues another
  // collective and waits finds the engine idle: no deadlock). Not while this thread
  // holds the GIL (torch releases it around its collective calls): other Python threads
  // would stop for the collective's length. Larger ones go to the engine's thread, so
  // that DDP's backward() goes on computing while its buckets are reduced.
  if (bytes <= kInlineMaxBytes && !(Py_IsInitialized() && PyGILState_Check())) {
    std::exception_ptr error;
    if (process_engine().try_run(body, error)) {
      inline_runs_.fetch_add(1, std::memory_order_relaxed);
      work->complete(error);
      return work;
    }
  }
  Completer* completer = completer_.get();  // outlives the task: ~ProcessGroup waits for it
  completer->expect();
  try {
    // mutable: the task hands its reference to the work on to the completion, so that
    // the engine's thread never drops the last one (which may release tensors that
    // take the GIL, maybe while the interpreter finalizes).
    process_engine().submit([work, completer, body = std::move(body)](Context& ctx) mutable {
      std::exception_ptr error;
      try {
        body(ctx);
      } catch (...) {
        error = std::current_exception();
      }
      completer->post([work = std::move(work), error] { work->complete(error); });
    });
  } catch (const Error& e) {
    completer->forget();
    TORCH_CHECK(false, "elasticrun: ", what, ": ", e.what());
  }
  return work;
}

ProcessGroup::WorkPtr ProcessGroup::allreduce(Tensors& tensors, const ::c10d::AllreduceOptions& opts) {
  const char* what = "allreduce";
  Buffer b = reducible(single(tensors, what), what);
  Request r = request(Request::Kind::allreduce, b.data, b.data, b.count, b.type);
  r.op = reduce_op(opts.reduceOp, what);
  return enqueue(OpType::ALLREDUCE, what, tensors, {}, [r](Context& ctx) { execute(ctx, r); });
}

ProcessGroup::WorkPtr ProcessGroup::allreduce_coalesced(Tensors& tensors,
                                                        const ::c10d::AllreduceCoalescedOptions& opts) {
  const char* what = "allreduce_coalesced";
  TORCH_CHECK(!tensors.empty(), "elasticrun: allreduce_coalesced: no tensors");
  std::vector<void*> bufs;
  std::vector<std::size_t> counts;
  const DataType type = reducible(tensors[0], what).type;
  for (const auto& t : tensors) {
    Buffer b = reducible(t, what);
    TORCH_CHECK(b.type == type, "elasticrun: allreduce_coalesced: the tensors must have one element type: ",
                t.scalar_type(), " and ", tensors[0].scalar_type());
    bufs.push_back(b.data);
    counts.push_back(b.count);
  }
  const ReduceOp op = reduce_op(opts.reduceOp, what);
  return enqueue(OpType::ALLREDUCE_COALESCED, what, tensors, {},
                 [bufs, counts, type, op, check = shape_check()](Context& ctx) {
                   allreduce_concatenated(ctx, bufs, counts, type, op, check);
                 });
}

ProcessGroup::WorkPtr ProcessGroup::broadcast(Tensors& tensors, const ::c10d::BroadcastOptions& opts) {
  const char* what = "broadcast";
  TORCH_CHECK(opts.rootTensor == 0, "elasticrun: broadcast: root tensor ", opts.rootTensor, " of one tensor");
  Buffer b = movable(single(tensors, what), what);
  Request r = request(Request::Kind::broadcast, nullptr, b.data, b.count, b.type);
  r.root = root_of(opts.rootRank, what);
  return enqueue(OpType::BROADCAST, what, tensors, {}, [r](Context& ctx) { execute(ctx, r); });
}

ProcessGroup::WorkPtr ProcessGroup::reduce(Tensors& tensors, const ::c10d::ReduceOptions& opts) {
  const char* what = "reduce";
  TORCH_CHECK(opts.rootTensor == 0, "elasticrun: reduce: root tensor ", opts.rootTensor, " of one tensor");
  Buffer b = reducible(single(tensors, what), what);
  const ReduceOp op = reduce_op(opts.reduceOp, what);
  return enqueue(OpType::REDUCE, what, tensors, {},
                 [b, op, root = root_of(opts.rootRank, what), check = shape_check()](Context& ctx) {
                   reduce_to(ctx, b.data, b.count, b.type, op, root, check);
                 });
}

ProcessGroup::WorkPtr ProcessGroup::allgather(std::vector<Tensors>& outputs, Tensors& inputs,
                                              const ::c10d::AllgatherOptions&) {
  const char* what = "allgather";
  const at::Tensor& in = single(inputs, what);
  TORCH_CHECK(outputs.size() == 1, "elasticrun: allgather: one list of output tensors (for the one input), got ",
              outputs.size());
  Buffer b = movable(in, what);
  check_like(outputs[0], in, size_, what);
  if (adjacent(outputs[0])) {
    Request r = request(Request::Kind::allgather, b.data, outputs[0][0].data_ptr(), b.count, b.type);
    return enqueue(OpType::ALLGATHER, what, outputs[0], inputs, [r](Context& ctx) { execute(ctx, r); });
  }
  return enqueue(OpType::ALLGATHER, what, outputs[0], inputs,
                 [b, outs = pointers(outputs[0]), check = shape_check()](Context& ctx) {
                   allgather_into(ctx, b.data, b.count, b.type, outs, check);
                 });
}

ProcessGroup::WorkPtr ProcessGroup::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                    const ::c10d::AllgatherOptions&) {
  const char* what = "_allgather_base";
  Buffer in = movable(input, what), out = movable(output, what);
  TORCH_CHECK(output.scalar_type() == input.scalar_type() && output.numel() == input.numel() * size_,
              "elasticrun: _allgather_base: the output (", output.numel(), " ", output.scalar_type(),
              ") must hold size() times the input (", input.numel(), " ", input.scalar_type(), ")");
  Request r = request(Request::Kind::allgather, in.data, out.data, in.count, in.type);
  return enqueue(OpType::_ALLGATHER_BASE, what, {output}, {input}, [r](Context& ctx) { execute(ctx, r); });
}

ProcessGroup::WorkPtr ProcessGroup::gather(std::vector<Tensors>& outputs, Tensors& inputs,
                                           const ::c10d::GatherOptions& opts) {
  const char* what = "gather";
  const at::Tensor& in = single(inputs, what);
  Buffer b = movable(in, what);
  const int root = root_of(opts.rootRank, what);
  Tensors result;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1, "elasticrun: gather: the root passes one list of output tensors, got ",
                outputs.size());
    check_like(outputs[0], in, size_, what);
    result = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "elasticrun: gather: only the root (rank ", root, ") passes output tensors");
  }
  return enqueue(OpType::GATHER, what, result, inputs,
                 [b, outs = pointers(result), root, check = shape_check()](Context& ctx) {
                   gather_to(ctx, b.data, b.count, b.type, outs, root, check);
                 });
}

ProcessGroup::WorkPtr ProcessGroup::scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                                            const ::c10d::ScatterOptions& opts) {
  const char* what = "scatter";
  const at::Tensor& out = single(outputs, what);
  Buffer b = movable(out, what);
  const int root = root_of(opts.rootRank, what);
  Tensors keep;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1, "elasticrun: scatter: the root passes one list of input tensors, got ",
                inputs.size());
    check_like(inputs[0], out, size_, what);
    keep = inputs[0];
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "elasticrun: scatter: only the root (rank ", root, ") passes input tensors");
  }
  return enqueue(OpType::SCATTER, what, outputs, keep,
                 [b, ins = const_pointers(keep), root, check = shape_check()](Context& ctx) {
                   scatter_from(ctx, ins, b.data, b.count, b.type, root, check);
                 });
}

ProcessGroup::WorkPtr ProcessGroup::reduce_scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                                                   const ::c10d::ReduceScatterOptions& opts) {
  const char* what = "reduce_scatter";
  const at::Tensor& out = single(outputs, what);
  TORCH_CHECK(inputs.size() == 1, "elasticrun: reduce_scatter: one list of input tensors (for the one output), got ",
              inputs.size());
  Buffer b = reducible(out, what);
  check_like(inputs[0], out, size_, what);
  const ReduceOp op = reduce_op(opts.reduceOp, what);
  if (adjacent(inputs[0])) {
    Request r = request(Request::Kind::reduce_scatter, inputs[0][0].data_ptr(), b.data, b.count, b.type);
    r.op = op;
    return enqueue(OpType::REDUCE_SCATTER, what, outputs, inputs[0], [r](Context& ctx) { execute(ctx, r); });
  }
  return enqueue(OpType::REDUCE_SCATTER, what, outputs, inputs[0],
                 [b, op, ins = const_pointers(inputs[0]), check = shape_check()](Context& ctx) {
                   reduce_scatter_from(ctx, ins, b.data, b.count, b.type, op, check);
                 });
}

ProcessGroup::WorkPtr ProcessGroup::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                         const ::c10d::ReduceScatterOptions& opts) {
  const char* what = "_reduce_scatter_base";
  Buffer out = reducible(output, what), in = reducible(input, what);
  TORCH_CHECK(output.scalar_type() == input.scalar_type() && input.numel() == output.numel() * size_,
              "elasticrun: _reduce_scatter_base: the input (", input.numel(), " ", input.scalar_type(),
              ") must hold size() times the output (", output.numel(), " ", output.scalar_type(), ")");
  Request r = request(Request::Kind::reduce_scatter, in.data, out.data, out.count, out.type);
  r.op = reduce_op(opts.reduceOp, what);
  return enqueue(OpType::_REDUCE_SCATTER_BASE, what, {output}, {input}, [r](Context& ctx) { execute(ctx, r); });
}

ProcessGroup::WorkPtr ProcessGroup::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                  std::vector<int64_t>& output_splits,
                                                  std::vector<int64_t>& input_splits, const ::c10d::AllToAllOptions&) {
  const char* what = "alltoall_base";
  Buffer out = movable(output, what), in = movable(input, what);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "elasticrun: alltoall_base: input ", input.scalar_type(),
              ", output ", output.scalar_type());
  if (output_splits.empty() && input_splits.empty()) {
    TORCH_CHECK(in.count == out.count && in.count % size_ == 0, "elasticrun: alltoall_base: without split sizes, ",
                "input and output hold the same number of elements, a multiple of ", size_, " (", input.numel(),
                " and ", output.numel(), ")");
    Request r = request(Request::Kind::alltoall, in.data, out.data, in.count / size_, in.type);
    return enqueue(OpType::ALLTOALL_BASE, what, {output}, {input}, [r](Context& ctx) { execute(ctx, r); });
  }
  auto sends = blocks_of<Block>(input, input_splits, size_, "input");
  auto recvs = blocks_of<MutableBlock>(output, output_splits, size_, "output");
  return enqueue(OpType::ALLTOALL_BASE, what, {output}, {input},
                 [sends, recvs](Context& ctx) { alltoallv(ctx, sends, recvs); });
}

ProcessGroup::WorkPtr ProcessGroup::alltoall(Tensors& outputs, Tensors& inputs, const ::c10d::AllToAllOptions&) {
  const char* what = "alltoall";
  TORCH_CHECK(outputs.size() == static_cast<std::size_t>(size_) && inputs.size() == outputs.size(),
              "elasticrun: alltoall: one input and one output tensor per rank (", size_, "), got ", inputs.size(),
              " and ", outputs.size());
  std::vector<Block> sends;
  std::vector<MutableBlock> recvs;
  bool equal = true;
  for (int j = 0; j < size_; ++j) {
    Buffer in = movable(inputs[j], what), out = movable(outputs[j], what);
    TORCH_CHECK(inputs[j].scalar_type() == inputs[0].scalar_type() &&
                    outputs[j].scalar_type() == inputs[0].scalar_type(),
                "elasticrun: alltoall: the tensors must have one element type");
    equal = equal && in.count == movable(inputs[0], what).count && out.count == in.count;
    sends.push_back({in.data, static_cast<std::size_t>(inputs[j].nbytes())});
    recvs.push_back({out.data, static_cast<std::size_t>(outputs[j].nbytes())});
  }
  if (equal && adjacent(inputs) && adjacent(outputs)) {
    Buffer in = movable(inputs[0], what);
    Request r = request(Request::Kind::alltoall, in.data, outputs[0].data_ptr(), in.count, in.type);
    return enqueue(OpType::ALLTOALL, what, outputs, inputs, [r](Context& ctx) { execute(ctx, r); });
  }
  return enqueue(OpType::ALLTOALL, what, outputs, inputs,
                 [sends, recvs](Context& ctx) { alltoallv(ctx, sends, recvs); });
}

ProcessGroup::WorkPtr ProcessGroup::barrier(const ::c10d::BarrierOptions&) {
  return enqueue(OpType::BARRIER, "barrier", {}, {},
                 [](Context& ctx) { execute(ctx, request(Request::Kind::barrier, nullptr, nullptr, 0, DataType::u8)); });
}

}  // namespace elasticrun::python::c10d
