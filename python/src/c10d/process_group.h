// The torch.distributed backend "elasticrun": a c10d::ProcessGroup whose collectives
// run on the package's process-wide engine (process_engine.h), over the communicator
// of the current epoch, in the order they are issued, shared with elasticrun's own
// collectives. Every op checks its tensors on the caller's thread (tensors.h), queues
// the collective, and returns a Work (work.h) that completes when it has run.
//
// A process group belongs to the epoch it was made in: a collective issued on it after
// the job moved to another epoch (an elastic reset) fails with an Error saying so, and
// the script makes a new one (destroy_process_group, init_process_group). Collectives
// queued before the reset ran on the old communicator, which failed them.
//
// It serves the whole job, rank r of elasticrun being rank r of the group: the
// constructor refuses another rank or size. Ops the library has no call for are built
// from ones it has (collectives.h); send, recv and monitored_barrier are not supported.
#pragma once

#include "c10d/completer.h"
#include "c10d/work.h"
#include "engine.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace elasticrun::python::c10d {

class ProcessGroup : public ::c10d::ProcessGroup {
 public:
  // Throws c10::Error unless elasticrun is initialised and (rank, size) are its own.
  ProcessGroup(int rank, int size);
  // Waits until the engine ran every collective issued on this group.
  ~ProcessGroup() override;

  const std::string getBackendName() const override { return "elasticrun"; }
  // The elasticrun epoch this group was made in.
  std::uint64_t epoch() const { return epoch_; }
  // Threads its Completer started (for tests: a callback that waited for a collective
  // made it start a second).
  std::size_t completion_threads() const { return completer_->threads(); }
  // Collectives that ran inline, on the calling thread (for tests).
  std::size_t inline_runs() const { return inline_runs_.load(std::memory_order_relaxed); }
  // Waits (up to `timeout`) until no completion is running or to come: at exit.
  bool quiesce(std::chrono::milliseconds timeout) { return completer_->quiesce(timeout); }

  using Tensors = std::vector<at::Tensor>;
  using WorkPtr = c10::intrusive_ptr<::c10d::Work>;
  WorkPtr broadcast(Tensors& tensors, const ::c10d::BroadcastOptions& opts) override;
  WorkPtr allreduce(Tensors& tensors, const ::c10d::AllreduceOptions& opts) override;
  WorkPtr allreduce_coalesced(Tensors& tensors, const ::c10d::AllreduceCoalescedOptions& opts) override;
  WorkPtr reduce(Tensors& tensors, const ::c10d::ReduceOptions& opts) override;
  WorkPtr allgather(std::vector<Tensors>& outputs, Tensors& inputs, const ::c10d::AllgatherOptions& opts) override;
  WorkPtr _allgather_base(at::Tensor& output, at::Tensor& input, const ::c10d::AllgatherOptions& opts) override;
  WorkPtr gather(std::vector<Tensors>& outputs, Tensors& inputs, const ::c10d::GatherOptions& opts) override;
  WorkPtr scatter(Tensors& outputs, std::vector<Tensors>& inputs, const ::c10d::ScatterOptions& opts) override;
  WorkPtr reduce_scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                         const ::c10d::ReduceScatterOptions& opts) override;
  WorkPtr _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                               const ::c10d::ReduceScatterOptions& opts) override;
  WorkPtr alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                        std::vector<int64_t>& input_splits, const ::c10d::AllToAllOptions& opts) override;
  WorkPtr alltoall(Tensors& outputs, Tensors& inputs, const ::c10d::AllToAllOptions& opts) override;
  WorkPtr barrier(const ::c10d::BarrierOptions& opts) override;

 private:
  // Queues `run` on the engine. The Work completes (on the Completer) when it has run;
  // its error names `what`. A small collective (kInlineMaxBytes) runs at once on the
  // calling thread instead, when nothing is queued before it and that thread does not
  // hold the GIL, and its Work is returned complete (process_group.cc says why).
  c10::intrusive_ptr<Work> enqueue(::c10d::OpType type, const char* what, Tensors result, Tensors keep,
                                   std::function<void(Context&)> run);
  int root_of(std::int64_t root, const char* what) const;

  static constexpr std::size_t kInlineMaxBytes = 64 * 1024;

  const std::uint64_t epoch_;
  std::atomic<std::size_t> inline_runs_{0};
  std::unique_ptr<Completer> completer_;
};

}  // namespace elasticrun::python::c10d
