// Element-wise reduction kernels, one per (DataType, ReduceOp).
//
// Semantics, shared by every algorithm and by the test references:
// - Floating types reduce in their own precision; f16 and bf16 go through float
//   and round back to nearest, ties to even, after every pairwise step.
// - Integer sum and prod wrap modulo 2^bits (computed in the unsigned type, so
//   overflow is defined and the result does not depend on the reduction order).
// - avg reduces as sum, then finalize_avg() divides once by the world size; for
//   integers that is C++ division of the wrapped sum, truncating toward zero.
#pragma once

#include <elasticrun/types.hpp>

#include <cstddef>
#include <cstdint>

namespace elasticrun::collective {

// dst[i] = a[i] op b[i] for i < n. dst may be the same pointer as a or b.
void reduce(DataType t, ReduceOp op, void* dst, const void* a, const void* b, std::size_t n);

// buf[i] = buf[i] / divisor, applied once at the end of an avg reduction.
void finalize_avg(DataType t, void* buf, std::size_t n, int divisor);

// The op that is applied pairwise while reducing: avg accumulates as sum.
inline ReduceOp accumulate_op(ReduceOp op) { return op == ReduceOp::avg ? ReduceOp::sum : op; }

float half_to_float(std::uint16_t h);
std::uint16_t float_to_half(float f);  // round to nearest even; overflow gives inf
float bfloat16_to_float(std::uint16_t h);
std::uint16_t float_to_bfloat16(float f);  // round to nearest even; NaN stays NaN

}  // namespace elasticrun::collective
