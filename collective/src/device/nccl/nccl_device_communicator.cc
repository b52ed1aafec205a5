#include "device/nccl/nccl_device_communicator.h"

#include "device/device_config.h"
#include "device/nccl/nccl_handle.h"
#include "device/nccl/nccl_errors.h"
#include "device/nccl/nccl_types.h"

#include <elasticrun/types.hpp>

#include <dlfcn.h>

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
      device_ = nccl_use_device(cfg.local_rank);
    }
    Watch w = watch("nccl init");
    Bytes id = exchange([] { return make_nccl_unique_id(); }, w.deadline);
    handle_ = NcclHandle::init(cfg.size, cfg.rank, id, w);
  }

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

  // Launches one operation (which may answer ncclInProgress) and waits for its stream.
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
    handle_.wait_stream(s, w);
  }

  DeviceCommConfig cfg_;
  std::shared_ptr<AbortSignal> abort_;
  int device_ = 0;
  NcclHandle handle_;
};

}  // namespace

int nccl_device_count() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) throw Error(std::string("no CUDA device: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  if (n <= 0) throw Error("no CUDA device: cudaGetDeviceCount found none");
  return n;
}

int nccl_use_device(int local_rank) {
  int device = select_device_from_env(local_rank, nccl_device_count());
  check_cuda(cudaSetDevice(device), "nccl: cudaSetDevice(" + std::to_string(device) + ")");
  return device;
}

std::unique_ptr<device::Communicator> make_nccl_communicator(const DeviceCommConfig& cfg, const IdExchange& exchange,
                                                             std::shared_ptr<AbortSignal> abort) {
  return std::make_unique<NcclDeviceCommunicator>(cfg, exchange, std::move(abort));
}

std::unique_ptr<device::Communicator> shrink_nccl_communicator(device::Communicator& old,
                                                               std::span<const int> excluded) {
  auto* nccl = dynamic_cast<NcclDeviceCommunicator*>(&old);
  if (!nccl) throw Error("nccl shrink: not an NCCL communicator");
  return nccl->shrink(excluded);
}

void nccl_discard(device::Communicator& c) {
  if (auto* nccl = dynamic_cast<NcclDeviceCommunicator*>(&c)) nccl->discard();
}

bool nccl_can_shrink(device::Communicator& c) {
  auto* nccl = dynamic_cast<NcclDeviceCommunicator*>(&c);
  return nccl && nccl->alive();
}

// Asking CUDA about a pointer initialises the runtime and makes a context on the
// current device (hundreds of MB of GPU memory, ~0.1-0.3 s) even for a program that only
// ever uses host memory. A process that has touched CUDA has the driver library loaded;
// if it is not, no pointer can be device memory and CUDA is left alone.
static bool cuda_in_use() {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!driver) return false;
  ::dlclose(driver);  // drops only the reference RTLD_NOLOAD took
  return true;
}

// Errors that a fault inside a kernel leaves in the context for every later call.
static bool is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

device::Memory nccl_memory_of(const void* p) {
  if (!p || !cuda_in_use()) return device::Memory::host;
  cudaPointerAttributes attr{};
  cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) {
    // Host memory CUDA never saw answers cudaSuccess (cudaMemoryTypeUnregistered), and a
    // process that cannot use a GPU at all (none, busy, no memory for a context) has no
    // device memory: host. Only an error a kernel fault left in this process's context
    // is thrown, rather than sending a device buffer down the host path.
    cudaGetLastError();
    if (is_sticky(e)) check_cuda(e, "device::memory_of: cudaPointerGetAttributes");
    return device::Memory::host;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ? device::Memory::device
                                                                                  : device::Memory::host;
}

bool nccl_available(std::string* why) {
  try {
    nccl_device_count();
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

}  // namespace elasticrun::collective
