// The device Communicator over NCCL (device_backend.h's communicators): one ncclComm_t
// per epoch.
//
// Construction picks the device (device_config.h), exchanges the epoch's unique id
// (rank 0 makes it; IdExchange carries it) and runs a non-blocking init polled under
// the deadline and the abort signal (nccl_handle.h). Each collective validates its
// arguments, launches on the caller's stream, then waits for that stream.
#include "device/device_backend.h"
#include "device/nccl/nccl_errors.h"
#include "device/nccl/nccl_handle.h"
#include "device/nccl/nccl_types.h"

#include <elasticrun/types.hpp>

namespace elasticrun::collective {
namespace {

// A device buffer allocated and freed in stream order (cudaMallocAsync / cudaFreeAsync).
class StreamScratch {
 public:
  StreamScratch() = default;
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() {
    if (p_ && plain_) cudaFree(p_);
    else if (p_) cudaFreeAsync(p_, stream_);
  }
  // A copy of `bytes` of device memory at `src`, made on `s` (the current device's).
  // Where stream-ordered allocation is not supported, cudaMalloc (and cudaFree, which
  // waits for the device).
  const void* copy_of(const void* src, std::size_t bytes, cudaStream_t s) {
    cudaError_t e = cudaMallocAsync(&p_, bytes, s);
    if (e == cudaErrorNotSupported) {
      cudaGetLastError();
      p_ = nullptr;
      check_cuda(cudaMalloc(&p_, bytes), "alltoall in place: cudaMalloc");
      plain_ = true;
    } else {
      check_cuda(e, "alltoall in place: cudaMallocAsync");
    }
    stream_ = s;
    check_cuda(cudaMemcpyAsync(p_, src, bytes, cudaMemcpyDeviceToDevice, s), "alltoall in place: cudaMemcpyAsync");
    return p_;
  }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool plain_ = false;
};

class NcclDeviceCommunicator final : public device::Communicator {
 public:
  NcclDeviceCommunicator(const DeviceCommConfig& cfg, const IdExchange& exchange, std::shared_ptr<AbortSignal> abort)
      : cfg_(cfg), abort_(std::move(abort)) {
    if (cfg.size < 1 || cfg.rank < 0 || cfg.rank >= cfg.size)
      throw Error("nccl: rank " + std::to_string(cfg.rank) + " of size " + std::to_string(cfg.size));
    check_nccl_version();
    if (cfg.device >= 0) {
      device_ = cfg.device;
      check_cuda(cudaSetDevice(device_), "nccl: cudaSetDevice(" + std::to_string(device_) + ")");
    } else {
      device_ = use_device(cfg.local_rank);
    }
    Watch w = watch("nccl init");
    Bytes id = exchange([] { return make_nccl_unique_id(); }, w.deadline);
    handle_ = NcclHandle::init(cfg.size, cfg.rank, id, w);
  }

  ~NcclDeviceCommunicator() override {
    if (done_) cudaEventDestroy(done_);
  }
  NcclDeviceCommunicator& operator=(const NcclDeviceCommunicator&) = delete;

  int rank() const override { return cfg_.rank; }
  int size() const override { return cfg_.size; }
  int device() const override { return device_; }

  void allreduce(const void* in, void* out, std::size_t count, DataType t, ReduceOp op, void* stream) override {
    if (!check_args("allreduce", in, out, count)) return;
    run("allreduce", stream, [&](cudaStream_t s) {
      return ncclAllReduce(in, out, count, to_nccl(t), to_nccl(op), handle_.get(), s);
    });
  }

  void broadcast(void* buf, std::size_t count, DataType t, int root, void* stream) override {
    if (root < 0 || root >= cfg_.size) throw Error("broadcast: root " + std::to_string(root) + " out of range");
    if (!check_args("broadcast", buf, buf, count)) return;
    run("broadcast", stream, [&](cudaStream_t s) {
      return ncclBroadcast(buf, buf, count, to_nccl(t), root, handle_.get(), s);
    });
  }

  void allgather(const void* in, void* out, std::size_t count, DataType t, void* stream) override {
    if (!check_args("allgather", in, out, count)) return;
    run("allgather", stream, [&](cudaStream_t s) {
      return ncclAllGather(in, out, count, to_nccl(t), handle_.get(), s);
    });
  }

  void reduce_scatter(const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                      void* stream) override {
    if (!check_args("reduce_scatter", in, out, count)) return;
    run("reduce_scatter", stream, [&](cudaStream_t s) {
      return ncclReduceScatter(in, out, count, to_nccl(t), to_nccl(op), handle_.get(), s);
    });
  }

  // NCCL's alltoall sends block j while block j arrives from rank j, so in place the input
  // is first copied to a scratch buffer on the stream (freed on the stream afterwards).
  void alltoall(const void* in, void* out, std::size_t count, DataType t, void* stream) override {
    if (!check_args("alltoall", in, out, count)) return;
    StreamScratch scratch;
    run("alltoall", stream, [&](cudaStream_t s) {
      const void* src = in;
      if (in == out && cfg_.size > 1) src = scratch.copy_of(in, count * size_of(t) * cfg_.size, s);
      return ncclAlltoAll(src, out, count, to_nccl(t), handle_.get(), s);
    });
  }

  // Shrinkable: alive, with nothing pending (a latent error would make the shrink fail
  // on this rank while its peers wait in it).
  bool alive() const { return handle_.healthy(); }
  // Ends this communicator at once (ncclCommAbort): for an epoch that builds afresh,
  // where a clean finalize could wait on peers that are gone.
  void discard() { handle_.abort(); }

  // The survivors' communicator without `excluded` (NCCL_SHRINK_ABORT); this one is spent.
  std::unique_ptr<NcclDeviceCommunicator> shrink(std::span<const int> excluded) {
    auto next = std::unique_ptr<NcclDeviceCommunicator>(new NcclDeviceCommunicator(*this));
    next->handle_ = handle_.shrink(excluded, watch("nccl shrink"));
    next->cfg_.size = cfg_.size - static_cast<int>(excluded.size());
    int below = 0;
    for (int r : excluded) below += r < cfg_.rank ? 1 : 0;
    next->cfg_.rank = cfg_.rank - below;
    return next;
  }

 private:
  // Copies settings only; the caller gives the copy its communicator.
  NcclDeviceCommunicator(const NcclDeviceCommunicator& o) : cfg_(o.cfg_), abort_(o.abort_), device_(o.device_) {}

  Watch watch(const char* what) const { return Watch{abort_.get(), Clock::now() + cfg_.timeout, what}; }

  // Throws for bad arguments, an aborted communicator or a raised abort; false when there
  // is nothing to move (count 0: every rank passes the same count, so all return).
  bool check_args(const char* what, const void* in, const void* out, std::size_t count) const {
    if (count > 0 && (!in || !out)) throw Error(std::string(what) + ": null buffer");
    if (!handle_) throw WorkersFailed(std::string(what) + ": the NCCL communicator was aborted; rejoin first");
    if (abort_) abort_->check();
    if (count == 0) return false;
    // First, or asking CUDA about the buffers could make a context on another device.
    check_cuda(cudaSetDevice(device_), std::string(what) + ": cudaSetDevice");
    check_on_my_device(what, in);
    if (out != in) check_on_my_device(what, out);
    return true;
  }

  // NCCL does not check pointers: a buffer on another GPU would fault inside its kernel.
  void check_on_my_device(const char* what, const void* p) const {
    cudaPointerAttributes attr{};
    check_cuda(cudaPointerGetAttributes(&attr, p), std::string(what) + ": cudaPointerGetAttributes");
    if (attr.type == cudaMemoryTypeDevice && attr.device != device_)
      throw Error(std::string(what) + ": a buffer is on CUDA device " + std::to_string(attr.device) +
                  ", the communicator on device " + std::to_string(device_) +
                  " (allocate after elasticrun::device::use_device)");
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
      throw Error(std::string(what) + ": a buffer is not device memory");
  }

  // Launches one operation (which may answer ncclInProgress) and waits for it: for an
  // event recorded on its stream once it is enqueued, so that work the caller queued on
  // the same stream afterwards (from another thread) is not waited for.
  template <class Launch>
  void run(const char* what, void* stream, Launch&& launch) {
    Watch w = watch(what);  // check_args has made device_ current
    auto s = static_cast<cudaStream_t>(stream);
    ncclResult_t r = launch(s);
    // A failed launch leaves the communicator in an unknown state: abort it (the next
    // epoch then builds afresh instead of shrinking it), unless NCCL only refused the
    // arguments.
    Outcome o = classify(r);
    if ((o == Outcome::workers_failed || o == Outcome::error) && r != ncclInvalidArgument && r != ncclInvalidUsage)
      handle_.abort();
    check_nccl(r, what);  // returns for success and ncclInProgress
    handle_.wait_ready(w);  // a non-blocking launch may still be enqueuing
    if (!done_) check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), std::string(what) + ": cudaEventCreate");
    check_cuda(cudaEventRecord(done_, s), std::string(what) + ": cudaEventRecord");
    handle_.wait_event(done_, w);
  }

  DeviceCommConfig cfg_;
  std::shared_ptr<AbortSignal> abort_;
  int device_ = 0;
  NcclHandle handle_;
  cudaEvent_t done_ = nullptr;  // made on device_ at the first operation; not copied by shrink()
};

}  // namespace

std::unique_ptr<device::Communicator> make_device_communicator(const DeviceCommConfig& cfg, const IdExchange& exchange,
                                                               std::shared_ptr<AbortSignal> abort) {
  return std::make_unique<NcclDeviceCommunicator>(cfg, exchange, std::move(abort));
}

std::unique_ptr<device::Communicator> shrink_device_communicator(device::Communicator& old,
                                                                 std::span<const int> excluded) {
  auto* nccl = dynamic_cast<NcclDeviceCommunicator*>(&old);
  if (!nccl) throw Error("nccl shrink: not an NCCL communicator");
  return nccl->shrink(excluded);
}

void discard_device_communicator(device::Communicator& c) {
  if (auto* nccl = dynamic_cast<NcclDeviceCommunicator*>(&c)) nccl->discard();
}

bool device_can_shrink(device::Communicator& c) {
  auto* nccl = dynamic_cast<NcclDeviceCommunicator*>(&c);
  return nccl && nccl->alive();
}

}  // namespace elasticrun::collective
