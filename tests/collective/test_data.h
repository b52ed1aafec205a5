// Rank-dependent inputs and locally computed references for collective tests.
// Values are small integers so every reduction order gives the same bits. The inputs are
// written as examples/collective_checks.h writes them; the references here come from the
// library's own reduction kernels (bit-exact), where the examples compute theirs in double.
#pragma once

#include "collective_checks.h"  // examples/
#include "host/reduce.h"

#include <elasticrun/types.hpp>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace elasticrun::collective::testing {

using Buf = collective_checks::Buf;
using collective_checks::put;  // the examples' checks and these tests write inputs alike

// Products stay within 2^5 and sums within 20 in magnitude for up to 5 ranks.
inline long value(DataType t, ReduceOp op, int rank, std::size_t i) {
  if (op == ReduceOp::prod) return (rank + i) % 3 == 0 ? 2 : 1;
  long v = static_cast<long>((rank * 7 + i * 3) % 9);
  return t == DataType::u8 ? v : v - 4;
}

inline Buf input(DataType t, ReduceOp op, int rank, std::size_t count, std::size_t offset = 0) {
  Buf b(count * size_of(t));
  for (std::size_t i = 0; i < count; ++i) put(t, b, i, value(t, op, rank, offset + i));
  return b;
}

inline Buf reduced(DataType t, ReduceOp op, int size, std::size_t count, std::size_t offset = 0) {
  Buf acc = input(t, op, 0, count, offset);
  for (int r = 1; r < size; ++r) {
    Buf x = input(t, op, r, count, offset);
    reduce(t, accumulate_op(op), acc.data(), acc.data(), x.data(), count);
  }
  if (op == ReduceOp::avg) finalize_avg(t, acc.data(), count, size);
  return acc;
}

// Empty string when equal, else where the first difference is.
inline std::string diff(const Buf& got, const Buf& want, std::size_t elem) {
  if (got.size() != want.size()) return "size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) return "first mismatch at element " + std::to_string(i / elem);
  return {};
}

inline constexpr DataType kAllTypes[] = {DataType::f16, DataType::bf16, DataType::f32, DataType::f64,
                                         DataType::i8,  DataType::u8,   DataType::i32, DataType::i64};
inline constexpr ReduceOp kAllOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max, ReduceOp::prod};

}  // namespace elasticrun::collective::testing
