// Reference values and checks of collectives, shared by allreduce_check (host memory)
// and device_collective_check (device memory through NCCL).
//
// Inputs are small integers that depend on the rank and the index, so the exact result
// is known in double precision; floating results are compared with a tolerance of about
// half an ulp of their type (avg divides), times a slack factor for implementations that
// round differently (NCCL's avg scales each input before summing). Checks<C> drives any C
// with the host-buffer calls of elasticrun::Communicator (allreduce, broadcast, allgather,
// reduce_scatter, alltoall); a mismatch prints "PROG: MISMATCH ..." and exits 1.
#pragma once

#include <elasticrun/elasticrun.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace collective_checks {

using elasticrun::DataType;
using elasticrun::ReduceOp;
using Buf = std::vector<unsigned char>;

inline constexpr DataType kTypes[] = {DataType::f16, DataType::bf16, DataType::f32, DataType::f64,
                                      DataType::i8,  DataType::u8,   DataType::i32, DataType::i64};
inline constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max, ReduceOp::prod};

// Small integers only: exact in every type, so no rounding is needed here.
inline std::uint16_t half_from_int(long v) {
  if (v == 0) return 0;
  std::uint16_t sign = v < 0 ? 0x8000 : 0;
  unsigned long a = static_cast<unsigned long>(v < 0 ? -v : v);
  int e = 0;
  while ((a >> (e + 1)) != 0) ++e;
  unsigned long man = (a << (10 - e)) & 0x3FF;
  return static_cast<std::uint16_t>(sign | ((e + 15) << 10) | man);
}

inline double half_to_double(std::uint16_t h) {
  int exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  double v = exp == 0 ? std::ldexp(man, -24) : exp == 31 ? INFINITY : std::ldexp(1024 + man, exp - 25);
  return (h & 0x8000) ? -v : v;
}

inline void put(DataType t, Buf& b, std::size_t i, long v) {
  unsigned char* p = b.data() + i * elasticrun::size_of(t);
  auto store = [p](auto x) { std::memcpy(p, &x, sizeof x); };
  switch (t) {
    case DataType::f16: return store(half_from_int(v));
    case DataType::bf16: {
      float f = static_cast<float>(v);
      std::uint32_t bits;
      std::memcpy(&bits, &f, 4);
      return store(static_cast<std::uint16_t>(bits >> 16));
    }
    case DataType::f32: return store(static_cast<float>(v));
    case DataType::f64: return store(static_cast<double>(v));
    case DataType::i8: return store(static_cast<std::int8_t>(v));
    case DataType::u8: return store(static_cast<std::uint8_t>(v));
    case DataType::i32: return store(static_cast<std::int32_t>(v));
    case DataType::i64: return store(static_cast<std::int64_t>(v));
  }
}

inline double get(DataType t, const Buf& b, std::size_t i) {
  const unsigned char* p = b.data() + i * elasticrun::size_of(t);
  auto load = [p](auto x) {
    std::memcpy(&x, p, sizeof x);
    return x;
  };
  switch (t) {
    case DataType::f16: return half_to_double(load(std::uint16_t{}));
    case DataType::bf16: {
      std::uint32_t bits = static_cast<std::uint32_t>(load(std::uint16_t{})) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DataType::f32: return load(float{});
    case DataType::f64: return load(double{});
    case DataType::i8: return load(std::int8_t{});
    case DataType::u8: return load(std::uint8_t{});
    case DataType::i32: return load(std::int32_t{});
    case DataType::i64: return static_cast<double>(load(std::int64_t{}));
  }
  return NAN;
}

inline bool is_int(DataType t) { return t >= DataType::i8; }

template <class Comm>
class Checks {
 public:
  // `prog` prefixes messages; `slack` widens the floating tolerance (1: half an ulp).
  Checks(Comm& c, int rank, int size, const char* prog, double slack = 1)
      : c_(c), rank_(rank), size_(size), prog_(prog), slack_(slack),
        mag_(std::max(1, std::min(4, 30 / size))) {}  // keeps i8 sums and f16 products exact

  // Rank- and index-dependent input; products stay tiny, sums within the types.
  long value(ReduceOp op, DataType t, int rank, std::size_t i) const {
    if (op == ReduceOp::prod) return (rank < 6 && (rank + i) % 3 == 0) ? 2 : 1;
    long v = static_cast<long>((rank * 7 + i * 3) % (2 * mag_ + 1));
    return t == DataType::u8 ? v : v - mag_;
  }
  Buf input(ReduceOp op, DataType t, int rank, std::size_t count, std::size_t off = 0) const {
    Buf b(count * elasticrun::size_of(t));
    for (std::size_t i = 0; i < count; ++i) put(t, b, i, value(op, t, rank, off + i));
    return b;
  }
  double expected(ReduceOp op, DataType t, std::size_t i) const {
    double acc = value(op, t, 0, i);
    for (int r = 1; r < size_; ++r) {
      double v = value(op, t, r, i);
      if (op == ReduceOp::min) acc = std::min(acc, v);
      else if (op == ReduceOp::max) acc = std::max(acc, v);
      else if (op == ReduceOp::prod) acc *= v;
      else acc += v;
    }
    if (op != ReduceOp::avg) return acc;
    return is_int(t) ? std::trunc(acc / size_) : acc / size_;
  }
  bool close(DataType t, double got, double want) const {
    double tol = t == DataType::f16 ? 1e-3 : t == DataType::bf16 ? 8e-3 : t == DataType::f32 ? 1e-6 : 1e-12;
    if (is_int(t)) return got == want;
    return std::fabs(got - want) <= slack_ * tol * std::max(1.0, std::fabs(want));
  }

  [[noreturn]] void fail(const std::string& what, std::size_t i, double got, double want) {
    std::printf("%s: MISMATCH rank %d: %s at element %zu: got %g, want %g\n", prog_, rank_, what.c_str(), i, got,
                want);
    std::fflush(stdout);
    std::exit(1);
  }

  void allreduce(const char* label, DataType t, ReduceOp op, std::size_t count, bool in_place) {
    Buf in = input(op, t, rank_, count), out(in.size());
    Buf& res = in_place ? in : out;
    c_.allreduce(in.data(), res.data(), count, t, op);
    std::string what = std::string("allreduce ") + label + " " + elasticrun::name_of(t) + " " +
                       elasticrun::name_of(op) + " count " + std::to_string(count) + (in_place ? " in place" : "");
    for (std::size_t i = 0; i < count; ++i)
      if (double g = get(t, res, i), w = expected(op, t, i); !close(t, g, w)) fail(what, i, g, w);
    ++checks_;
  }

  void broadcast(DataType t, std::size_t count, int root) {
    Buf want = input(ReduceOp::sum, t, root, count);
    Buf buf = rank_ == root ? want : Buf(want.size(), 0xA5);
    c_.broadcast(buf.data(), count, t, root);
    if (buf != want)
      fail(std::string("broadcast ") + elasticrun::name_of(t) + " root " + std::to_string(root) + " count " +
               std::to_string(count),
           0, 0, 0);
    ++checks_;
  }

  // In place: this rank's block already sits at its place in the output.
  void allgather(DataType t, std::size_t count, bool in_place) {
    std::size_t bytes = count * elasticrun::size_of(t);
    Buf want, in = input(ReduceOp::sum, t, rank_, count), out(bytes * size_);
    for (int r = 0; r < size_; ++r) {
      Buf part = input(ReduceOp::sum, t, r, count);
      want.insert(want.end(), part.begin(), part.end());
    }
    const unsigned char* src = in.data();
    if (in_place) {
      std::copy(in.begin(), in.end(), out.begin() + static_cast<std::ptrdiff_t>(bytes * rank_));
      src = out.data() + bytes * rank_;
    }
    c_.allgather(src, out.data(), count, t);
    if (out != want)
      fail(std::string("allgather ") + elasticrun::name_of(t) + " count " + std::to_string(count) +
               (in_place ? " in place" : ""),
           0, 0, 0);
    ++checks_;
  }

  void reduce_scatter(DataType t, ReduceOp op, std::size_t count) {
    Buf in = input(op, t, rank_, count * size_), out(count * elasticrun::size_of(t));
    c_.reduce_scatter(in.data(), out.data(), count, t, op);
    std::string what = std::string("reduce_scatter ") + elasticrun::name_of(t) + " " + elasticrun::name_of(op);
    for (std::size_t i = 0; i < count; ++i)
      if (double g = get(t, out, i), w = expected(op, t, count * rank_ + i); !close(t, g, w)) fail(what, i, g, w);
    ++checks_;
  }

  void alltoall(DataType t, std::size_t count, bool in_place) {
    Buf in = input(ReduceOp::sum, t, rank_, count * size_), out(in.size()), want;
    for (int r = 0; r < size_; ++r) {
      Buf part = input(ReduceOp::sum, t, r, count, count * rank_);
      want.insert(want.end(), part.begin(), part.end());
    }
    Buf& res = in_place ? in : out;
    c_.alltoall(in.data(), res.data(), count, t);
    if (res != want)
      fail(std::string("alltoall ") + elasticrun::name_of(t) + " count " + std::to_string(count) +
               (in_place ? " in place" : ""),
           0, 0, 0);
    ++checks_;
  }

  int checks() const { return checks_; }
  void count_check() { ++checks_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  Comm& c_;
  int rank_, size_;
  const char* prog_;
  double slack_;
  int mag_;
  int checks_ = 0;
};

}  // namespace collective_checks
