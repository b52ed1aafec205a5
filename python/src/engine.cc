#include "engine.h"

#include "host/reduce.h"
#include "process_engine.h"

#include <elasticrun/device.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

namespace elasticrun::python {

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


// The agreement before a collective: one allreduce (max) of these slots. A value v goes
// in as the pair (v, -v), so that every rank learns the largest and the smallest and
// all of them see a disagreement at once. A rank inside join() takes part in the
// agreements of the others with kNone in every pair (neutral for max), which tells it
// what they are about to run, and says so in the join slots.
enum Slot : int {
  kCount = 0, kType = 2, kShape = 4, kRoot = 6, kKind = 8, kOp = 10, kDevice = 12,  // pairs
  kAnyJoined = 14,     // 1 from a rank inside join()
  kAnyWorking = 15,    // 1 from a rank outside it: 0 once every rank joined
  kLastJoined = 16,    // a joined rank's claim to have joined last: -(rounds << 32) + rank
  kSlots = 17,
};
constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::min();

void put(std::int64_t* d, int slot, std::int64_t v) { d[slot] = v, d[slot + 1] = -v; }
bool agreed(const std::int64_t* d, int slot) { return d[slot] == -d[slot + 1]; }

// Why the ranks' agreement slots `d` (after the allreduce) disagree; empty if they agree.
std::string disagreement(const std::int64_t* d, const Request& r) {
  const char* what = kind_name(r.kind);
  if (!agreed(d, kKind))
    return fmt::format("{}: the ranks issue different collectives (this rank {}): every rank must issue the "
                       "same collectives in the same order",
                       what, what);
  if (!agreed(d, kDevice))
    return fmt::format("{}: some ranks pass GPU buffers, others host memory (this rank {})", what,
                       r.device >= 0 ? "GPU" : "host");
  if (!agreed(d, kType))
    return fmt::format("{}: the ranks pass different element types (this rank {})", what, name_of(r.type));
  if (!agreed(d, kCount))
    return fmt::format("{}: the ranks pass different element counts, from {} to {} (this rank {})", what,
                       -d[kCount + 1], d[kCount], r.count);
  if (!agreed(d, kRoot))
    return fmt::format("{}: the ranks name different root ranks, from {} to {} (this rank {})", what,
                       -d[kRoot + 1], d[kRoot], r.root);
  if (!agreed(d, kOp))
    return fmt::format("{}: the ranks pass different reduction ops (this rank {})", what, name_of(r.op));
  if (!agreed(d, kShape))
    return fmt::format("{}: the ranks pass tensors of different shapes with the same element count ({})", what,
                       r.count);
  return {};
}

bool reduces(Request::Kind k) { return k == Request::Kind::allreduce || k == Request::Kind::reduce_scatter; }

void check_agreement(Communicator& comm, const Request& r) {
  std::int64_t d[kSlots];
  put(d, kCount, static_cast<std::int64_t>(r.count));
  put(d, kType, static_cast<std::int64_t>(r.type));
  put(d, kShape, r.shape);
  put(d, kRoot, r.kind == Request::Kind::broadcast ? r.root : 0);
  put(d, kKind, static_cast<std::int64_t>(r.kind));
  put(d, kOp, reduces(r.kind) ? static_cast<std::int64_t>(r.op) : 0);
  put(d, kDevice, r.device >= 0 ? 1 : 0);
  d[kAnyJoined] = 0, d[kAnyWorking] = 1, d[kLastJoined] = kNone;
  comm.allreduce(d, d, kSlots, DataType::i64, ReduceOp::max);
  if (std::string why = disagreement(d, r); !why.empty()) throw Error(why);
  if (d[kAnyJoined] && r.kind != Request::Kind::allreduce && r.kind != Request::Kind::barrier)
    throw Error(fmt::format("{} is not supported while a rank has joined (join()): a joined rank takes part in "
                            "allreduce (with zeros) and barrier only",
                            kind_name(r.kind)));
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
  if (r.check) check_agreement(ctx.comm(), r);
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
  if (r.check) check_agreement(comm, r);
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

JoinRound join_round(Context& ctx, std::int64_t rounds) {
  Communicator& comm = ctx.comm();
  std::int64_t d[kSlots];
  std::fill(d, d + kSlots, kNone);
  d[kAnyJoined] = 1, d[kAnyWorking] = 0;
  d[kLastJoined] = -(rounds << 32) + comm.rank();
  comm.allreduce(d, d, kSlots, DataType::i64, ReduceOp::max);
  JoinRound j;
  if (d[kAnyWorking] == 0) {
    j.done = true;
    j.last = static_cast<int>(d[kLastJoined] & 0xFFFFFFFF);
    return j;
  }
  // The others' collective: join in where they will run it (they agree, and it is an
  // allreduce or a barrier); they raise otherwise, and so it is not run.
  Request r;
  r.kind = static_cast<Request::Kind>(d[kKind]);
  r.count = static_cast<std::size_t>(d[kCount]);
  r.type = static_cast<DataType>(d[kType]);
  r.op = static_cast<ReduceOp>(d[kOp]);
  r.root = static_cast<int>(d[kRoot]);
  r.device = d[kDevice] ? 0 : -1;
  bool all_agree = true;
  for (int s = kCount; s < kAnyJoined; s += 2) all_agree = all_agree && agreed(d, s);
  if (all_agree && (r.kind == Request::Kind::allreduce || r.kind == Request::Kind::barrier)) {
    j.kind = r.kind, j.count = r.count, j.type = r.type, j.op = r.op, j.on_device = r.device >= 0;
    j.take_part = true;
  }
  return j;
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
