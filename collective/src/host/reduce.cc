#include "host/reduce.h"

#include <algorithm>
#include <bit>
#include <type_traits>

namespace elasticrun::collective {
namespace {

inline float h2f(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000) << 16;
  std::uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24 is exact in float.
    float v = static_cast<float>(man) * 0x1p-24f;
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

// Shifts m right by `shift` bits, rounding to nearest with ties to even.
inline std::uint32_t shift_rne(std::uint32_t m, std::uint32_t shift) {
  std::uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  return r + ((rem > half || (rem == half && (r & 1))) ? 1 : 0);
}

inline std::uint16_t f2h(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  std::uint32_t sign = (x >> 16) & 0x8000, absx = x & 0x7FFFFFFF;
  if (absx > 0x7F800000) return static_cast<std::uint16_t>(sign | 0x7E00 | ((absx >> 13) & 0x3FF));
  if (absx >= 0x477FF000) return static_cast<std::uint16_t>(sign | 0x7C00);  // >= 65520 or inf
  if (absx < 0x38800000) {                                                   // below 2^-14
    if (absx <= 0x33000000) return static_cast<std::uint16_t>(sign);         // <= 2^-25: tie to 0
    std::uint32_t e = absx >> 23, m = (absx & 0x7FFFFF) | 0x800000;
    return static_cast<std::uint16_t>(sign | shift_rne(m, 126 - e));
  }
  // Normal: rebias the exponent and round the mantissa; a carry rolls into the
  // exponent, which is exactly the next representable value.
  std::uint32_t biased = absx - (112u << 23);
  return static_cast<std::uint16_t>(sign | shift_rne(biased, 13));
}

inline float bf2f(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

inline std::uint16_t f2bf(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<std::uint16_t>((x >> 16) | 0x40);
  x += 0x7FFF + ((x >> 16) & 1);
  return static_cast<std::uint16_t>(x >> 16);
}

// Integer arithmetic in the unsigned type of the same width, so overflow wraps.
template <class T> struct Wide {
  using U = std::make_unsigned_t<T>;
  static T add(T a, T b) { return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b))); }
  static T mul(T a, T b) {
    // Promote to at least unsigned int so that u8*u8 does not become signed int overflow.
    using P = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return static_cast<T>(static_cast<U>(static_cast<P>(static_cast<U>(a)) * static_cast<P>(static_cast<U>(b))));
  }
};

template <class T, class F>
void apply(void* dst, const void* a, const void* b, std::size_t n, F f) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < n; ++i) d[i] = f(x[i], y[i]);
}

template <class T>
void reduce_native(ReduceOp op, void* d, const void* a, const void* b, std::size_t n) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      if constexpr (std::is_integral_v<T>) return apply<T>(d, a, b, n, Wide<T>::add);
      else return apply<T>(d, a, b, n, [](T x, T y) { return x + y; });
    case ReduceOp::prod:
      if constexpr (std::is_integral_v<T>) return apply<T>(d, a, b, n, Wide<T>::mul);
      else return apply<T>(d, a, b, n, [](T x, T y) { return x * y; });
    case ReduceOp::min: return apply<T>(d, a, b, n, [](T x, T y) { return y < x ? y : x; });
    case ReduceOp::max: return apply<T>(d, a, b, n, [](T x, T y) { return x < y ? y : x; });
  }
}

// 16-bit floats: widen, combine in float, round back.
template <float (*Load)(std::uint16_t), std::uint16_t (*Store)(float)>
void reduce_half(ReduceOp op, void* d, const void* a, const void* b, std::size_t n) {
  auto lift = [](auto f) {
    return [f](std::uint16_t x, std::uint16_t y) { return Store(f(Load(x), Load(y))); };
  };
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return apply<std::uint16_t>(d, a, b, n, lift([](float x, float y) { return x + y; }));
    case ReduceOp::prod: return apply<std::uint16_t>(d, a, b, n, lift([](float x, float y) { return x * y; }));
    case ReduceOp::min: return apply<std::uint16_t>(d, a, b, n, lift([](float x, float y) { return y < x ? y : x; }));
    case ReduceOp::max: return apply<std::uint16_t>(d, a, b, n, lift([](float x, float y) { return x < y ? y : x; }));
  }
}

template <class T> void divide(void* buf, std::size_t n, int divisor) {
  // Integers divide in int64 so a world size above the type's range stays correct.
  using W = std::conditional_t<std::is_integral_v<T>, std::int64_t, T>;
  T* p = static_cast<T*>(buf);
  const W dv = static_cast<W>(divisor);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<T>(static_cast<W>(p[i]) / dv);
}

template <float (*Load)(std::uint16_t), std::uint16_t (*Store)(float)>
void divide_half(void* buf, std::size_t n, int divisor) {
  auto* p = static_cast<std::uint16_t*>(buf);
  const float dv = static_cast<float>(divisor);
  for (std::size_t i = 0; i < n; ++i) p[i] = Store(Load(p[i]) / dv);
}

}  // namespace

float half_to_float(std::uint16_t h) { return h2f(h); }
std::uint16_t float_to_half(float f) { return f2h(f); }
float bfloat16_to_float(std::uint16_t h) { return bf2f(h); }
std::uint16_t float_to_bfloat16(float f) { return f2bf(f); }

void reduce(DataType t, ReduceOp op, void* dst, const void* a, const void* b, std::size_t n) {
  switch (t) {
    case DataType::f16: return reduce_half<h2f, f2h>(op, dst, a, b, n);
    case DataType::bf16: return reduce_half<bf2f, f2bf>(op, dst, a, b, n);
    case DataType::f32: return reduce_native<float>(op, dst, a, b, n);
    case DataType::f64: return reduce_native<double>(op, dst, a, b, n);
    case DataType::i8: return reduce_native<std::int8_t>(op, dst, a, b, n);
    case DataType::u8: return reduce_native<std::uint8_t>(op, dst, a, b, n);
    case DataType::i32: return reduce_native<std::int32_t>(op, dst, a, b, n);
    case DataType::i64: return reduce_native<std::int64_t>(op, dst, a, b, n);
  }
}

void finalize_avg(DataType t, void* buf, std::size_t n, int divisor) {
  if (divisor == 1) return;
  switch (t) {
    case DataType::f16: return divide_half<h2f, f2h>(buf, n, divisor);
    case DataType::bf16: return divide_half<bf2f, f2bf>(buf, n, divisor);
    case DataType::f32: return divide<float>(buf, n, divisor);
    case DataType::f64: return divide<double>(buf, n, divisor);
    case DataType::i8: return divide<std::int8_t>(buf, n, divisor);
    case DataType::u8: return divide<std::uint8_t>(buf, n, divisor);
    case DataType::i32: return divide<std::int32_t>(buf, n, divisor);
    case DataType::i64: return divide<std::int64_t>(buf, n, divisor);
  }
}

}  // namespace elasticrun::collective
