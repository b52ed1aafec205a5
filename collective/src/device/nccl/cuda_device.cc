// The device queries of the NCCL backend (device_backend.h): which memory a pointer is,
// whether a device can be used, and choosing this worker's device.
#include "device/device_backend.h"
#include "device/device_config.h"
#include "device/nccl/nccl_errors.h"

#include <elasticrun/types.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <dlfcn.h>

#include <string>

namespace elasticrun::collective {
namespace {

// cudaGetDeviceCount, throwing Error("no CUDA device: <error>") when it fails or finds none.
int device_count() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) throw Error(std::string("no CUDA device: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  if (n <= 0) throw Error("no CUDA device: cudaGetDeviceCount found none");
  return n;
}

// Asking CUDA about a pointer initialises the runtime and makes a context on the
// current device (hundreds of MB of GPU memory, ~0.1-0.3 s) even for a program that only
// ever uses host memory. A process that has touched CUDA has the driver library loaded;
// if it is not, no pointer can be device memory and CUDA is left alone.
bool cuda_in_use() {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!driver) return false;
  ::dlclose(driver);  // drops only the reference RTLD_NOLOAD took
  return true;
}

// Errors that a fault inside a kernel leaves in the context for every later call.
bool is_sticky(cudaError_t e) {
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

}  // namespace

int use_device(int local_rank) {
  int device = select_device_from_env(local_rank, device_count());
  check_cuda(cudaSetDevice(device), "nccl: cudaSetDevice(" + std::to_string(device) + ")");
  return device;
}

device::Memory device_memory_of(const void* p) {
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

int device_backend_version() { return NCCL_VERSION_CODE; }

bool device_available(std::string* why) {
  try {
    device_count();
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

}  // namespace elasticrun::collective
