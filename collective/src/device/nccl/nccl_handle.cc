#include "device/nccl/nccl_handle.h"

#include "device/nccl/nccl_errors.h"
#include "device/nccl_id_exchange.h"

#include <elasticrun/types.hpp>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3),
              "elasticrun's NCCL backend needs NCCL >= 2.28.3 (ncclCommShrink, ncclAlltoAll)");
static_assert(sizeof(ncclUniqueId) == elasticrun::collective::kNcclIdBytes, "ncclUniqueId size changed");

namespace elasticrun::collective {
namespace {

// Spin briefly (short collectives finish in microseconds), then yield, then sleep:
// several ranks may share a GPU and the host's cores, and a busy-polling waiter must
// not starve the rank it waits for.
class Backoff {
 public:
  void pause() {
    ++n_;
    if (n_ < 64) return;
    if (n_ < 1024) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(20));  // overshoots a long op by little
  }

 private:
  int n_ = 0;
};

ncclConfig_t nonblocking_config() {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

// A launch that returned ncclInProgress is fine (poll it); anything else but success throws.
void check_launch(ncclResult_t r, const std::string& what) {
  if (classify(r) != Outcome::pending) check_nccl(r, what);
}

}  // namespace

void check_nccl_version() {
  int v = 0;
  check_nccl(ncclGetVersion(&v), "ncclGetVersion");
  if (v < NCCL_VERSION(2, 28, 3))
    throw Error("nccl: the loaded NCCL is version code " + std::to_string(v) +
                "; elasticrun needs 2.28.3 or later (ncclCommShrink, ncclAlltoAll)");
}

Bytes make_nccl_unique_id() {
  ncclUniqueId uid;
  check_nccl(ncclGetUniqueId(&uid), "ncclGetUniqueId");
  Bytes out(kNcclIdBytes);
  std::memcpy(out.data(), uid.internal, kNcclIdBytes);
  return out;
}

void wait_stream_idle(cudaStream_t stream, const Watch& w) {
  Backoff b;
  for (;;) {
    cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) return;
    if (classify(q) == Outcome::error) check_cuda(q, w.what + ": cudaStreamQuery");
    if (w.abort) w.abort->check();
    if (Clock::now() >= w.deadline) throw TimeoutError(w.what + ": not complete by its deadline");
    b.pause();
  }
}

NcclHandle NcclHandle::init(int nranks, int rank, const Bytes& id, const Watch& w) {
  if (id.size() != kNcclIdBytes) throw Error(w.what + ": unique id has " + std::to_string(id.size()) + " bytes");
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), kNcclIdBytes);
  ncclConfig_t cfg = nonblocking_config();
  ncclComm_t raw = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&raw, nranks, uid, rank, &cfg);
  NcclHandle comm(raw);  // owned from here, so a failure below aborts it
  check_launch(r, w.what + ": ncclCommInitRankConfig");
  comm.wait_ready(w);
  return comm;
}

NcclHandle& NcclHandle::operator=(NcclHandle&& o) noexcept {
  if (this != &o) {
    abort();
    comm_ = o.comm_;
    o.comm_ = nullptr;
  }
  return *this;
}

NcclHandle::~NcclHandle() {
  if (!comm_) return;
  // Clean teardown: finalize flushes outstanding work, then destroy frees locally. Both
  // are bounded; a communicator that does not finalize in time (a peer is gone) is aborted.
  ncclResult_t st = ncclCommFinalize(comm_);
  auto deadline = Clock::now() + std::chrono::seconds(10);
  Backoff b;
  if (st == ncclSuccess || st == ncclInProgress) {
    while ((st = async_state()) == ncclInProgress && Clock::now() < deadline) b.pause();
  }
  if (st != ncclSuccess) {
    abort();
    return;
  }
  ncclCommDestroy(comm_);
  comm_ = nullptr;
}

bool NcclHandle::healthy() const { return comm_ && async_state() == ncclSuccess; }

void NcclHandle::abort() noexcept {
  if (!comm_) return;
  ncclCommAbort(comm_);
  comm_ = nullptr;
}

ncclResult_t NcclHandle::async_state() const {
  ncclResult_t st = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm_, &st);
  return r == ncclSuccess ? st : r;
}

void NcclHandle::fail(ncclResult_t st, const Watch& w) {
  std::string detail = std::string("nccl: ") + ncclGetErrorString(st) + " (" + ncclGetLastError(comm_) + ")";
  abort();
  // NCCL also reports some deaths of peers as a system error (a local socket reset while
  // exchanging handles, an unreachable host). If the control plane says a worker died
  // within a moment, that is the error to report; otherwise the fault is this process's.
  if (st == ncclSystemError && w.abort) {
    auto until = std::min(Clock::now() + std::chrono::seconds(2), w.deadline);
    while (!w.abort->raised() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (w.abort && w.abort->raised()) w.abort->throw_error();
  throw_if_failed(classify(st), w.what, detail);
  throw Error(w.what + ": " + detail);  // classify never answers done or pending here
}

void NcclHandle::check_watch(const Watch& w) {
  if (w.abort && w.abort->raised()) {
    abort();
    w.abort->throw_error();
  }
  if (Clock::now() >= w.deadline) {
    abort();
    throw TimeoutError(w.what + ": not complete by its deadline (NCCL has no timeout of its own); communicator aborted");
  }
}

void NcclHandle::wait_ready(const Watch& w) {
  if (!comm_) throw WorkersFailed(w.what + ": the NCCL communicator was aborted");
  Backoff b;
  for (;;) {
    ncclResult_t st = async_state();
    if (st == ncclSuccess) return;
    if (st != ncclInProgress) fail(st, w);
    check_watch(w);
    b.pause();
  }
}

void NcclHandle::wait_event(cudaEvent_t done, const Watch& w) {
  if (!comm_) throw WorkersFailed(w.what + ": the NCCL communicator was aborted");
  Backoff b;
  for (;;) {
    cudaError_t q = cudaEventQuery(done);
    ncclResult_t st = async_state();
    if (st != ncclSuccess && st != ncclInProgress) wait_ready(w);  // throws with NCCL's reason
    if (classify(q) == Outcome::error) {
      abort();
      check_cuda(q, w.what + ": cudaEventQuery");
    }
    if (q == cudaSuccess && st == ncclSuccess) return;
    check_watch(w);
    b.pause();
  }
}

NcclHandle NcclHandle::shrink(std::span<const int> excluded, const Watch& w) {
  if (!comm_) throw WorkersFailed(w.what + ": the NCCL communicator was aborted");
  std::vector<int> ex(excluded.begin(), excluded.end());
  ncclConfig_t cfg = nonblocking_config();
  // In non-blocking mode NCCL builds the child in a job attached to this (the parent)
  // communicator: `child` stays null until the job stores it, and the job's progress and
  // errors show on the parent. So poll the parent, then the child; on any failure abort
  // the parent first, which joins the job, so nothing writes `child` after we leave.
  ncclComm_t child = nullptr;
  auto current_child = [&child] { return __atomic_load_n(&child, __ATOMIC_ACQUIRE); };
  try {
    check_launch(ncclCommShrink(comm_, ex.data(), static_cast<int>(ex.size()), &child, &cfg, NCCL_SHRINK_ABORT),
                 w.what + ": ncclCommShrink");
    Backoff b;
    for (;;) {
      ncclResult_t st = async_state();
      ncclComm_t c = current_child();
      if (st == ncclSuccess && c) {
        ncclResult_t cs = ncclSuccess;
        if (ncclCommGetAsyncError(c, &cs) != ncclSuccess) cs = ncclInternalError;
        if (cs == ncclSuccess) break;
        st = cs;  // the child's own error, or still in progress
      }
      if (st != ncclSuccess && st != ncclInProgress) fail(st, w);
      check_watch(w);
      b.pause();
    }
  } catch (...) {
    abort();
    if (ncclComm_t c = current_child()) ncclCommAbort(c);
    throw;
  }
  NcclHandle out(current_child());
  abort();  // the parent's operations were terminated by NCCL_SHRINK_ABORT: free it
  return out;
}

}  // namespace elasticrun::collective
