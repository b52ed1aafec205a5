// The Python package's collective engine: runs collectives of the process-wide Context
// in the order they were issued, either at once on the caller's thread or later on a
// thread of its own (the asynchronous forms, and DistributedOptimizer's gradient
// hooks, which issue allreduces while backward() is still running).
//
// Ordering is the contract: every rank must run the same collectives in the same order,
// and a synchronous call issued after asynchronous ones must not overtake them. So a
// synchronous call runs inline only when nothing is queued or running (the common case,
// and the fast one: no thread hand-off); otherwise it joins the queue and waits.
//
// Named collectives (Horovod's name=) may be issued in different orders on different
// ranks, as Horovod allows: when the ranks' next collectives differ and one of them is
// named, the ranks negotiate (see negotiate() in engine.cc) and run first a named
// collective that every rank has issued; the others keep their places. A name that is
// in flight cannot be issued again (DuplicateName, Horovod's ValueError). A queued one
// stays in flight for at least name_hold() after its issue unless its handle is
// synchronized: in Horovod a collective completes at the earliest in its background
// loop's next cycle, so a name issued twice in a row is a duplicate on every rank, also
// on the last rank to issue it, whose first collective could otherwise complete at once.
//
// No Python object is touched here: the bindings keep the buffers alive and convert the
// errors. Waits never hold the GIL (the bindings release it around every call here).
#pragma once

#include <elasticrun/elasticrun.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace elasticrun::python {

// One collective over raw buffers, as Communicator takes them. count is in elements:
// per rank for allgather and reduce_scatter (the output's and the input's share), per
// block for alltoall.
struct Request {
  enum class Kind { allreduce, broadcast, allgather, allgatherv, reduce_scatter, alltoall, barrier };
  Kind kind = Kind::barrier;
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;
  DataType type = DataType::u8;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  std::vector<std::size_t> counts;  // allgatherv
  // allreduce only: the input is multiplied by prescale before the reduction, the result
  // by postscale after it (Horovod's prescale_factor / postscale_factor). Float types.
  double prescale = 1.0, postscale = 1.0;
  // First agree that every rank issues the same collective (kind, op, host or device
  // memory) with the same element count and type, `shape` fingerprint and (broadcast)
  // root (one 136-byte allreduce, which join() also rides on): a disagreement is
  // then an Error on every rank, where the collective itself could hang or silently
  // reduce mismatched buffers. `shape`: the caller's fingerprint of the tensor's shape
  // (0: none), so that equal counts of different shapes are refused, as Horovod does.
  bool check = false;
  std::int64_t shape = 0;
  // GPU memory: the CUDA device index of the buffers (-1: host memory). Such a request
  // runs through NCCL (elasticrun::device::Collectives) on `stream` (a cudaStream_t;
  // null: the legacy default stream) and returns once it completed there (not waiting
  // for what was queued on the stream after it). Not for allgatherv or barrier; no
  // prescale or postscale (the torch layer scales with torch).
  int device = -1;
  void* stream = nullptr;
  // A process set (Communicator::subset): its id (0: every rank) and its members, the
  // current communicator's ranks in the set's order. Host memory only.
  int set = 0;
  std::vector<int> members;
  // A named collective: a hash of its name (name_key), 0 for none. Matched by name when
  // the ranks issue collectives in different orders; `reorderable` says that the task
  // that runs this request may be put off for another (Engine's tasks from the _core
  // bindings; not torch.distributed's, whose order the process group keeps).
  std::uint64_t key = 0;
  bool reorderable = false;
};

// A collective name's key for Request::key: never 0.
std::uint64_t name_key(const std::string& name);
// The key of every barrier: barriers match each other by order, like unnamed collectives,
// but may be run out of order against named ones.
std::uint64_t barrier_key();

// Thrown by Engine::submit/run for a named collective whose name is in flight.
class DuplicateName : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// One round of join() (Horovod's): this rank, which has run out of work, takes part in
// the agreement of the other ranks' next collective (Request::check) with neutral
// values. `rounds` counts this call among the rank's rounds, from 1. Either every rank
// has joined (`done`, and `last` is the rank that joined last: the one with the fewest
// rounds, the highest such rank on a tie; the same on every rank), or the others are
// about to run a collective: when `take_part`, an allreduce in which this rank must pass
// `count` zeros of `type` with `op` (on its GPU when `on_device`), or a barrier; other
// collectives raise on the others (a joined rank has nothing to give them) and this
// rank goes on to the next round. Collectives that skip the agreement cannot be joined
// in: with Request::check off, join() is only a place where every rank waits.
struct JoinRound {
  bool done = false;
  int last = -1;
  bool take_part = false;
  Request::Kind kind = Request::Kind::barrier;
  std::size_t count = 0;
  DataType type = DataType::u8;
  ReduceOp op = ReduceOp::sum;
  bool on_device = false;
};
JoinRound join_round(Context& ctx, std::int64_t rounds);
const char* kind_name(Request::Kind k);

// The communicator a request runs on: the current epoch's, or its subset `set`.
Communicator& communicator(Context& ctx, int set, const std::vector<int>& members);

// Runs one request on the current epoch's communicator (a device request: on the
// process's device collectives, see process_engine.h).
void execute(Context& ctx, const Request& r);

// What the engine runs: one request, or a few that belong together (allgather's size
// exchange and the gather itself), on the context it is given.
using Task = std::function<void(Context&)>;

// The completion of one request: done once, with or without an error.
class Completion {
 public:
  bool done() const;
  // Waits up to `timeout`; true once done. Rethrows the request's error when done.
  bool wait_for(std::chrono::milliseconds timeout);
  void finish(std::exception_ptr error);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// How a task is queued: its request's key (0: none) and whether the name is held while
// the task is in flight (a named collective of the user's; barriers are not).
struct Named {
  std::uint64_t key = 0;
  bool unique = false;
  std::string name;  // for the DuplicateName message
};

// How long a name stays held (see above) by default: Horovod's default cycle. The hold
// itself is the process's setting, name_hold() (process_engine.h).
inline constexpr std::chrono::milliseconds kNameHold{5};

class Engine {
 public:
  explicit Engine(Context& ctx);
  ~Engine();  // finishes what is queued, then stops the thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues the task; the caller keeps its buffers alive until the completion is done.
  // DuplicateName when `named` is unique and its key is in flight. `hold`: the name
  // stays in flight for name_hold() after the issue (a handle's; not a synchronous call's).
  std::shared_ptr<Completion> submit(Task t, const Named& named = {}, bool hold = true);
  // Runs the task after everything issued before it; throws its error.
  void run(const Task& t, const Named& named = {});
  // Runs the task on this thread if nothing is queued or running, with its error in
  // `error`, and returns true; otherwise runs nothing and returns false.
  bool try_run(const Task& t, std::exception_ptr& error, const Named& named = {});
  // Waits until nothing is queued or running (before a re-join replaces the
  // communicator: a request of the old epoch must not run on the new one).
  void drain();
  // The keys of the running task and the queued ones, in the order they run (0s left out).
  std::vector<std::uint64_t> pending_keys();
  // The queued collective of `key` was synchronized: its name is free now (see name_hold()).
  void release(std::uint64_t key);
  // Waits until nothing is queued or running, up to `deadline`; true if so.
  bool drain_until(std::chrono::steady_clock::time_point deadline);

 private:
  struct Queued {
    Task task;
    std::shared_ptr<Completion> completion;
    Named named;
    std::chrono::steady_clock::time_point held_until;  // its issue + name_hold() then
    bool hold;
  };
  void loop();
  // Runs the task on this thread; its error, if any. A negotiation that chose another
  // task puts that task's key in `next` (the task is then to be run again later).
  std::exception_ptr attempt(const Task& t, std::uint64_t& next) noexcept;
  // With mu_ held, after a task ran: idle, or the next one's turn.
  void ran();
  // With mu_ held: DuplicateName if `n` is unique and in flight.
  void check_unique(const Named& n) const;

  Context& ctx_;
  std::mutex mu_;
  std::condition_variable cv_;       // work arrived, or stop
  std::condition_variable idle_cv_;  // the queue became empty and nothing runs
  std::deque<Queued> queue_;
  bool busy_ = false;  // a task is running, on the thread or inline
  std::uint64_t running_key_ = 0;
  std::multiset<std::uint64_t> in_flight_;  // unique names queued or running
  // Unique names of completed collectives, held until their time (name_hold()).
  std::map<std::uint64_t, std::chrono::steady_clock::time_point> held_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace elasticrun::python
