// Little-endian binary encoding of control-plane messages.
//
// Decoder reads untrusted bytes: every read is bounds-checked and a short or
// malformed buffer throws DecodeError (caught where the frame arrived, which closes
// that one connection). Nothing here asserts on peer input.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace elasticrun::wire {

using Bytes = std::vector<std::uint8_t>;

class DecodeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Encoder {
 public:
  Encoder& u8(std::uint8_t v);
  Encoder& u32(std::uint32_t v);
  Encoder& u64(std::uint64_t v);
  Encoder& i32(std::int32_t v) { return u32(static_cast<std::uint32_t>(v)); }
  Encoder& str(std::string_view s);  // u32 length + bytes
  Encoder& bytes(std::span<const std::uint8_t> b);
  Encoder& strings(const std::vector<std::string>& v);
  Bytes take() { return std::move(buf_); }
  const Bytes& buffer() const { return buf_; }

 private:
  Bytes buf_;
};

class Decoder {
 public:
  // `max_string` bounds each string/bytes field, `max_items` each list.
  explicit Decoder(std::span<const std::uint8_t> data, std::size_t max_string = 1 << 24,
                   std::size_t max_items = 1 << 16)
      : data_(data), max_string_(max_string), max_items_(max_items) {}

  std::uint8_t u8();
  std::uint32_t u32();
  std::uint64_t u64();
  std::int32_t i32() { return static_cast<std::int32_t>(u32()); }
  std::string str();
  Bytes bytes();
  std::vector<std::string> strings();
  // Throws unless every byte was consumed.
  void finish() const;
  std::size_t remaining() const { return data_.size() - pos_; }
  // Passes over the rest: fields a later version of the message added.
  void skip_rest() { pos_ = data_.size(); }

 private:
  std::span<const std::uint8_t> take(std::size_t n);
  std::span<const std::uint8_t> data_;
  std::size_t pos_ = 0;
  std::size_t max_string_, max_items_;
};

}  // namespace elasticrun::wire
