#include "host/reduce.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace elasticrun::collective {
namespace {

TEST(Half, KnownValuesRoundToNearestEven) {
  EXPECT_EQ(float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);  // tie at the top rounds to inf
  EXPECT_EQ(float_to_half(1e9f), 0x7C00);
  EXPECT_EQ(float_to_half(-INFINITY), 0xFC00);
  EXPECT_EQ(float_to_half(0x1p-24f), 0x0001);       // smallest subnormal
  EXPECT_EQ(float_to_half(0x1p-25f), 0x0000);       // tie to even: 0
  EXPECT_EQ(float_to_half(0x1.8p-25f), 0x0001);
  EXPECT_EQ(float_to_half(3 * 0x1p-25f), 0x0002);   // tie between 1 and 2 ulp: even
  EXPECT_EQ(float_to_half(1.0f + 0x1p-11f), 0x3C00);      // tie: keep even mantissa
  EXPECT_EQ(float_to_half(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie: round up to even
  EXPECT_EQ(float_to_half(0x1.ffcp-15f), 0x0400);  // subnormal rounding into the first normal
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(NAN))));
  EXPECT_EQ(half_to_float(0x3555), 0x1.554p-2f);
  EXPECT_EQ(half_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(half_to_float(0x7C00), INFINITY);
}

TEST(Half, EveryValueRoundTrips) {
  for (unsigned h = 0; h < 0x10000; ++h) {
    bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
    if (nan) continue;
    EXPECT_EQ(float_to_half(half_to_float(static_cast<std::uint16_t>(h))), h) << std::hex << h;
  }
}

#if defined(__FLT16_MAX__)
// The compiler's _Float16 conversion is IEEE round-to-nearest-even: compare on random floats.
TEST(Half, MatchesCompilerConversion) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    float f = std::bit_cast<float>((bits(rng) & 0x8FFFFFFF) | 0x30000000);  // bias toward half's range
    if (std::isnan(f)) continue;
    _Float16 ref = static_cast<_Float16>(f);
    EXPECT_EQ(float_to_half(f), std::bit_cast<std::uint16_t>(ref)) << f;
  }
}
#endif

TEST(BFloat16, RoundToNearestEven) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bfloat16(1.0f + 0x1p-8f), 0x3F80);
  EXPECT_EQ(float_to_bfloat16(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(float_to_bfloat16(1.0f + 0x1.2p-8f), 0x3F81);
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(NAN))));
  EXPECT_EQ(bfloat16_to_float(0x4049), 3.140625f);
}

template <class T>
std::vector<T> run(DataType t, ReduceOp op, std::vector<T> a, const std::vector<T>& b, int divisor = 1) {
  reduce(t, op, a.data(), a.data(), b.data(), a.size());
  if (op == ReduceOp::avg) finalize_avg(t, a.data(), a.size(), divisor);
  return a;
}

TEST(Reduce, Float32AllOps) {
  std::vector<float> a{1, -2, 3.5f}, b{4, 5, -1};
  EXPECT_EQ(run(DataType::f32, ReduceOp::sum, a, b), (std::vector<float>{5, 3, 2.5f}));
  EXPECT_EQ(run(DataType::f32, ReduceOp::prod, a, b), (std::vector<float>{4, -10, -3.5f}));
  EXPECT_EQ(run(DataType::f32, ReduceOp::min, a, b), (std::vector<float>{1, -2, -1}));
  EXPECT_EQ(run(DataType::f32, ReduceOp::max, a, b), (std::vector<float>{4, 5, 3.5f}));
  EXPECT_EQ(run(DataType::f32, ReduceOp::avg, a, b, 2), (std::vector<float>{2.5f, 1.5f, 1.25f}));
}

TEST(Reduce, Float64AndOutOfPlace) {
  std::vector<double> a{1.5, 2}, b{0.25, -8}, out(2);
  reduce(DataType::f64, ReduceOp::sum, out.data(), a.data(), b.data(), 2);
  EXPECT_EQ(out, (std::vector<double>{1.75, -6}));
  reduce(DataType::f64, ReduceOp::max, b.data(), a.data(), b.data(), 2);  // dst aliases b
  EXPECT_EQ(b, (std::vector<double>{1.5, 2}));
}

TEST(Reduce, IntegersWrapAndAvgTruncates) {
  std::vector<std::int8_t> a{127, -128, 7, -7}, b{1, -1, 0, 0};
  EXPECT_EQ(run(DataType::i8, ReduceOp::sum, a, b), (std::vector<std::int8_t>{-128, 127, 7, -7}));
  EXPECT_EQ(run(DataType::i8, ReduceOp::avg, std::vector<std::int8_t>{7, -7}, {0, 0}, 2),
            (std::vector<std::int8_t>{3, -3}));  // truncation toward zero
  std::vector<std::uint8_t> u{200, 3}, v{100, 5};
  EXPECT_EQ(run(DataType::u8, ReduceOp::sum, u, v), (std::vector<std::uint8_t>{44, 8}));
  EXPECT_EQ(run(DataType::u8, ReduceOp::prod, u, v), (std::vector<std::uint8_t>{32, 15}));
  EXPECT_EQ(run(DataType::u8, ReduceOp::min, u, v), (std::vector<std::uint8_t>{100, 3}));
  std::vector<std::int32_t> i{std::numeric_limits<std::int32_t>::max(), -5}, j{1, 3};
  EXPECT_EQ(run(DataType::i32, ReduceOp::sum, i, j),
            (std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::min(), -2}));
  EXPECT_EQ(run(DataType::i32, ReduceOp::max, i, j), (std::vector<std::int32_t>{i[0], 3}));
  std::vector<std::int64_t> k{1ll << 40, -9}, l{3, 2};
  EXPECT_EQ(run(DataType::i64, ReduceOp::prod, k, l), (std::vector<std::int64_t>{3ll << 40, -18}));
  EXPECT_EQ(run(DataType::i64, ReduceOp::avg, k, l, 3), (std::vector<std::int64_t>{((1ll << 40) + 3) / 3, -2}));
  // A world larger than the type's range still divides correctly.
  EXPECT_EQ(run(DataType::i8, ReduceOp::avg, std::vector<std::int8_t>{100}, {0}, 200), (std::vector<std::int8_t>{0}));
}

TEST(Reduce, HalfTypesRoundAfterEachStep) {
  auto h = [](float f) { return float_to_half(f); };
  std::vector<std::uint16_t> a{h(1), h(2048), h(-3), h(0.5f)}, b{h(2), h(1), h(4), h(0.25f)};
  auto sum = run(DataType::f16, ReduceOp::sum, a, b);
  EXPECT_EQ(half_to_float(sum[0]), 3.0f);
  EXPECT_EQ(half_to_float(sum[1]), 2048.0f);  // 2049 is a tie: rounds to even 2048
  EXPECT_EQ(half_to_float(sum[2]), 1.0f);
  auto mx = run(DataType::f16, ReduceOp::max, a, b);
  EXPECT_EQ(half_to_float(mx[2]), 4.0f);
  auto pr = run(DataType::f16, ReduceOp::prod, a, b);
  EXPECT_EQ(half_to_float(pr[3]), 0.125f);
  auto avg = run(DataType::f16, ReduceOp::avg, std::vector<std::uint16_t>{h(1)}, {h(0)}, 3);
  EXPECT_EQ(avg[0], float_to_half(1.0f / 3.0f));
  auto bf = [](float f) { return float_to_bfloat16(f); };
  std::vector<std::uint16_t> c{bf(256), bf(-1)}, d{bf(1), bf(-2)};
  auto bsum = run(DataType::bf16, ReduceOp::sum, c, d);
  EXPECT_EQ(bfloat16_to_float(bsum[0]), 256.0f);  // 257 needs 9 bits: ties to even
  EXPECT_EQ(bfloat16_to_float(bsum[1]), -3.0f);
  auto bmin = run(DataType::bf16, ReduceOp::min, c, d);
  EXPECT_EQ(bfloat16_to_float(bmin[1]), -2.0f);
}

}  // namespace
}  // namespace elasticrun::collective
