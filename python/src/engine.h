// The Python package's collective engine: runs collectives of the process-wide Context
// in the order they were issued, either at once on the caller's thread or later on a
// thread of its own (the asynchronous forms, and DistributedOptimizer's gradient
// hooks, which issue allreduces while backward() is still running).
//
// Ordering is the whole contract: every rank must run the same collectives in the same
// order, and a synchronous call issued after asynchronous ones must not overtake them.
// So a synchronous call runs inline only when nothing is queued or running (the common
// case, and the fast one: no thread hand-off); otherwise it joins the queue and waits.
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
#include <memory>
#include <mutex>
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
  // First agree that every rank passes the same element count and type, and the same
  // `shape` fingerprint and (broadcast) root (one 64-byte allreduce): a disagreement is
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

class Engine {
 public:
  explicit Engine(Context& ctx);
  ~Engine();  // finishes what is queued, then stops the thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues the task; the caller keeps its buffers alive until the completion is done.
  std::shared_ptr<Completion> submit(Task t);
  // Runs the task after everything issued before it; throws its error.
  void run(const Task& t);
  // Runs the task on this thread if nothing is queued or running, with its error in
  // `error`, and returns true; otherwise runs nothing and returns false.
  bool try_run(const Task& t, std::exception_ptr& error);
  // Waits until nothing is queued or running (before a re-join replaces the
  // communicator: a request of the old epoch must not run on the new one).
  void drain();

 private:
  void loop();
  // Runs the task on this thread; its error, if any.
  std::exception_ptr attempt(const Task& t) noexcept;
  // With mu_ held, after a task ran: idle, or the next one's turn.
  void ran();

  Context& ctx_;
  std::mutex mu_;
  std::condition_variable cv_;       // work arrived, or stop
  std::condition_variable idle_cv_;  // the queue became empty and nothing runs
  std::deque<std::pair<Task, std::shared_ptr<Completion>>> queue_;
  bool busy_ = false;  // a task is running, on the thread or inline
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace elasticrun::python
