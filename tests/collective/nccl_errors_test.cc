// ncclResult_t / cudaError_t → typed errors: a pure mapping, no GPU needed.
#include "device/nccl/nccl_errors.h"
#include "device/nccl/nccl_types.h"

#include <gtest/gtest.h>

namespace ec = elasticrun::collective;
using ec::Outcome;

TEST(NcclErrors, Classify) {
  EXPECT_EQ(ec::classify(ncclSuccess), Outcome::done);
  EXPECT_EQ(ec::classify(ncclInProgress), Outcome::pending);
  EXPECT_EQ(ec::classify(ncclRemoteError), Outcome::workers_failed);
  EXPECT_EQ(ec::classify(ncclSystemError), Outcome::error);  // local: /dev/shm, bind, allocation
  EXPECT_EQ(ec::classify(ncclInvalidArgument), Outcome::error);
  EXPECT_EQ(ec::classify(ncclInvalidUsage), Outcome::error);
  EXPECT_EQ(ec::classify(ncclInternalError), Outcome::error);
  EXPECT_EQ(ec::classify(ncclUnhandledCudaError), Outcome::error);
}

TEST(NcclErrors, ClassifyCuda) {
  EXPECT_EQ(ec::classify(cudaSuccess), Outcome::done);
  EXPECT_EQ(ec::classify(cudaErrorNotReady), Outcome::pending);
  EXPECT_EQ(ec::classify(cudaErrorNoDevice), Outcome::error);
  EXPECT_EQ(ec::classify(cudaErrorIllegalAddress), Outcome::error);
}

TEST(NcclErrors, TypedExceptions) {
  EXPECT_NO_THROW(ec::check_nccl(ncclSuccess, "x"));
  EXPECT_NO_THROW(ec::check_nccl(ncclInProgress, "x"));
  EXPECT_THROW(ec::check_nccl(ncclRemoteError, "allreduce"), elasticrun::WorkersFailed);
  for (ncclResult_t local : {ncclInvalidArgument, ncclSystemError}) {
    try {
      ec::check_nccl(local, "allreduce");
      FAIL() << "no throw";
    } catch (const elasticrun::WorkersFailed&) {
      FAIL() << ncclGetErrorString(local) << " is not a peer failure";
    } catch (const elasticrun::Error& e) {
      EXPECT_NE(std::string(e.what()).find("allreduce: nccl: "), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(ec::check_cuda(cudaErrorInvalidValue, "memcpy"), elasticrun::Error);
  EXPECT_NO_THROW(ec::check_cuda(cudaErrorNotReady, "query"));
}

TEST(NcclTypes, EveryTypeAndOpMaps) {
  using elasticrun::DataType;
  using elasticrun::ReduceOp;
  EXPECT_EQ(ec::to_nccl(DataType::f16), ncclFloat16);
  EXPECT_EQ(ec::to_nccl(DataType::bf16), ncclBfloat16);
  EXPECT_EQ(ec::to_nccl(DataType::f32), ncclFloat32);
  EXPECT_EQ(ec::to_nccl(DataType::f64), ncclFloat64);
  EXPECT_EQ(ec::to_nccl(DataType::i8), ncclInt8);
  EXPECT_EQ(ec::to_nccl(DataType::u8), ncclUint8);
  EXPECT_EQ(ec::to_nccl(DataType::i32), ncclInt32);
  EXPECT_EQ(ec::to_nccl(DataType::i64), ncclInt64);
  EXPECT_EQ(ec::to_nccl(ReduceOp::sum), ncclSum);
  EXPECT_EQ(ec::to_nccl(ReduceOp::avg), ncclAvg);
  EXPECT_EQ(ec::to_nccl(ReduceOp::min), ncclMin);
  EXPECT_EQ(ec::to_nccl(ReduceOp::max), ncclMax);
  EXPECT_EQ(ec::to_nccl(ReduceOp::prod), ncclProd);
  EXPECT_THROW(ec::to_nccl(static_cast<DataType>(99)), elasticrun::Error);
}
