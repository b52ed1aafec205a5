#include "engine.h"

#include "control/settings.h"
#include "host/reduce.h"
#include "process_engine.h"

#include <common/log.h>

#include <elasticrun/device.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>

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
  kCount = 0, kType = 2, kShape = 4, kRoot = 6, kKind = 8, kOp = 10, kDevice = 12, kKey = 14,  // pairs
  kAnyJoined = 16,     // 1 from a rank inside join()
  kAnyWorking = 17,    // 1 from a rank outside it: 0 once every rank joined
  kLastJoined = 18,    // a joined rank's claim to have joined last: -(rounds << 32) + rank
  kAnyNamed = 19,      // 1 from a rank whose collective is named
  kAnyFixed = 20,      // 1 from a rank whose task may not be put off (Request::reorderable)
  kSlots = 21,
};
constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::min();

void put(std::int64_t* d, int slot, std::int64_t v) { d[slot] = v, d[slot + 1] = -v; }
bool agreed(const std::int64_t* d, int slot) { return d[slot] == -d[slot + 1]; }

// Why the ranks' agreement slots `d` (after the allreduce) disagree; empty if they agree.
std::string disagreement(const std::int64_t* d, const Request& r) {
  const char* what = kind_name(r.kind);
  if (!agreed(d, kKind) || !agreed(d, kKey))
    return fmt::format("{}: the ranks issue different collectives (this rank {}{}): every rank must issue the "
                       "same collectives in the same order, or name them",
                       what, what, r.key && r.key != barrier_key() ? ", named" : "");
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

// The engine whose task runs on this thread (set by Engine::attempt), for negotiate().
thread_local Engine* tl_engine = nullptr;

// Thrown through a task when a negotiation chose the collective of `key` to run first;
// not a std::exception, so that nothing on the way takes it for an error.
struct Reorder {
  std::uint64_t key;
};

// The ranks' next collectives differ and one of them is named: every rank gathers every
// rank's pending keys (Engine::pending_keys) and the first of rank 0's that every rank
// has is run first, everywhere (Reorder). When there is none yet (a rank has not issued
// it), again a millisecond later, until one is or ELASTICRUN_COLLECTIVE_TIMEOUT passes:
// the decision to give up is taken together, from every rank's clock, then `why`.
[[noreturn]] void negotiate(Communicator& comm, const std::string& why) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto give_up = start + collective::settings::collective_timeout();
  bool warned = false;
  const int n = comm.size();
  for (;;) {
    std::vector<std::uint64_t> mine = tl_engine->pending_keys();
    std::int64_t head[2] = {static_cast<std::int64_t>(mine.size()), Clock::now() >= give_up ? 1 : 0};
    std::vector<std::int64_t> heads(2 * static_cast<std::size_t>(n));
    comm.allgather(head, heads.data(), 2, DataType::i64);
    std::vector<std::size_t> counts(n), at(n + 1, 0);
    bool out_of_time = false;
    for (int q = 0; q < n; ++q) {
      counts[q] = static_cast<std::size_t>(heads[2 * q]);
      at[q + 1] = at[q] + counts[q];
      out_of_time = out_of_time || heads[2 * q + 1] != 0;
    }
    std::vector<std::uint64_t> all(at[n] + 1);
    comm.allgatherv(mine.data(), all.data(), counts, DataType::i64);
    if (out_of_time)
      throw Error(fmt::format("{}; no named collective was issued by every rank within {} s", why,
                              std::chrono::duration_cast<std::chrono::seconds>(give_up - start).count()));
    for (std::size_t i = 0; i < counts[0]; ++i) {
      const std::uint64_t k = all[i];
      bool everywhere = true;
      for (int q = 1; q < n && everywhere; ++q)
        everywhere = std::find(all.begin() + at[q], all.begin() + at[q + 1], k) != all.begin() + at[q + 1];
      if (everywhere) throw Reorder{k};
    }
    if (!warned && Clock::now() - start > std::chrono::seconds(10)) {
      warned = true;
      ER_LOG(collective, warn, "waiting for the ranks to issue a named collective that every rank has ({})", why);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void check_agreement(Communicator& comm, const Request& r) {
  std::int64_t d[kSlots];
  put(d, kCount, static_cast<std::int64_t>(r.count));
  put(d, kType, static_cast<std::int64_t>(r.type));
  put(d, kShape, r.shape);
  put(d, kRoot, r.kind == Request::Kind::broadcast ? r.root : 0);
  put(d, kKind, static_cast<std::int64_t>(r.kind));
  put(d, kOp, reduces(r.kind) ? static_cast<std::int64_t>(r.op) : 0);
  put(d, kDevice, r.device >= 0 ? 1 : 0);
  put(d, kKey, static_cast<std::int64_t>(r.key >> 1));  // 63 bits: the pair's negation never overflows
  d[kAnyJoined] = 0, d[kAnyWorking] = 1, d[kLastJoined] = kNone;
  d[kAnyNamed] = r.key != 0 && r.key != barrier_key() ? 1 : 0;
  d[kAnyFixed] = r.reorderable ? 0 : 1;
  comm.allreduce(d, d, kSlots, DataType::i64, ReduceOp::max);
  if (std::string why = disagreement(d, r); !why.empty()) {
    // Different collectives, named ones among them: negotiate, where every rank's task
    // can wait (and no rank is inside join(), which takes no part in a negotiation).
    if ((!agreed(d, kKind) || !agreed(d, kKey)) && d[kAnyNamed] && !d[kAnyFixed] && !d[kAnyJoined] && r.set == 0 &&
        tl_engine)
      negotiate(comm, why);
    throw Error(why);
  }
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

std::uint64_t name_key(const std::string& name) {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a: the same in every process
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h | 2;  // never 0, never barrier_key() (1)
}

std::uint64_t barrier_key() { return 1; }

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

void Engine::check_unique(const Named& n) const {
  if (!n.unique || !n.key) return;
  auto held = held_.find(n.key);
  if (in_flight_.count(n.key) || (held != held_.end() && held->second > std::chrono::steady_clock::now()))
    throw DuplicateName("a collective named '" + n.name +
                        "' is in flight already: names of pending collectives must be unique");
}

std::shared_ptr<Completion> Engine::submit(Task t, const Named& named, bool hold) {
  auto c = std::make_shared<Completion>();
  {
    std::lock_guard lock(mu_);
    check_unique(named);
    if (named.unique && named.key) in_flight_.insert(named.key);
    queue_.push_back({std::move(t), c, named, std::chrono::steady_clock::now() + name_hold(), hold});
  }
  cv_.notify_one();
  return c;
}

void Engine::release(std::uint64_t key) {
  std::lock_guard lock(mu_);
  held_.erase(key);
}

bool Engine::drain_until(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mu_);
  return idle_cv_.wait_until(lock, deadline, [this] { return queue_.empty() && !busy_; });
}

std::vector<std::uint64_t> Engine::pending_keys() {
  std::lock_guard lock(mu_);
  std::vector<std::uint64_t> keys;
  if (running_key_) keys.push_back(running_key_);
  for (const auto& q : queue_)
    if (q.named.key) keys.push_back(q.named.key);
  return keys;
}

std::exception_ptr Engine::attempt(const Task& t, std::uint64_t& next) noexcept {
  next = 0;
  Engine* outer = tl_engine;
  tl_engine = this;
  std::exception_ptr error;
  try {
    t(ctx_);
  } catch (const Reorder& r) {
    next = r.key;
  } catch (...) {
    error = std::current_exception();
  }
  tl_engine = outer;
  return error;
}

void Engine::ran() {
  busy_ = false;
  if (queue_.empty()) idle_cv_.notify_all();
  else cv_.notify_one();  // queued behind an inline task: the thread's turn
}

bool Engine::try_run(const Task& t, std::exception_ptr& error, const Named& named) {
  std::unique_lock lock(mu_);
  if (busy_ || !queue_.empty()) return false;
  check_unique(named);
  busy_ = true;
  running_key_ = named.key;
  lock.unlock();
  for (;;) {
    std::uint64_t next = 0;
    error = attempt(t, next);
    if (next == 0) break;
    // Nothing else is pending here: the negotiation can only have chosen this task.
    if (next != named.key) {
      error = std::make_exception_ptr(Error("negotiation chose a collective this rank has not issued"));
      break;
    }
  }
  lock.lock();
  running_key_ = 0;
  ran();
  return true;
}

void Engine::run(const Task& t, const Named& named) {
  std::exception_ptr error;
  if (try_run(t, error, named)) {
    if (error) std::rethrow_exception(error);
    return;
  }
  // Something was issued before: take a place behind it. Its caller has seen it done
  // when this returns, so its name is free at once (no hold).
  auto c = submit(t, named, false);
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
    Queued q = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    running_key_ = q.named.key;
    lock.unlock();
    std::uint64_t next = 0;
    std::exception_ptr error = attempt(q.task, next);
    lock.lock();
    running_key_ = 0;
    if (next != 0) {
      // A negotiation chose the task of `next` (maybe this one) to run first: this one
      // goes back to the front, that one before it.
      queue_.push_front(std::move(q));
      auto chosen = std::find_if(queue_.begin(), queue_.end(), [next](const Queued& e) { return e.named.key == next; });
      if (chosen == queue_.end()) {
        q = std::move(queue_.front());
        queue_.pop_front();
        error = std::make_exception_ptr(Error("negotiation chose a collective this rank has not issued"));
      } else {
        if (chosen != queue_.begin()) {
          Queued c = std::move(*chosen);
          queue_.erase(chosen);
          queue_.push_front(std::move(c));
        }
        busy_ = false;
        continue;
      }
    }
    if (q.named.unique && q.named.key) {
      in_flight_.erase(in_flight_.find(q.named.key));
      const auto now = std::chrono::steady_clock::now();
      std::erase_if(held_, [now](const auto& h) { return h.second <= now; });
      if (q.hold && now < q.held_until) held_[q.named.key] = q.held_until;
    }
    lock.unlock();
    q.completion->finish(error);
    lock.lock();
    ran();
  }
}

}  // namespace elasticrun::python
