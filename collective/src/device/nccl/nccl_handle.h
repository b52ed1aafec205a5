// One NCCL communicator handle, owned (RAII), and the bounded waits around it.
//
// Every NCCL call here runs in non-blocking mode (ncclConfig_t.blocking = 0): init,
// shrink and collective launches may return ncclInProgress, after which the handle is
// polled with ncclCommGetAsyncError. Nothing ever blocks inside NCCL or CUDA: a wait
// loops over
//   - the AbortSignal: the control plane saw a worker die. NCCL has no timeouts and
//     reports no dead peer on the same host (its kernel just spins), so this flag is
//     the first line of failure detection; on it the communicator is aborted
//     (ncclCommAbort) and WorkersFailed / HostsUpdated is thrown;
//   - ncclCommGetAsyncError: NCCL's own view (a remote peer lost, a local fault);
//   - cudaStreamQuery for stream completion (never cudaStreamSynchronize);
//   - the deadline: past it the communicator is aborted and TimeoutError thrown.
// An aborted NcclHandle is empty; any later use throws WorkersFailed.
#pragma once

#include "control/abort_signal.h"
#include "control/store.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <span>
#include <string>

namespace elasticrun::collective {

// What a wait watches besides the operation itself.
struct Watch {
  const AbortSignal* abort = nullptr;  // may be null (no control plane)
  Clock::time_point deadline;
  std::string what;  // names the operation in errors
};

class NcclHandle {
 public:
  NcclHandle() = default;
  // Non-blocking ncclCommInitRankConfig with `id` (kNcclIdBytes), polled under `w`.
  static NcclHandle init(int nranks, int rank, const Bytes& id, const Watch& w);
  ~NcclHandle();
  NcclHandle(NcclHandle&& o) noexcept : comm_(o.comm_) { o.comm_ = nullptr; }
  NcclHandle& operator=(NcclHandle&& o) noexcept;
  NcclHandle(const NcclHandle&) = delete;
  NcclHandle& operator=(const NcclHandle&) = delete;

  ncclComm_t get() const { return comm_; }
  explicit operator bool() const { return comm_ != nullptr; }

  // A communicator without the ranks in `excluded` (ranks of this one), made with
  // ncclCommShrink(..., NCCL_SHRINK_ABORT): in-flight work on this one is terminated
  // first, so it also works when a peer died mid-collective. Survivors keep their
  // relative order. Every survivor must call it; this communicator is then destroyed.
  NcclHandle shrink(std::span<const int> excluded, const Watch& w);

  // Polls until the last non-blocking call on this communicator finished.
  void wait_ready(const Watch& w);
  // Polls until `done` (an event recorded right after this communicator's operation) has
  // completed, and the communicator is healthy. Only the operation and what its stream
  // ran before it are waited for, not the kernels queued behind it (a training loop's
  // next layers, when the caller's stream is its compute stream).
  void wait_event(cudaEvent_t done, const Watch& w);
  // Frees the handle and kills its kernels. Safe to call twice.
  void abort() noexcept;
  // Alive, with no error pending and no operation in progress.
  bool healthy() const;

 private:
  explicit NcclHandle(ncclComm_t c) : comm_(c) {}
  // One poll round: throws (aborting first) on abort or deadline.
  void check_watch(const Watch& w);
  // Aborts, then throws for NCCL's state `st`: the control plane's error if it aborts
  // the epoch meanwhile (waited for briefly after a system error), else NCCL's.
  [[noreturn]] void fail(ncclResult_t st, const Watch& w);
  // The communicator's async state; ncclInProgress means "still working".
  ncclResult_t async_state() const;

  ncclComm_t comm_ = nullptr;
};

// Polls until all work queued on `stream` finished, under `w` (abort signal, deadline),
// for work that involves no communicator (memory copies). Throws Error on a CUDA error,
// TimeoutError past the deadline; the stream's work stays queued then.
void wait_stream_idle(cudaStream_t stream, const Watch& w);

// Throws Error when the NCCL loaded at run time is older than the one this backend needs.
void check_nccl_version();

// rank 0's half of the id exchange: ncclGetUniqueId as bytes.
Bytes make_nccl_unique_id();

}  // namespace elasticrun::collective
