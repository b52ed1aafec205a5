// The elastic State's MemoryOps on CUDA (device_backend.h's device_memory_ops).
//
// where() is device::memory_of (cudaPointerGetAttributes). copy() is cudaMemcpyAsync
// (cudaMemcpyDefault: the direction follows from the pointers) on the legacy default
// stream of the device that holds the device-side pointer, then a bounded poll of that
// stream (wait_stream_idle): never cudaStreamSynchronize, which could block forever
// behind a kernel of a dead communicator. Snapshot buffers are cudaMalloc'ed on the
// device of the item they mirror.
#include "control/settings.h"
#include "device/device_backend.h"
#include "device/nccl/nccl_errors.h"
#include "device/nccl/nccl_handle.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <elasticrun/device.hpp>

#include <string>

namespace elasticrun::collective {
namespace {

// The device a device pointer lives on, or -1 for host memory.
int device_of(const void* p) {
  if (!p) return -1;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  bool dev = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  return dev ? attr.device : -1;
}

// Whether the calling thread has a current CUDA context. cudaGetDevice cannot tell: a
// thread that never chose a device reports 0. The driver's cuCtxGetCurrent can, reached
// through the runtime so that libcuda stays unlinked. Unknown counts as yes.
bool thread_has_context() {
  static const PFN_cuCtxGetCurrent_v4000 get = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(fn);
  }();
  CUcontext ctx = nullptr;
  return !get || get(&ctx) != CUDA_SUCCESS || ctx != nullptr;
}

class CudaMemoryOps final : public MemoryOps {
 public:
  explicit CudaMemoryOps(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  device::Memory where(const void* p) override { return device_memory_of(p); }

  void copy(void* dst, const void* src, std::size_t bytes) override {
    int dev = device_of(dst);
    if (dev < 0) dev = device_of(src);
    device::CurrentDevice scope(dev);
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cudaStreamLegacy),
               "elastic state: cudaMemcpyAsync");
    // No abort signal: restore() runs while the failed epoch's abort is still raised.
    wait_stream_idle(cudaStreamLegacy, Watch{nullptr, Clock::now() + timeout_, "elastic state: copy"});
  }

  void* allocate_device(std::size_t bytes, const void* near) override {
    device::CurrentDevice scope(device_of(near));
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), "elastic state: cudaMalloc(" + std::to_string(bytes) + ") for a device snapshot");
    return p;
  }

  // cudaFree first makes the current device's context, so free from the pointer's device.
  void free_device(void* p) noexcept override {
    if (!p) return;
    try {
      device::CurrentDevice scope(device_of(p));
      cudaFree(p);
    } catch (...) {
      cudaFree(p);  // its device could not be made current: free from where we are
    }
  }

 private:
  std::chrono::milliseconds timeout_;
};

}  // namespace

std::shared_ptr<MemoryOps> device_memory_ops() {
  return std::make_shared<CudaMemoryOps>(settings::collective_timeout());
}

}  // namespace elasticrun::collective

namespace elasticrun::device {

// Only when they differ, and only back to a device the thread had chosen: cudaSetDevice
// creates the device's primary context (hundreds of MB), and "back" to the 0 that a
// thread without a device reports would put one on GPU 0.
CurrentDevice::CurrentDevice(int device) {
  int current = -1;
  if (device < 0 || cudaGetDevice(&current) != cudaSuccess || current == device) return;
  bool chosen = collective::thread_has_context();
  collective::check_cuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  if (chosen) previous_ = current;
}

CurrentDevice::~CurrentDevice() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

}  // namespace elasticrun::device
