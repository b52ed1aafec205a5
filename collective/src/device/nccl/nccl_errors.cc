#include "device/nccl/nccl_errors.h"

#include <elasticrun/types.hpp>

namespace elasticrun::collective {

Outcome classify(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return Outcome::done;
    case ncclInProgress: return Outcome::pending;
    case ncclRemoteError: return Outcome::workers_failed;
    default: return Outcome::error;
  }
}

Outcome classify(cudaError_t e) {
  if (e == cudaSuccess) return Outcome::done;
  if (e == cudaErrorNotReady) return Outcome::pending;
  return Outcome::error;
}

const char* name_of(Outcome o) {
  switch (o) {
    case Outcome::done: return "done";
    case Outcome::pending: return "pending";
    case Outcome::workers_failed: return "workers_failed";
    case Outcome::error: return "error";
  }
  return "?";
}

void throw_if_failed(Outcome o, const std::string& what, const std::string& detail) {
  if (o == Outcome::workers_failed) throw WorkersFailed(what + ": " + detail);
  if (o == Outcome::error) throw Error(what + ": " + detail);
}

void check_nccl(ncclResult_t r, const std::string& what) {
  throw_if_failed(classify(r), what, std::string("nccl: ") + ncclGetErrorString(r));
}

void check_cuda(cudaError_t e, const std::string& what) {
  throw_if_failed(classify(e), what, std::string("cuda: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

}  // namespace elasticrun::collective
