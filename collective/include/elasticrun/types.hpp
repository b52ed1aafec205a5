// Element types and reduction operators shared by the C++ and C APIs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace elasticrun {

// IEEE 754 half precision, stored as raw bits. Arithmetic goes through float.
struct float16 {
  std::uint16_t bits = 0;
};

// bfloat16 (the upper 16 bits of an IEEE float), stored as raw bits.
struct bfloat16 {
  std::uint16_t bits = 0;
};

enum class DataType : int { f16 = 0, bf16, f32, f64, i8, u8, i32, i64 };
enum class ReduceOp : int { sum = 0, avg, min, max, prod };

std::size_t size_of(DataType t);
const char* name_of(DataType t);
const char* name_of(ReduceOp op);

template <class T> struct dtype_of;
template <> struct dtype_of<float16> { static constexpr DataType value = DataType::f16; };
template <> struct dtype_of<bfloat16> { static constexpr DataType value = DataType::bf16; };
template <> struct dtype_of<float> { static constexpr DataType value = DataType::f32; };
template <> struct dtype_of<double> { static constexpr DataType value = DataType::f64; };
template <> struct dtype_of<std::int8_t> { static constexpr DataType value = DataType::i8; };
template <> struct dtype_of<std::uint8_t> { static constexpr DataType value = DataType::u8; };
template <> struct dtype_of<std::int32_t> { static constexpr DataType value = DataType::i32; };
template <> struct dtype_of<std::int64_t> { static constexpr DataType value = DataType::i64; };
template <class T> inline constexpr DataType dtype_of_v = dtype_of<T>::value;

// Errors thrown by the C++ API. The C API maps them to return codes.
//
// WorkersFailed: a peer died or the control plane aborted the epoch; the
//   caller restores its last commit and re-joins (elastic mode), or exits.
// HostsUpdated: membership grew or shrank without a failure; re-join and keep state.
// TimeoutError: a wait passed its deadline (peers hung, rendezvous unreachable).
// ProtocolError: a peer or the server sent something malformed or unauthenticated.
// Error: everything else (bad arguments, transport set-up failures).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class WorkersFailed : public Error {
 public:
  using Error::Error;
};
class HostsUpdated : public Error {
 public:
  using Error::Error;
};
class TimeoutError : public Error {
 public:
  using Error::Error;
};
class ProtocolError : public Error {
 public:
  using Error::Error;
};

}  // namespace elasticrun
