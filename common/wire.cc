#include "common/wire.h"

#include <fmt/format.h>

namespace elasticrun::wire {

Encoder& Encoder::u8(std::uint8_t v) {
  buf_.push_back(v);
  return *this;
}

Encoder& Encoder::u32(std::uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  return *this;
}

Encoder& Encoder::u64(std::uint64_t v) {
  for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  return *this;
}

Encoder& Encoder::str(std::string_view s) {
  u32(static_cast<std::uint32_t>(s.size()));
  buf_.insert(buf_.end(), s.begin(), s.end());
  return *this;
}

Encoder& Encoder::bytes(std::span<const std::uint8_t> b) {
  u32(static_cast<std::uint32_t>(b.size()));
  buf_.insert(buf_.end(), b.begin(), b.end());
  return *this;
}

Encoder& Encoder::strings(const std::vector<std::string>& v) {
  u32(static_cast<std::uint32_t>(v.size()));
  for (const auto& s : v) str(s);
  return *this;
}

std::span<const std::uint8_t> Decoder::take(std::size_t n) {
  if (n > remaining())
    throw DecodeError(fmt::format("truncated message: need {} bytes at offset {}, have {}", n,
                                  pos_, remaining()));
  auto s = data_.subspan(pos_, n);
  pos_ += n;
  return s;
}

std::uint8_t Decoder::u8() { return take(1)[0]; }

std::uint32_t Decoder::u32() {
  auto b = take(4);
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t{b[i]} << (8 * i);
  return v;
}

std::uint64_t Decoder::u64() {
  auto b = take(8);
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{b[i]} << (8 * i);
  return v;
}

std::string Decoder::str() {
  std::uint32_t n = u32();
  if (n > max_string_) throw DecodeError(fmt::format("string of {} bytes exceeds the limit", n));
  auto b = take(n);
  return std::string(b.begin(), b.end());
}

Bytes Decoder::bytes() {
  std::uint32_t n = u32();
  if (n > max_string_) throw DecodeError(fmt::format("field of {} bytes exceeds the limit", n));
  auto b = take(n);
  return Bytes(b.begin(), b.end());
}

std::vector<std::string> Decoder::strings() {
  std::uint32_t n = u32();
  if (n > max_items_) throw DecodeError(fmt::format("list of {} items exceeds the limit", n));
  if (n > remaining() / 4) throw DecodeError("list longer than the message");
  std::vector<std::string> v;
  v.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) v.push_back(str());
  return v;
}

void Decoder::finish() const {
  if (remaining() != 0) throw DecodeError(fmt::format("{} trailing bytes", remaining()));
}

}  // namespace elasticrun::wire
