// libelasticrun: the library training processes link.
//
//   elasticrun::init();                       // join the job (reads ELASTICRUN_* from the daemon)
//   std::vector<float> grad = ...;
//   elasticrun::allreduce(std::span(grad), elasticrun::ReduceOp::avg);
//   elasticrun::shutdown();
//
// Every call blocks until it completes, fails with a typed error (types.hpp), or
// passes its deadline (ELASTICRUN_COLLECTIVE_TIMEOUT, default 300 s). Buffers are
// host memory. "In place" means the same span is passed as input and output.
//
// The free functions act on one process-wide Context made by init() and destroyed
// by shutdown(); a program that wants several, or explicit lifetimes, uses Context.
#pragma once

#include <elasticrun/types.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace elasticrun {

class Communicator;
namespace msg {
struct JoinOk;  // internal: a rendezvous reply
}

// A report's metrics: name -> value (finite; JSON has no NaN or infinity).
using Metrics = std::map<std::string, double>;

// Where this process sits in the job.
struct Topology {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
  std::uint64_t epoch = 0;
  std::string host;
};

class Context {
 public:
  // Joins the job described by the ELASTICRUN_* environment the daemon set.
  static std::unique_ptr<Context> from_environment();
  explicit Context(std::unique_ptr<Communicator> comm);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const Topology& topology() const;
  // The communicator of the current epoch. It is replaced by rejoin(): do not keep
  // references to it across one. Throws Error when there is none (after abandon(), or
  // a rejoin() that failed).
  Communicator& comm();
  // Tears down the current epoch's communicator, as after a collective failed: once it
  // returns, no transfer of that epoch can still write into the caller's buffers (a
  // receive already under way when the collective failed cannot be cancelled, and would
  // land at the transport's next progress). Collectives fail until rejoin(). The
  // elastic run loop calls it before restoring the last commit.
  void abandon();

  // Elastic membership. After a collective threw WorkersFailed or HostsUpdated (or
  // hosts_updated() says so), rejoin() tears down the communicator, waits for the
  // rendezvous server's next epoch (bounded by ELASTICRUN_COLLECTIVE_TIMEOUT), takes
  // this worker's new place in it, and builds a new communicator. It throws Error if
  // this worker is not part of the new epoch (it was removed; exit), TimeoutError if no
  // epoch came in time.
  void rejoin();
  // True once the server announced a newer epoch that only added hosts: the caller
  // should reach a consistent point (a commit) and rejoin. Collectives of the current
  // epoch keep working until then.
  bool hosts_updated() const;
  // How many epochs this context has joined after its first (its resets).
  int resets() const;

  // Progress for the driver (elasticrun --events, --report-fd), and its answer: true
  // when the driver decided this job should stop. Collective, like commit(): every rank
  // calls it at the same step. Rank 0's step and metrics are sent (the others' metrics
  // are ignored: allreduce first to report a mean); rank 0 waits for the decision
  // (bounded by ELASTICRUN_COLLECTIVE_TIMEOUT) and broadcasts it, so that every rank
  // returns the same value at the same step. Errors are the usual kinds, the same on
  // every rank: WorkersFailed (a peer or the driver lost), TimeoutError (no decision
  // in time), HostsUpdated (hosts were added and this epoch is no longer the current
  // one: the driver takes reports of the current epoch only; calling report() right
  // after commit() keeps that window small), Error (a metric not finite, an empty
  // name, more than 64 KiB of metrics).
  bool report(std::int64_t step, const Metrics& metrics = {});
  // True once a report() of this context returned true (it stays true).
  bool should_stop() const;

 private:
  friend struct ContextInternals;
  Context();
  // Internal: builds the communicator of the joined epoch `join` (a msg::JoinOk),
  // following newer epochs that start meanwhile.
  void connect(msg::JoinOk join, std::chrono::steady_clock::time_point deadline);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Type-erased collectives over raw buffers; the span overloads below forward here.
// `count` is in elements. Buffers may alias exactly (in place) but not partially.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual void allreduce(const void* in, void* out, std::size_t count, DataType t, ReduceOp op) = 0;
  virtual void broadcast(void* buf, std::size_t count, DataType t, int root) = 0;
  // out holds size()*count elements; rank r's input lands at [r*count, (r+1)*count).
  virtual void allgather(const void* in, void* out, std::size_t count, DataType t) = 0;
  // counts[r] elements from rank r, packed in rank order into out.
  virtual void allgatherv(const void* in, void* out, std::span<const std::size_t> counts,
                          DataType t) = 0;
  // in holds size()*count elements; out receives the reduced block at index rank().
  virtual void reduce_scatter(const void* in, void* out, std::size_t count, DataType t,
                              ReduceOp op) = 0;
  // in and out hold size()*count elements; block j of in goes to rank j.
  virtual void alltoall(const void* in, void* out, std::size_t count, DataType t) = 0;
  virtual void barrier() = 0;

  // The most calls of one collective at one size this communicator makes before it
  // runs that size the way it will from then on: its tuner's trials, where it measures
  // the candidate algorithms of a size class on their first calls (libelasticrun(3),
  // ALGORITHMS); 0 where it does not tune. A benchmark warms each size up with at least
  // this many calls to time what a long-running program runs.
  virtual int tuning_calls() const { return 0; }

  // A communicator over some of this one's ranks (a process set, in Horovod's words).
  // `members`: ranks of this communicator, distinct and in the order of their ranks in
  // the subset, this process's among them. `id` (1..kMaxSubsets) tells subsets apart:
  // every member passes the same id with the same members, and collectives of
  // subsets with different ids never mix, even between the same two ranks. Made at the
  // first call, without communication, and kept until this communicator goes (with
  // its epoch) or a call with the same id and other members replaces it. Collectives
  // on it are issued by its members only, in the same order on each, and run on the
  // host paths of this communicator's transport. Throws Error for a bad id or members,
  // or where the communicator has no subsets.
  static constexpr int kMaxSubsets = 63;
  virtual Communicator& subset(int id, std::span<const int> members);
};

// ---- process-wide convenience API ----

void init();
void shutdown();
bool initialized();
Context& context();

int rank();
int size();
int local_rank();
int local_size();
int cross_rank();
int cross_size();
// The default context's report() and should_stop().
bool report(std::int64_t step, const Metrics& metrics = {});
bool should_stop();

template <class T>
void allreduce(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
  if (in.size() != out.size()) throw Error("allreduce: input and output sizes differ");
  context().comm().allreduce(in.data(), out.data(), in.size(), dtype_of_v<T>, op);
}
template <class T>
void allreduce(std::span<T> inout, ReduceOp op = ReduceOp::sum) {
  context().comm().allreduce(inout.data(), inout.data(), inout.size(), dtype_of_v<T>, op);
}
template <class T>
void broadcast(std::span<T> buf, int root = 0) {
  context().comm().broadcast(buf.data(), buf.size(), dtype_of_v<T>, root);
}
template <class T>
void allgather(std::span<const T> in, std::span<T> out) {
  if (out.size() != in.size() * static_cast<std::size_t>(size()))
    throw Error("allgather: output must hold size() * input elements");
  context().comm().allgather(in.data(), out.data(), in.size(), dtype_of_v<T>);
}
template <class T>
void allgatherv(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts) {
  context().comm().allgatherv(in.data(), out.data(), counts, dtype_of_v<T>);
}
template <class T>
void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
  if (in.size() != out.size() * static_cast<std::size_t>(size()))
    throw Error("reduce_scatter: input must hold size() * output elements");
  context().comm().reduce_scatter(in.data(), out.data(), out.size(), dtype_of_v<T>, op);
}
template <class T>
void alltoall(std::span<const T> in, std::span<T> out) {
  if (in.size() != out.size() || in.size() % static_cast<std::size_t>(size()) != 0)
    throw Error("alltoall: input and output must hold size() * count elements");
  context().comm().alltoall(in.data(), out.data(), in.size() / size(), dtype_of_v<T>);
}
inline void barrier() { context().comm().barrier(); }

}  // namespace elasticrun
