// The elastic State's MemoryOps on CUDA (built with the NCCL backend only).
//
// where() is device::memory_of (cudaPointerGetAttributes). copy() is cudaMemcpyAsync
// (cudaMemcpyDefault: the direction follows from the pointers) on the legacy default
// stream of the device that holds the device-side pointer, then a bounded poll of that
// stream (wait_stream_idle): never cudaStreamSynchronize, which could block forever
// behind a kernel of a dead communicator. Snapshot buffers are cudaMalloc'ed on the
// device of the item they mirror.
#pragma once

#include <elasticrun/elastic.hpp>

#include <chrono>
#include <memory>

namespace elasticrun::collective {

std::shared_ptr<MemoryOps> make_cuda_memory_ops(std::chrono::milliseconds timeout);

}  // namespace elasticrun::collective
