#include "device/nccl/nccl_types.h"

#include <string>

namespace elasticrun::collective {

ncclDataType_t to_nccl(DataType t) {
  switch (t) {
    case DataType::f16: return ncclFloat16;
    case DataType::bf16: return ncclBfloat16;
    case DataType::f32: return ncclFloat32;
    case DataType::f64: return ncclFloat64;
    case DataType::i8: return ncclInt8;
    case DataType::u8: return ncclUint8;
    case DataType::i32: return ncclInt32;
    case DataType::i64: return ncclInt64;
  }
  throw Error("nccl: unknown data type " + std::to_string(static_cast<int>(t)));
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::prod: return ncclProd;
  }
  throw Error("nccl: unknown reduce op " + std::to_string(static_cast<int>(op)));
}

}  // namespace elasticrun::collective
