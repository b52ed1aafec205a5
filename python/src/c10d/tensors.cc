#include "c10d/tensors.h"

#include <c10/util/Exception.h>

#include <optional>

namespace elasticrun::python::c10d {

std::optional<DataType> library_type(at::ScalarType s) {
  switch (s) {
    case at::kHalf: return DataType::f16;
    case at::kBFloat16: return DataType::bf16;
    case at::kFloat: return DataType::f32;
    case at::kDouble: return DataType::f64;
    case at::kChar: return DataType::i8;
    case at::kByte: return DataType::u8;
    case at::kInt: return DataType::i32;
    case at::kLong: return DataType::i64;
    default: return std::nullopt;
  }
}

namespace {

void check_memory(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "elasticrun: ", op, ": the tensor is undefined");
  TORCH_CHECK(t.device().is_cpu(), "elasticrun: ", op, ": the tensor is on ", t.device(),
              "; the elasticrun backend takes CPU tensors only (move it with .cpu(), or use another backend)");
  TORCH_CHECK(t.layout() == at::kStrided, "elasticrun: ", op, ": the tensor's layout is ", t.layout(),
              "; the elasticrun backend takes dense (strided) tensors only");
  TORCH_CHECK(t.is_contiguous(), "elasticrun: ", op, ": the tensor (sizes ", t.sizes(), ", strides ", t.strides(),
              ") is not contiguous; pass tensor.contiguous() and copy the result back");
}

}  // namespace

Buffer reducible(const at::Tensor& t, const char* op) {
  check_memory(t, op);
  auto type = library_type(t.scalar_type());
  TORCH_CHECK(type, "elasticrun: ", op, ": element type ", t.scalar_type(),
              " is not supported (the elasticrun backend reduces Half, BFloat16, Float, Double, Char (int8), "
              "Byte (uint8), Int and Long)");
  return {t.data_ptr(), static_cast<std::size_t>(t.numel()), *type};
}

Buffer movable(const at::Tensor& t, const char* op) {
  check_memory(t, op);
  if (auto type = library_type(t.scalar_type())) return {t.data_ptr(), static_cast<std::size_t>(t.numel()), *type};
  return {t.data_ptr(), static_cast<std::size_t>(t.nbytes()), DataType::u8};
}

ReduceOp reduce_op(const ::c10d::ReduceOp& op, const char* what) {
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM: return ReduceOp::sum;
    case ::c10d::ReduceOp::AVG: return ReduceOp::avg;
    case ::c10d::ReduceOp::PRODUCT: return ReduceOp::prod;
    case ::c10d::ReduceOp::MIN: return ReduceOp::min;
    case ::c10d::ReduceOp::MAX: return ReduceOp::max;
    default: break;
  }
  TORCH_CHECK(false, "elasticrun: ", what, ": reduce op ", static_cast<int>(op.op_),
              " (BAND, BOR, BXOR or PREMUL_SUM) is not supported; use SUM, AVG, PRODUCT, MIN or MAX");
}

const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "elasticrun: ", op, ": takes one tensor (one per device, and the CPU is one), got ",
              ts.size());
  return ts[0];
}

void check_like(const std::vector<at::Tensor>& ts, const at::Tensor& like, std::size_t n, const char* op) {
  TORCH_CHECK(ts.size() == n, "elasticrun: ", op, ": expected a list of ", n, " tensors (one per rank), got ",
              ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i) {
    check_memory(ts[i], op);
    TORCH_CHECK(ts[i].scalar_type() == like.scalar_type() && ts[i].numel() == like.numel(), "elasticrun: ", op,
                ": tensor ", i, " of the list holds ", ts[i].numel(), " ", ts[i].scalar_type(),
                " elements, the other side ", like.numel(), " ", like.scalar_type());
  }
}

bool adjacent(const std::vector<at::Tensor>& ts) {
  for (std::size_t i = 1; i < ts.size(); ++i)
    if (static_cast<const char*>(ts[i].data_ptr()) !=
        static_cast<const char*>(ts[i - 1].data_ptr()) + ts[i - 1].nbytes())
      return false;
  return true;
}

}  // namespace elasticrun::python::c10d
