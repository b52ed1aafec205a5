#include "nccl_communicator.h"

#include "device_config.h"
#include "nccl_comm.h"
#include "nccl_errors.h"
#include "nccl_types.h"

#include <elasticrun/types.hpp>

#include <dlfcn.h>

namespace elasticrun::collective {
namespace {

class NcclCommunicator final : public device::Communicator {
 public:
  NcclCommunicator(const DeviceCommConfig& cfg, const IdExchange& exchange, std::shared_ptr<AbortSignal> abort)
      : cfg_(cfg), abort_(std::move(abort)) {
    if (cfg.size < 1 || cfg.rank < 0 || cfg.rank >= cfg.size)
      throw Error("nccl: rank " + std::to_string(cfg.rank) + " of size " + std::to_string(cfg.size));
    device_ = select_device_from_env(cfg.local_rank, nccl_device_count());
    check_cuda(cudaSetDevice(device_), "nccl: cudaSetDevice(" + std::to_string(device_) + ")");
    Watch w = watch("nccl init");
    Bytes id = exchange([] { return make_nccl_unique_id(); }, w.deadline);
    comm_ = NcclComm::init(cfg.size, cfg.rank, id, w);
  }

  int rank() const override { return cfg_.rank; }
  int size() const override { return cfg_.size; }
  int device() const override { return device_; }

  void allreduce(const void* in, void* out, std::size_t count, DataType t, ReduceOp op, void* stream) override {
    check_args("allreduce", in, out, count);
    run("allreduce", stream, [&](cudaStream_t s) {
      return ncclAllReduce(in, out, count, to_nccl(t), to_nccl(op), comm_.get(), s);
    });
  }

  void broadcast(void* buf, std::size_t count, DataType t, int root, void* stream) override {
    if (root < 0 || root >= cfg_.size) throw Error("broadcast: root " + std::to_string(root) + " out of range");
    check_args("broadcast", buf, buf, count);
    run("broadcast", stream, [&](cudaStream_t s) {
      return ncclBroadcast(buf, buf, count, to_nccl(t), root, comm_.get(), s);
    });
  }

  void allgather(const void* in, void* out, std::size_t count, DataType t, void* stream) override {
    check_args("allgather", in, out, count);
    run("allgather", stream, [&](cudaStream_t s) {
      return ncclAllGather(in, out, count, to_nccl(t), comm_.get(), s);
    });
  }

  void reduce_scatter(const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                      void* stream) override {
    check_args("reduce_scatter", in, out, count);
    run("reduce_scatter", stream, [&](cudaStream_t s) {
      return ncclReduceScatter(in, out, count, to_nccl(t), to_nccl(op), comm_.get(), s);
    });
  }

  void alltoall(const void* in, void* out, std::size_t count, DataType t, void* stream) override {
    check_args("alltoall", in, out, count);
    run("alltoall", stream, [&](cudaStream_t s) {
      return ncclAlltoAll(in, out, count, to_nccl(t), comm_.get(), s);
    });
  }

  bool alive() const { return static_cast<bool>(comm_); }

  // The survivors' communicator without `excluded` (NCCL_SHRINK_ABORT); this one is spent.
  std::unique_ptr<NcclCommunicator> shrink(std::span<const int> excluded) {
    auto next = std::unique_ptr<NcclCommunicator>(new NcclCommunicator(*this));
    next->comm_ = comm_.shrink(excluded, watch("nccl shrink"));
    next->cfg_.size = cfg_.size - static_cast<int>(excluded.size());
    int below = 0;
    for (int r : excluded) below += r < cfg_.rank ? 1 : 0;
    next->cfg_.rank = cfg_.rank - below;
    return next;
  }

 private:
  // Copies settings only; the caller gives the copy its communicator.
  NcclCommunicator(const NcclCommunicator& o) : cfg_(o.cfg_), abort_(o.abort_), device_(o.device_) {}

  Watch watch(const char* what) const { return Watch{abort_.get(), Clock::now() + cfg_.timeout, what}; }

  void check_args(const char* what, const void* in, const void* out, std::size_t count) const {
    if (count > 0 && (!in || !out)) throw Error(std::string(what) + ": null buffer");
    if (!comm_) throw WorkersFailed(std::string(what) + ": the NCCL communicator was aborted; rejoin first");
    if (abort_) abort_->check();
  }

  // Launches one operation (which may answer ncclInProgress) and waits for its stream.
  template <class Launch>
  void run(const char* what, void* stream, Launch&& launch) {
    Watch w = watch(what);
    check_cuda(cudaSetDevice(device_), std::string(what) + ": cudaSetDevice");
    auto s = static_cast<cudaStream_t>(stream);
    ncclResult_t r = launch(s);
    if (classify(r) == Outcome::workers_failed) comm_.abort();
    check_nccl(r, what);  // returns for success and ncclInProgress
    comm_.wait_ready(w);  // a non-blocking launch may still be enqueuing
    comm_.wait_stream(s, w);
  }

  DeviceCommConfig cfg_;
  std::shared_ptr<AbortSignal> abort_;
  int device_ = 0;
  NcclComm comm_;
};

}  // namespace

int nccl_device_count() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) throw Error(std::string("no CUDA device: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  if (n <= 0) throw Error("no CUDA device: cudaGetDeviceCount found none");
  return n;
}

std::unique_ptr<device::Communicator> make_nccl_communicator(const DeviceCommConfig& cfg, const IdExchange& exchange,
                                                             std::shared_ptr<AbortSignal> abort) {
  return std::make_unique<NcclCommunicator>(cfg, exchange, std::move(abort));
}

std::unique_ptr<device::Communicator> shrink_nccl_communicator(device::Communicator& old,
                                                               std::span<const int> excluded) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&old);
  if (!nccl) throw Error("nccl shrink: not an NCCL communicator");
  return nccl->shrink(excluded);
}

bool nccl_can_shrink(device::Communicator& c) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&c);
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

device::Memory nccl_memory_of(const void* p) {
  if (!p || !cuda_in_use()) return device::Memory::host;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // an unknown pointer is host memory; clear the error it left
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
