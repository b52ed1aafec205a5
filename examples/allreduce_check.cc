// allreduce_check: a worker that verifies every collective, data type and reduce
// op of libelasticrun against a locally computed reference.
//
//   elasticrun -np 4 build/examples/allreduce_check
//
// Inputs are small integers that depend on the rank and the index, so the exact
// result is known in double precision; floating results are compared with a
// tolerance of half an ulp of their type (avg divides). Every allreduce algorithm
// (ring, recursive doubling, shared memory when all ranks share this host, and the
// hierarchical one when some host runs several ranks but not all), and
// the other collectives over UCX and shared memory, are exercised by switching
// ELASTICRUN_ALGORITHM, which the library reads per call.
// Prints "allreduce_check: OK (N checks)" and exits 0, or the first mismatch and exits 1.
#include <elasticrun/elasticrun.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using elasticrun::DataType;
using elasticrun::ReduceOp;
using Buf = std::vector<unsigned char>;

constexpr DataType kTypes[] = {DataType::f16, DataType::bf16, DataType::f32, DataType::f64,
                               DataType::i8,  DataType::u8,   DataType::i32, DataType::i64};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max, ReduceOp::prod};

// Small integers only: exact in every type, so no rounding is needed here.
std::uint16_t half_from_int(long v) {
  if (v == 0) return 0;
  std::uint16_t sign = v < 0 ? 0x8000 : 0;
  unsigned long a = static_cast<unsigned long>(v < 0 ? -v : v);
  int e = 0;
  while ((a >> (e + 1)) != 0) ++e;
  unsigned long man = (a << (10 - e)) & 0x3FF;
  return static_cast<std::uint16_t>(sign | ((e + 15) << 10) | man);
}

double half_to_double(std::uint16_t h) {
  int exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  double v = exp == 0 ? std::ldexp(man, -24) : exp == 31 ? INFINITY : std::ldexp(1024 + man, exp - 25);
  return (h & 0x8000) ? -v : v;
}

void put(DataType t, Buf& b, std::size_t i, long v) {
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

double get(DataType t, const Buf& b, std::size_t i) {
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

bool is_int(DataType t) { return t >= DataType::i8; }

class Checker {
 public:
  Checker(elasticrun::Communicator& c, const elasticrun::Topology& t)
      : c_(c), rank_(c.rank()), size_(c.size()), one_host_(t.local_size == t.size) {
    // A hierarchy exists when some host runs several ranks but not all of them:
    // every rank must agree, so take the largest host over all ranks.
    std::int32_t widest = t.local_size;
    c_.allreduce(&widest, &widest, 1, DataType::i32, ReduceOp::max);
    hierarchy_ = widest > 1 && widest < size_;
    if (rank_ == 0)
      std::printf("algorithms: ring rd%s%s\n", one_host_ ? " shm" : "", hierarchy_ ? " hier" : "");
    mag_ = std::max(1, std::min(4, 30 / size_));  // keeps i8 sums and f16 products exact
  }

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
    return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
  }

  void fail(const std::string& what, std::size_t i, double got, double want) {
    std::printf("allreduce_check: MISMATCH rank %d: %s at element %zu: got %g, want %g\n", rank_, what.c_str(), i,
                got, want);
    std::fflush(stdout);
    std::exit(1);
  }

  void allreduce(const char* algo, DataType t, ReduceOp op, std::size_t count, bool in_place) {
    Buf in = input(op, t, rank_, count), out(in.size());
    Buf& res = in_place ? in : out;
    c_.allreduce(in.data(), res.data(), count, t, op);
    std::string what = std::string("allreduce ") + algo + " " + elasticrun::name_of(t) + " " +
                       elasticrun::name_of(op) + " count " + std::to_string(count) + (in_place ? " in place" : "");
    for (std::size_t i = 0; i < count; ++i)
      if (double g = get(t, res, i), w = expected(op, t, i); !close(t, g, w)) fail(what, i, g, w);
    ++checks_;
  }

  void broadcast(DataType t, std::size_t count, int root) {
    Buf want = input(ReduceOp::sum, t, root, count);
    Buf buf = rank_ == root ? want : Buf(want.size(), 0xA5);
    c_.broadcast(buf.data(), count, t, root);
    if (buf != want) fail("broadcast root " + std::to_string(root) + " count " + std::to_string(count), 0, 0, 0);
    ++checks_;
  }

  void allgather(DataType t, std::size_t count, bool in_place) {
    std::size_t bytes = count * elasticrun::size_of(t);
    Buf want, in = input(ReduceOp::sum, t, rank_, count), out(bytes * size_);
    for (int r = 0; r < size_; ++r) {
      Buf part = input(ReduceOp::sum, t, r, count);
      want.insert(want.end(), part.begin(), part.end());
    }
    const unsigned char* src = in.data();
    if (in_place) {
      std::copy(in.begin(), in.end(), out.begin() + bytes * rank_);
      src = out.data() + bytes * rank_;
    }
    c_.allgather(src, out.data(), count, t);
    if (out != want) fail("allgather count " + std::to_string(count), 0, 0, 0);
    ++checks_;
  }

  void allgatherv(DataType t, std::size_t base) {
    std::vector<std::size_t> counts(size_);
    for (int r = 0; r < size_; ++r) counts[r] = r % 3 == 1 ? 0 : base + 13 * r;
    Buf want;
    for (int r = 0; r < size_; ++r) {
      Buf part = input(ReduceOp::sum, t, r, counts[r]);
      want.insert(want.end(), part.begin(), part.end());
    }
    Buf in = input(ReduceOp::sum, t, rank_, counts[rank_]), out(want.size());
    c_.allgatherv(in.data(), out.data(), counts, t);
    if (out != want) fail("allgatherv base " + std::to_string(base), 0, 0, 0);
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
    if (res != want) fail("alltoall count " + std::to_string(count), 0, 0, 0);
    ++checks_;
  }

  void run() {
    const std::size_t mib2 = 2u << 20;
    for (const char* algo : {"ring", "rd", "shm", "hier"}) {
      if (std::strcmp(algo, "shm") == 0 && !one_host_) continue;
      if (std::strcmp(algo, "hier") == 0 && !hierarchy_) continue;
      ::setenv("ELASTICRUN_ALGORITHM", algo, 1);
      for (DataType t : kTypes)
        for (ReduceOp op : kOps)
          for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1023}, mib2 / elasticrun::size_of(t) + 1})
            for (bool in_place : {false, true}) allreduce(algo, t, op, count, in_place);
    }
    // The other collectives: UCX ("ring" forces it for every collective), then
    // shared memory when every rank is on this host.
    for (const char* path : {"ring", "shm"}) {
      if (std::strcmp(path, "shm") == 0 && !one_host_) continue;
      ::setenv("ELASTICRUN_ALGORITHM", path, 1);
      others(mib2);
    }
    ::setenv("ELASTICRUN_ALGORITHM", "auto", 1);
  }

  void others(std::size_t mib2) {
    for (std::size_t count : {std::size_t{0}, std::size_t{5}, mib2 / 4 + 3})
      for (int root = 0; root < size_; ++root) broadcast(DataType::f32, count, root);
    for (DataType t : kTypes)
      for (std::size_t count : {std::size_t{0}, std::size_t{3}, std::size_t{70001}})
        for (bool in_place : {false, true}) {
          allgather(t, count, in_place);
          alltoall(t, count, in_place);
        }
    for (std::size_t base : {0u, 1u, 100003u}) allgatherv(DataType::i32, base);
    for (DataType t : kTypes)
      for (ReduceOp op : kOps)
        for (std::size_t count : {0u, 1u, 33333u}) reduce_scatter(t, op, count);
    for (int i = 0; i < 10; ++i) c_.barrier();
    ++checks_;
  }

  int checks() const { return checks_; }

 private:
  elasticrun::Communicator& c_;
  int rank_, size_;
  bool one_host_, hierarchy_ = false;
  int mag_ = 4, checks_ = 0;
};

}  // namespace

int main() {
  try {
    elasticrun::init();
    const elasticrun::Topology& t = elasticrun::context().topology();
    std::printf("rank %d/%d local %d/%d cross %d/%d host %s\n", t.rank, t.size, t.local_rank, t.local_size,
                t.cross_rank, t.cross_size, t.host.c_str());
    std::fflush(stdout);
    Checker checker(elasticrun::context().comm(), t);
    checker.run();
    std::printf("allreduce_check: OK (%d checks)\n", checker.checks());
    elasticrun::shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::printf("allreduce_check: ERROR rank %d: %s\n", elasticrun::initialized() ? elasticrun::rank() : -1, e.what());
    return 1;
  }
}
