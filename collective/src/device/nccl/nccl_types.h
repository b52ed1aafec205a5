// The library's element types and reduction operators in NCCL's terms.
//
// NCCL 2.28 covers all of them natively: bf16 (ncclBfloat16) and avg (ncclAvg) both
// exist since 2.10, so no emulation (sum then scale) is needed. nccl_handle.cc refuses
// to build against an NCCL older than 2.27, the first with ncclCommShrink.
#pragma once

#include <elasticrun/types.hpp>

#include <nccl.h>

namespace elasticrun::collective {

ncclDataType_t to_nccl(DataType t);
ncclRedOp_t to_nccl(ReduceOp op);

}  // namespace elasticrun::collective
