#include "engine.h"

#include "host/reduce.h"
#include "process_engine.h"

#include <elasticrun/device.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace elasticrun::python {
namespace {

// buf[i] *= factor, in the element's own precision (f16 and bf16 through float).
void scale(DataType t, void* buf, std::size_t n, double factor) {
  switch (t) {
    case DataType::f32: {
      auto* p = static_cast<float*>(buf);
      const float f = static_cast<float>(factor);
      for (std::size_t i = 0; i < n; ++i) p[i] *= f;
      return;
    }
    case DataType::f64: {
      auto* p = static_cast<double*>(buf);
      for (std::size_t i = 0; i < n; ++i) p[i] *= factor;
      return;
    }
    case DataType::f16: {
      auto* p = static_cast<std::uint16_t*>(buf);
      const float f = static_cast<float>(factor);
      for (std::size_t i = 0; i < n; ++i) p[i] = collective::float_to_half(collective::half_to_float(p[i]) * f);
      return;
    }
    case DataType::bf16: {
      auto* p = static_cast<std::uint16_t*>(buf);
      const float f = static_cast<float>(factor);
      for (std::size_t i = 0; i < n; ++i)
        p[i] = collective::float_to_bfloat16(collective::bfloat16_to_float(p[i]) * f);
      return;
    }
    default:
      throw Error(std::string("prescale and postscale factors need a floating-point type, not ") + name_of(t));
  }
}

void allreduce(Communicator& comm, const Request& r) {
  if (r.prescale == 1.0) {
    comm.allreduce(r.in, r.out, r.count, r.type, r.op);
  } else {
    // Scaled into the output first, so the caller's input is never modified.
    if (r.out != r.in) std::memcpy(r.out, r.in, r.count * size_of(r.type));
    scale(r.type, r.out, r.count, r.prescale);
    comm.allreduce(r.out, r.out, r.count, r.type, r.op);
  }
  if (r.postscale != 1.0) scale(r.type, r.out, r.count, r.postscale);
}

const char* kind_name(Request::Kind k) {
  switch (k) {
    case Request::Kind::allreduce: return "allreduce";
    case Request::Kind::broadcast: return "broadcast";
    case Request::Kind::allgather: return "allgather";
    case Request::Kind::allgatherv: return "allgatherv";
    case Request::Kind::reduce_scatter: return "reduce_scatter";
    case Request::Kind::alltoall: return "alltoall";
    case Request::Kind::barrier: return "barrier";
  }
  return "?";
}

// max over ranks of (count, -count, type, -type, shape, -shape, root, -root): every rank
// learns the largest and the smallest of each, so all of them see a disagreement at once.
void check_agreement(Communicator& comm, const Request& r) {
  const auto count = static_cast<std::int64_t>(r.count), type = static_cast<std::int64_t>(r.type);
  const std::int64_t root = r.kind == Request::Kind::broadcast ? r.root : 0;
  std::int64_t d[8] = {count, -count, type, -type, r.shape, -r.shape, root, -root};
  comm.allreduce(d, d, 8, DataType::i64, ReduceOp::max);
  if (d[0] == -d[1] && d[2] == -d[3] && d[4] == -d[5] && d[6] == -d[7]) return;
  if (d[2] != -d[3])
    throw Error(fmt::format("{}: the ranks pass different element types (this rank {})", kind_name(r.kind),
                            name_of(r.type)));
  if (d[0] != -d[1])
    throw Error(fmt::format("{}: the ranks pass different element counts, from {} to {} (this rank {})",
                            kind_name(r.kind), -d[1], d[0], count));
  if (d[6] != -d[7])
    throw Error(fmt::format("{}: the ranks name different root ranks, from {} to {} (this rank {})",
                            kind_name(r.kind), -d[7], d[6], root));
  throw Error(fmt::format("{}: the ranks pass tensors of different shapes with the same element count ({})",
                          kind_name(r.kind), count));
}

// A request on GPU memory: the agreement check (if asked) on the host communicator, then
// NCCL. Refused before any collective where this process cannot run one (no NCCL backend,
// no CUDA device), so every rank that passes device buffers gets the same error at once:
// device::Collectives would otherwise take a pointer it cannot place for host memory.
void execute_on_device(Context& ctx, const Request& r) {
  const char* what = kind_name(r.kind);
  std::string why;
  if (!device::available(&why))
    throw Error(fmt::format("{}: the buffers are on CUDA device {}, but this process has no device "
                            "collectives: {}",
                            what, r.device, why));
  if (r.prescale != 1.0 || r.postscale != 1.0)
    throw Error(fmt::format("{}: prescale and postscale factors are not applied to device buffers here "
                            "(elasticrun.torch scales them with torch)",
                            what));
  {
    // A pointer CUDA does not place on a device would take Collectives' host path.
    device::CurrentDevice on(r.device);
    if (device::memory_of(r.out) != device::Memory::device)
      throw Error(fmt::format("{}: the output buffer is not GPU memory that CUDA knows of (device {})", what,
                              r.device));
  }
  if (r.check && r.kind != Request::Kind::barrier) check_agreement(ctx.comm(), r);
  device::Collectives& d = process_device_collectives(r.device);
  switch (r.kind) {
    case Request::Kind::allreduce: return d.allreduce(r.in, r.out, r.count, r.type, r.op, r.stream);
    case Request::Kind::broadcast: return d.broadcast(r.out, r.count, r.type, r.root, r.stream);
    case Request::Kind::allgather: return d.allgather(r.in, r.out, r.count, r.type, r.stream);
    case Request::Kind::reduce_scatter: return d.reduce_scatter(r.in, r.out, r.count, r.type, r.op, r.stream);
    case Request::Kind::alltoall: return d.alltoall(r.in, r.out, r.count, r.type, r.stream);
    case Request::Kind::allgatherv:
    case Request::Kind::barrier: break;
  }
  throw Error(fmt::format("{}: not available on device buffers", what));
}

}  // namespace

Communicator& communicator(Context& ctx, int set, const std::vector<int>& members) {
  // comm() is looked up for each request: a re-join replaces it (and its subsets).
  return set == 0 ? ctx.comm() : ctx.comm().subset(set, members);
}

void execute(Context& ctx, const Request& r) {
  if (r.device >= 0) {
    if (r.set != 0)
      throw Error(fmt::format("{}: process sets run in host memory (elasticrun.torch moves a CUDA tensor's "
                              "data there for them)",
                              kind_name(r.kind)));
    return execute_on_device(ctx, r);
  }
  Communicator& comm = communicator(ctx, r.set, r.members);
  if (r.check && r.kind != Request::Kind::barrier) check_agreement(comm, r);
  switch (r.kind) {
    case Request::Kind::allreduce: return allreduce(comm, r);
    case Request::Kind::broadcast: return comm.broadcast(r.out, r.count, r.type, r.root);
    case Request::Kind::allgather: return comm.allgather(r.in, r.out, r.count, r.type);
    case Request::Kind::allgatherv: return comm.allgatherv(r.in, r.out, r.counts, r.type);
    case Request::Kind::reduce_scatter: return comm.reduce_scatter(r.in, r.out, r.count, r.type, r.op);
    case Request::Kind::alltoall: return comm.alltoall(r.in, r.out, r.count, r.type);
    case Request::Kind::barrier: return comm.barrier();
  }
}

bool Completion::done() const {
  std::lock_guard lock(mu_);
  return done_;
}

bool Completion::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return done_; })) return false;
  if (error_) std::rethrow_exception(error_);
  return true;
}

void Completion::finish(std::exception_ptr error) {
  {
    std::lock_guard lock(mu_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

Engine::Engine(Context& ctx) : ctx_(ctx), thread_([this] { loop(); }) {}

Engine::~Engine() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<Completion> Engine::submit(Task t) {
  auto c = std::make_shared<Completion>();
  {
    std::lock_guard lock(mu_);
    queue_.emplace_back(std::move(t), c);
  }
  cv_.notify_one();
  return c;
}

std::exception_ptr Engine::attempt(const Task& t) noexcept {
  try {
    t(ctx_);
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

void Engine::ran() {
  busy_ = false;
  if (queue_.empty()) idle_cv_.notify_all();
  else cv_.notify_one();  // queued behind an inline task: the thread's turn
}

bool Engine::try_run(const Task& t, std::exception_ptr& error) {
  std::unique_lock lock(mu_);
  if (busy_ || !queue_.empty()) return false;
  busy_ = true;
  lock.unlock();
  error = attempt(t);
  lock.lock();
  ran();
  return true;
}

void Engine::run(const Task& t) {
  std::exception_ptr error;
  if (try_run(t, error)) {
    if (error) std::rethrow_exception(error);
    return;
  }
  // Something was issued before: take a place behind it.
  auto c = submit(t);
  while (!c->wait_for(std::chrono::hours(1))) {
  }
}

void Engine::drain() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

void Engine::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || (!queue_.empty() && !busy_); });
    if (queue_.empty()) {
      if (stop_) return;
      continue;
    }
    auto [task, completion] = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    completion->finish(attempt(task));
    lock.lock();
    ran();
  }
}

}  // namespace elasticrun::python
