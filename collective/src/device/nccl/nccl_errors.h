// Mapping NCCL and CUDA status codes to the library's typed errors.
//
// A pure function of the code, so it is unit-tested without a GPU. The policy:
//   ncclSuccess / cudaSuccess                  -> done
//   ncclInProgress / cudaErrorNotReady         -> pending (keep polling)
//   ncclRemoteError                            -> WorkersFailed: a peer or the network
//                                                 between us went away; re-join
//   ncclSystemError, ncclInvalidArgument,      -> Error: a fault of this process or its
//   ncclInvalidUsage, ncclInternalError,          host (NCCL also reports a full /dev/shm
//   ncclUnhandledCudaError, any CUDA error        or a failed bind as a system error), a
//                                                 bug or bad input: re-joining would only
//                                                 meet it again
// NCCL reports remote errors only for peers it reaches over the network, and never
// times out: a dead peer on the same host leaves a kernel spinning. That is why every
// wait also watches the control plane's AbortSignal and a deadline (nccl_handle.h).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

namespace elasticrun::collective {

enum class Outcome { done, pending, workers_failed, error };

Outcome classify(ncclResult_t r);
Outcome classify(cudaError_t e);
const char* name_of(Outcome o);

// Throws WorkersFailed or Error for a failed outcome with "<what>: <detail>"; returns
// for done and pending.
void throw_if_failed(Outcome o, const std::string& what, const std::string& detail);

// Convenience: classify and throw. `detail` is NCCL's / CUDA's error string.
void check_nccl(ncclResult_t r, const std::string& what);
void check_cuda(cudaError_t e, const std::string& what);

}  // namespace elasticrun::collective
