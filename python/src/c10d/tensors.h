// What the elasticrun process group accepts from torch: dense, contiguous CPU tensors.
// Reductions need an element type the library reduces (f16, bf16, f32, f64, i8, u8,
// i32, i64); collectives that only move data (broadcast, allgather, alltoall) take any
// type as bytes. Everything else is a clear error (c10::Error, a RuntimeError in Python)
// naming the operation and what to do, raised before anything is queued.
#pragma once

#include <elasticrun/types.hpp>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstddef>
#include <optional>
#include <vector>

namespace elasticrun::python::c10d {

// A tensor's memory as the library takes it.
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;  // elements of `type`
  DataType type = DataType::u8;
};

// The library's element type for torch's, if it has one.
std::optional<DataType> library_type(at::ScalarType s);

// Checks `t` (CPU, dense, contiguous) and returns its buffer in its own element type;
// an element type the library cannot reduce is an error.
Buffer reducible(const at::Tensor& t, const char* op);
// As reducible(), but a type the library has not got travels as bytes.
Buffer movable(const at::Tensor& t, const char* op);
// The library's op for torch's; BAND, BOR, BXOR and PREMUL_SUM are errors.
ReduceOp reduce_op(const ::c10d::ReduceOp& op, const char* what);

// Exactly one tensor (the CPU is one device): the process group's list arguments hold
// one tensor per device.
const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* op);
// `ts` (one per rank) all like `like`: same element type and size.
void check_like(const std::vector<at::Tensor>& ts, const at::Tensor& like, std::size_t n, const char* op);
// True when `ts` lie back to back in memory, in order (views of one buffer, as
// torch.empty(n * k).chunk(n) makes): the library can use them as one buffer.
bool adjacent(const std::vector<at::Tensor>& ts);

}  // namespace elasticrun::python::c10d
