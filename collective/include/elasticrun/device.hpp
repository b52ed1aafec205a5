// Collectives on GPU memory (NCCL), and routing by where a buffer lives.
//
//   elasticrun::init();
//   elasticrun::device::Collectives coll(elasticrun::context());
//   coll.allreduce(d_grad, d_grad, n, elasticrun::DataType::f32, elasticrun::ReduceOp::avg, stream);
//
// Streams are `void*` (a cudaStream_t; null is the legacy default stream) so this header
// needs no CUDA headers. Each call enqueues the NCCL operation on the stream and returns
// when it has completed there, or throws: WorkersFailed / HostsUpdated when the control
// plane aborts the epoch, TimeoutError past ELASTICRUN_COLLECTIVE_TIMEOUT, Error for bad
// arguments or a build without the NCCL backend. NCCL has no timeouts and does not notice
// a dead peer on the same host, so waits never block in CUDA: they poll the stream, NCCL's
// async error, the abort flag and the deadline, and abort the communicator (ncclCommAbort)
// on abort or deadline. After any such error the communicator is unusable: make a new one
// after Context::rejoin() (Collectives does this by itself when the epoch changes).
//
// Device choice: ELASTICRUN_DEVICE=N (an index among the visible ones) when the user set
// it; else ELASTICRUN_DEVICE_HINT modulo the visible device count, which the daemon sets
// per worker (slot % GPUs, stable across epochs) unless the user set ELASTICRUN_DEVICE or
// CUDA_VISIBLE_DEVICES; otherwise `local_rank % device_count`. Call use_device(ctx)
// before allocating device buffers, so they live on the GPU the communicator uses.
//
// At a new epoch that only removed ranks, Collectives shrinks the previous communicator
// (ncclCommShrink) instead of building one afresh; ELASTICRUN_NCCL_SHRINK=0 disables it.
#pragma once

#include <elasticrun/elasticrun.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace elasticrun::device {

enum class Memory { host, device };

// Where `p` points (cudaPointerGetAttributes): device or managed memory is `device`,
// anything else (pageable, pinned, null) is `host`. Always `host` without the NCCL backend.
Memory memory_of(const void* p);

// True if this build has the NCCL backend and a CUDA device is visible; otherwise false
// with the reason in `*why` (if given), e.g. "no CUDA device: cudaErrorNoDevice".
bool available(std::string* why = nullptr);
// The NCCL version this library was built with (NCCL_VERSION_CODE, e.g. 22807 for 2.28.7),
// 0 when it was built without the NCCL backend; whether a device is visible does not matter.
int nccl_version();

// Makes this worker's device (see "Device choice" above) the calling thread's current
// CUDA device (cudaSetDevice) and returns its index. Throws Error without the backend
// or a device, for a malformed ELASTICRUN_DEVICE or ELASTICRUN_DEVICE_HINT, or an
// out-of-range ELASTICRUN_DEVICE.
int use_device(const Context& ctx);

// Makes `device` the calling thread's current CUDA device while it lives, then puts the
// previous one back; a thread that had none (CUDA would report 0, and going "back" would
// make a context on GPU 0) keeps `device`. Nothing for device < 0 or without the NCCL
// backend. Throws Error when cudaSetDevice fails.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device);
  ~CurrentDevice();
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = -1;
};

// Collectives on device buffers, for one epoch. Same shapes as elasticrun::Communicator;
// `count` is in elements; in == out means in place.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int device() const = 0;  // the CUDA device index it runs on

  virtual void allreduce(const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                         void* stream = nullptr) = 0;
  virtual void broadcast(void* buf, std::size_t count, DataType t, int root, void* stream = nullptr) = 0;
  virtual void allgather(const void* in, void* out, std::size_t count, DataType t, void* stream = nullptr) = 0;
  // in holds size()*count elements; out receives the reduced block at index rank().
  virtual void reduce_scatter(const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                              void* stream = nullptr) = 0;
  // in and out hold size()*count elements; block j of in goes to rank j.
  virtual void alltoall(const void* in, void* out, std::size_t count, DataType t, void* stream = nullptr) = 0;
};

// A device communicator for `ctx`'s current epoch. Collective: every rank of the epoch
// calls it. Throws Error without the backend or a device.
std::unique_ptr<Communicator> make_communicator(Context& ctx);

// One entry point for host and device buffers: device buffers go to a device
// communicator (made on first use, remade when ctx's epoch changes, on the device of
// the first one), host buffers to ctx.comm() (the stream is ignored; the caller has
// finished writing them). All ranks must pass buffers of the same kind to one call.
// Each call runs on the communicator's device (CurrentDevice) and leaves the calling
// thread's current device as it found it.
class Collectives {
 public:
  // `device`: the CUDA device to build the first communicator on, for a caller that
  // already placed its buffers (the Python package passes its tensors' device); -1 takes
  // the worker's device as "Device choice" above says.
  explicit Collectives(Context& ctx, int device = -1);
  ~Collectives();

  void allreduce(const void* in, void* out, std::size_t count, DataType t, ReduceOp op, void* stream = nullptr);
  void broadcast(void* buf, std::size_t count, DataType t, int root, void* stream = nullptr);
  void allgather(const void* in, void* out, std::size_t count, DataType t, void* stream = nullptr);
  void reduce_scatter(const void* in, void* out, std::size_t count, DataType t, ReduceOp op, void* stream = nullptr);
  void alltoall(const void* in, void* out, std::size_t count, DataType t, void* stream = nullptr);

 private:
  Communicator* device_for(const void* buf);  // null: use the host path

  Context& ctx_;
  std::unique_ptr<Communicator> dev_;
  std::uint64_t dev_epoch_ = 0;
  int device_ = -1;  // the CUDA device of the first communicator (or the caller's), kept for later epochs
};

}  // namespace elasticrun::device
