#include "common/frame.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace elasticrun {

std::array<std::uint8_t, kFrameHeader> encode_header(std::uint8_t type, std::uint32_t length) {
  return {static_cast<std::uint8_t>(kFrameMagic & 0xff), static_cast<std::uint8_t>(kFrameMagic >> 8),
          type, kFrameVersion,
          static_cast<std::uint8_t>(length), static_cast<std::uint8_t>(length >> 8),
          static_cast<std::uint8_t>(length >> 16), static_cast<std::uint8_t>(length >> 24)};
}

Result<std::uint32_t> decode_header(std::span<const std::uint8_t, kFrameHeader> h,
                                    std::uint32_t max_payload) {
  std::uint16_t magic = static_cast<std::uint16_t>(h[0] | (h[1] << 8));
  if (magic != kFrameMagic) return fail(fmt::format("bad frame magic 0x{:04x}", magic));
  if (h[3] != kFrameVersion) return fail(fmt::format("unsupported frame version {}", h[3]));
  std::uint32_t len = std::uint32_t{h[4]} | std::uint32_t{h[5]} << 8 | std::uint32_t{h[6]} << 16 |
                      std::uint32_t{h[7]} << 24;
  if (len > max_payload)
    return fail(fmt::format("frame of {} bytes exceeds the {}-byte limit", len, max_payload));
  return len;
}

wire::Bytes encode_frame(const Frame& f) {
  auto h = encode_header(f.type, static_cast<std::uint32_t>(f.payload.size()));
  wire::Bytes out(h.begin(), h.end());
  out.insert(out.end(), f.payload.begin(), f.payload.end());
  return out;
}

Result<void> FrameParser::feed(std::span<const std::uint8_t> data) {
  buf_.insert(buf_.end(), data.begin(), data.end());
  std::size_t pos = 0;
  while (buf_.size() - pos >= kFrameHeader) {
    std::span<const std::uint8_t, kFrameHeader> h(buf_.data() + pos, kFrameHeader);
    auto len = decode_header(h, max_);
    if (!len) return Failure{len.error()};
    if (buf_.size() - pos - kFrameHeader < *len) break;
    Frame f;
    f.type = h[2];
    f.payload.assign(buf_.begin() + pos + kFrameHeader, buf_.begin() + pos + kFrameHeader + *len);
    ready_.push_back(std::move(f));
    pos += kFrameHeader + *len;
  }
  buf_.erase(buf_.begin(), buf_.begin() + pos);
  return {};
}

Frame FrameParser::pop() {
  Frame f = std::move(ready_.front());
  ready_.pop_front();
  return f;
}

namespace {
int remaining_ms(FdChannel::Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - FdChannel::Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(std::min<long long>(left.count(), 1 << 30));
}
}  // namespace

Result<Frame> FdChannel::read(Clock::time_point deadline) {
  std::uint8_t buf[65536];
  while (!parser_.has_frame()) {
    pollfd p{rfd_, POLLIN, 0};
    int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return fail(fmt::format("poll: {}", std::strerror(errno)));
    if (r == 0) return fail("timed out waiting for a frame");
    ssize_t n = ::read(rfd_, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return fail(fmt::format("read: {}", std::strerror(errno)));
    if (n == 0) return fail("connection closed");
    if (auto ok = parser_.feed({buf, static_cast<std::size_t>(n)}); !ok) return Failure{ok.error()};
  }
  return parser_.pop();
}

Result<void> FdChannel::write(const Frame& f, Clock::time_point deadline) {
  wire::Bytes data = encode_frame(f);
  std::size_t off = 0;
  while (off < data.size()) {
    // A socket gets MSG_NOSIGNAL: a peer that went away is an error here, not a SIGPIPE
    // that kills a worker whose program left SIGPIPE at its default.
    ssize_t n = ::send(wfd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) n = ::write(wfd_, data.data() + off, data.size() - off);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) return fail(fmt::format("write: {}", std::strerror(errno)));
    pollfd p{wfd_, POLLOUT, 0};
    int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r == 0) return fail("timed out writing a frame");
  }
  return {};
}

}  // namespace elasticrun
