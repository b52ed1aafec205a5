// Framing for every control connection (driver<->daemon, worker<->rendezvous).
//
//   offset 0  u16 magic 0x5245 ("ER")   offset 2  u8 type   offset 3  u8 version
//   offset 4  u32 payload length (little endian)            offset 8  payload
//
// A frame whose magic, version or length is wrong is rejected before its payload is
// read, so garbage on a port costs at most 8 bytes of work.
#pragma once

#include "common/result.h"
#include "common/wire.h"

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <span>

namespace elasticrun {

inline constexpr std::size_t kFrameHeader = 8;
inline constexpr std::uint16_t kFrameMagic = 0x5245;
inline constexpr std::uint8_t kFrameVersion = 1;
inline constexpr std::uint32_t kMaxFramePayload = 16u << 20;

struct Frame {
  std::uint8_t type = 0;
  wire::Bytes payload;
};

std::array<std::uint8_t, kFrameHeader> encode_header(std::uint8_t type, std::uint32_t length);
// The payload length announced by a header, or why the header is bad.
Result<std::uint32_t> decode_header(std::span<const std::uint8_t, kFrameHeader> header,
                                    std::uint32_t max_payload = kMaxFramePayload);
wire::Bytes encode_frame(const Frame& f);

// Incremental parser for a byte stream: feed what arrived, take whole frames.
class FrameParser {
 public:
  explicit FrameParser(std::uint32_t max_payload = kMaxFramePayload) : max_(max_payload) {}
  // From now on, also for a frame whose header has arrived and whose payload has not.
  void set_max_payload(std::uint32_t max_payload) { max_ = max_payload; }
  // Returns an error once the stream is known to be bad; the connection must close.
  Result<void> feed(std::span<const std::uint8_t> data);
  bool has_frame() const { return !ready_.empty(); }
  Frame pop();
  // Bytes received that do not yet make a whole frame.
  std::size_t partial_bytes() const { return buf_.size(); }

 private:
  std::uint32_t max_;
  wire::Bytes buf_;
  std::deque<Frame> ready_;
};

// Blocking frame I/O on a file descriptor (socket or pipe), each call bounded by a deadline.
// Writing to a socket whose peer has gone is an error, never SIGPIPE.
class FdChannel {
 public:
  using Clock = std::chrono::steady_clock;
  FdChannel() = default;
  FdChannel(int read_fd, int write_fd) : rfd_(read_fd), wfd_(write_fd) {}
  Result<Frame> read(Clock::time_point deadline);
  Result<void> write(const Frame& f, Clock::time_point deadline);
  int read_fd() const { return rfd_; }

 private:
  int rfd_ = -1, wfd_ = -1;
  FrameParser parser_;
};

}  // namespace elasticrun
