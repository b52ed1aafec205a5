#include <elasticrun/types.hpp>

namespace elasticrun {

std::size_t size_of(DataType t) {
  switch (t) {
    case DataType::f16:
    case DataType::bf16: return 2;
    case DataType::f32:
    case DataType::i32: return 4;
    case DataType::f64:
    case DataType::i64: return 8;
    case DataType::i8:
    case DataType::u8: return 1;
  }
  throw Error("unknown data type " + std::to_string(static_cast<int>(t)));
}

const char* name_of(DataType t) {
  switch (t) {
    case DataType::f16: return "f16";
    case DataType::bf16: return "bf16";
    case DataType::f32: return "f32";
    case DataType::f64: return "f64";
    case DataType::i8: return "i8";
    case DataType::u8: return "u8";
    case DataType::i32: return "i32";
    case DataType::i64: return "i64";
  }
  return "unknown";
}

const char* name_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::prod: return "prod";
  }
  return "unknown";
}

}  // namespace elasticrun
