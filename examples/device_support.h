// What the device-memory worker programs share: examples/device_collective_check,
// examples/device_elastic_check and bench/device_allreduce_bench (built only with the NCCL
// backend). CUDA and NCCL errors become elasticrun::Error; DeviceBuffer and up/down move
// bytes between host and device; Args reads flags, a bad one being a message and exit
// status 2; run_worker is the common main: status 77 without a device, 1 on an error.
#pragma once

#include <elasticrun/device.hpp>
#include <elasticrun/elasticrun.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <string>

namespace device_support {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw elasticrun::Error(std::string(what) + ": " + cudaGetErrorString(e));
}

inline void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw elasticrun::Error(std::string(what) + ": " + ncclGetErrorString(r));
}

// Device memory of at least one byte, so that even an empty buffer is a device pointer.
struct DeviceBuffer {
  explicit DeviceBuffer(std::size_t bytes) { check_cuda(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* b() { return static_cast<unsigned char*>(p); }
  void* p = nullptr;
};

// cudaMemcpy from pageable memory may return before its last DMA lands; a collective
// on a non-blocking stream does not wait for the legacy stream, so wait here.
inline void up(DeviceBuffer& d, const void* host, std::size_t bytes) {
  if (!bytes) return;
  check_cuda(cudaMemcpy(d.p, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  check_cuda(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
}
inline void down(void* host, const void* dev, std::size_t bytes) {
  if (bytes) check_cuda(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

// The command line, one flag at a time: `while (a.next()) { if (a.is("--x")) ... else
// a.unknown(); }`. A flag's value is taken by number() or choice(), which exit 2 with
// "PROG: ..." when it is missing or malformed.
class Args {
 public:
  Args(const char* prog, int argc, char** argv) : prog_(prog), argc_(argc), argv_(argv) {}

  bool next() {
    if (++i_ >= argc_) return false;
    flag_ = argv_[i_];
    return true;
  }
  bool is(const char* flag) const { return flag_ == flag; }

  // A non-negative decimal integer.
  long number() {
    const char* v = value();
    if (!v) error(flag_ + " needs a value");
    char* end = nullptr;
    errno = 0;
    long n = std::strtol(v, &end, 10);
    if (*v < '0' || *v > '9' || *end != '\0' || errno != 0)
      error(flag_ + " '" + v + "' is not a non-negative integer");
    return n;
  }

  // One of `allowed`; otherwise "FLAG 'V': want a, b or c".
  std::string choice(std::initializer_list<const char*> allowed) {
    const char* v = value();
    std::string want;
    std::size_t k = 0;
    for (const char* a : allowed) {
      if (v && std::string(v) == a) return v;
      if (k > 0) want += k + 1 == allowed.size() ? " or " : ", ";
      want += a;
      ++k;
    }
    error(flag_ + " '" + (v ? v : "") + "': want " + want);
  }

  [[noreturn]] void unknown() const { error("unknown argument '" + flag_ + "'"); }

  [[noreturn]] void error(const std::string& why) const {
    std::fprintf(stderr, "%s: %s\n", prog_, why.c_str());
    std::exit(2);
  }

 private:
  const char* value() { return i_ + 1 < argc_ ? argv_[++i_] : nullptr; }

  const char* prog_;
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string flag_;
};

// main's frame for a worker: elasticrun::init(), then (when `needs_device`) the device
// check and the choice of this rank's device, before any allocation; then
// body(context, device) (device -1 without one), whose value is the exit status, and
// shutdown(). Without a usable device it prints why and returns 77 ("skipped" for test
// harnesses); an exception is printed and returns 1.
template <class Body>
int run_worker(const char* prog, bool needs_device, Body&& body) {
  try {
    elasticrun::init();
    std::string why;
    if (needs_device && !elasticrun::device::available(&why)) {
      std::fprintf(stderr, "%s: %s\n", prog, why.c_str());
      return 77;
    }
    auto& ctx = elasticrun::context();
    int device = needs_device ? elasticrun::device::use_device(ctx) : -1;
    int rc = body(ctx, device);
    elasticrun::shutdown();
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", prog, e.what());
    return 1;
  }
}

}  // namespace device_support
