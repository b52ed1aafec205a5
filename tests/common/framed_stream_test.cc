// FramedStream over socket pairs and pipes: frames arrive whole and in order, the ends
// are reported, and nothing is called after close() or destruction.
#include "common/framed_stream.h"
#include "tests/common/run_until.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <optional>
#include <vector>

namespace elasticrun {
namespace {

namespace asio = boost::asio;

// Records what the stream tells it; `after_frame` may act on the stream.
struct Recorder : FramedStream::Handler {
  std::vector<Frame> frames;
  std::vector<StreamEnd> ends;
  int drained = 0;
  std::function<void()> after_frame;
  void on_stream_frame(Frame f) override {
    frames.push_back(std::move(f));
    if (after_frame) after_frame();
  }
  void on_stream_end(const StreamEnd& e) override { ends.push_back(e); }
  void on_stream_drained() override { ++drained; }
  std::size_t calls() const { return frames.size() + ends.size() + drained; }
};

Frame frame(std::uint8_t type, std::size_t size, std::uint8_t fill = 0) {
  Frame f;
  f.type = type;
  f.payload.assign(size, fill);
  for (std::size_t i = 0; i < size; ++i) f.payload[i] = static_cast<std::uint8_t>(fill + i);
  return f;
}

std::pair<int, int> socket_pair() {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  return {sv[0], sv[1]};
}

class FramedStreamTest : public ::testing::Test {
 protected:
  asio::io_context io_;
  Recorder a_, b_;
};

TEST_F(FramedStreamTest, FramesRoundTripOverASocket) {
  auto [x, y] = socket_pair();
  // A small read buffer: the large frame arrives in many pieces.
  FramedStream a(io_, x, x, a_), b(io_, y, y, b_, {kMaxFramePayload, 512});
  a.start();
  b.start();
  std::vector<Frame> sent{frame(1, 0), frame(2, 1, 7), frame(3, 300000, 3), frame(4, 10, 9)};
  for (const auto& f : sent) a.send(f);
  b.send(frame(9, 5));
  ASSERT_TRUE(testing::run_until(io_, [&] { return b_.frames.size() == sent.size() && a_.frames.size() == 1; }));
  for (std::size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(b_.frames[i].type, sent[i].type);
    EXPECT_EQ(b_.frames[i].payload, sent[i].payload) << "frame " << i;
  }
  EXPECT_EQ(a_.frames[0].payload, frame(9, 5).payload);
  EXPECT_TRUE(a_.ends.empty());
  EXPECT_TRUE(b_.ends.empty());
}

TEST_F(FramedStreamTest, FramesRoundTripOverTwoPipes) {
  int ab[2], ba[2];
  ASSERT_EQ(::pipe2(ab, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(ba, O_CLOEXEC), 0);
  FramedStream a(io_, ba[0], ab[1], a_), b(io_, ab[0], ba[1], b_);
  a.start();
  b.start();
  a.send(frame(5, 70000, 1));
  b.send(frame(6, 3, 2));
  ASSERT_TRUE(testing::run_until(io_, [&] { return b_.frames.size() == 1 && a_.frames.size() == 1; }));
  EXPECT_EQ(b_.frames[0].payload, frame(5, 70000, 1).payload);
  EXPECT_EQ(a_.frames[0].type, 6);
}

TEST_F(FramedStreamTest, WriteQueueKeepsOrderUnderManySends) {
  auto [x, y] = socket_pair();
  FramedStream a(io_, x, x, a_), b(io_, y, y, b_);
  b.start();
  constexpr int kFrames = 3000;
  std::size_t bytes = 0;
  // All queued before the first write completes; sizes vary so writes end mid-frame.
  for (int i = 0; i < kFrames; ++i) {
    Frame f = frame(static_cast<std::uint8_t>(i % 251), static_cast<std::size_t>((i * 7919) % 20000));
    wire::Encoder e;
    e.u32(static_cast<std::uint32_t>(i));
    f.payload.insert(f.payload.begin(), e.buffer().begin(), e.buffer().end());
    a.send(f);
    bytes += kFrameHeader + f.payload.size();
  }
  EXPECT_EQ(a.queued(), static_cast<std::size_t>(kFrames));  // the first write is asynchronous too
  EXPECT_EQ(a.queued_bytes(), bytes);
  ASSERT_TRUE(testing::run_until(io_, [&] { return b_.frames.size() == kFrames; }, std::chrono::seconds(20)));
  for (int i = 0; i < kFrames; ++i) {
    wire::Decoder d(b_.frames[i].payload);
    ASSERT_EQ(d.u32(), static_cast<std::uint32_t>(i));
    ASSERT_EQ(b_.frames[i].type, i % 251);
  }
  EXPECT_EQ(a.queued(), 0u);
  EXPECT_EQ(a.queued_bytes(), 0u);
  EXPECT_EQ(a_.drained, 1);
}

TEST_F(FramedStreamTest, CloseWithWritesAndReadPendingCallsNothing) {
  auto [x, y] = socket_pair();
  auto a = std::make_unique<FramedStream>(io_, x, x, a_);
  a->start();  // a read in flight
  for (int i = 0; i < 8; ++i) a->send(frame(1, 1 << 20));  // more than the socket holds: writes wait
  ASSERT_FALSE(testing::run_until(io_, [&] { return a->queued() == 0; }, std::chrono::milliseconds(100)));
  a->close();
  EXPECT_TRUE(a->closed());
  a->send(frame(2, 1));
  ::close(y);  // the peer goes: anything still listening would hear of it
  testing::run_until(io_, [] { return false; }, std::chrono::milliseconds(200));
  EXPECT_EQ(a_.calls(), 0u);
}

TEST_F(FramedStreamTest, DestroyWithIoPendingCallsNothing) {
  auto [x, y] = socket_pair();
  auto a = std::make_unique<FramedStream>(io_, x, x, a_);
  a->start();
  for (int i = 0; i < 8; ++i) a->send(frame(1, 1 << 20));
  io_.poll();
  a.reset();
  ::close(y);
  testing::run_until(io_, [] { return false; }, std::chrono::milliseconds(200));
  EXPECT_EQ(a_.calls(), 0u);
}

TEST_F(FramedStreamTest, HandlerMayDestroyTheStreamBetweenFrames) {
  auto [x, y] = socket_pair();
  FramedStream a(io_, x, x, a_);
  auto b = std::make_unique<FramedStream>(io_, y, y, b_);
  b_.after_frame = [&] { b.reset(); };
  b->start();
  for (int i = 0; i < 5; ++i) a.send(frame(1, 10));  // arrive together: one read
  ASSERT_TRUE(testing::run_until(io_, [&] { return !b; }));
  testing::run_until(io_, [] { return false; }, std::chrono::milliseconds(100));
  EXPECT_EQ(b_.frames.size(), 1u);
  EXPECT_TRUE(b_.ends.empty());
}

TEST_F(FramedStreamTest, ReportsEndOfFileAndBadStreams) {
  auto [x, y] = socket_pair();
  FramedStream a(io_, x, x, a_);
  a.start();
  ::close(y);
  ASSERT_TRUE(testing::run_until(io_, [&] { return !a_.ends.empty(); }));
  EXPECT_EQ(a_.ends[0].kind, StreamEnd::Kind::eof);

  auto [p, q] = socket_pair();
  FramedStream b(io_, p, p, b_);
  b.start();
  const char garbage[] = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_EQ(::write(q, garbage, sizeof garbage), static_cast<ssize_t>(sizeof garbage));
  ASSERT_TRUE(testing::run_until(io_, [&] { return !b_.ends.empty(); }));
  EXPECT_EQ(b_.ends[0].kind, StreamEnd::Kind::bad_stream);
  EXPECT_NE(b_.ends[0].detail.find("bad frame magic"), std::string::npos) << b_.ends[0].detail;
  EXPECT_TRUE(b_.frames.empty());
  ::close(q);
}

TEST_F(FramedStreamTest, WriteFailureDropsTheQueueAndKeepsReading) {
  auto [x, y] = socket_pair();
  FramedStream a(io_, x, x, a_);
  a.start();
  ::shutdown(y, SHUT_RD);  // our writes fail; the peer can still write to us
  Frame hello = frame(3, 4);
  auto bytes = encode_frame(hello);
  ASSERT_EQ(::write(y, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  a.send(frame(1, 10));
  ASSERT_TRUE(testing::run_until(io_, [&] { return !a_.ends.empty() && !a_.frames.empty(); }));
  EXPECT_EQ(a_.ends[0].kind, StreamEnd::Kind::write_error);
  EXPECT_EQ(a.queued(), 0u);
  ::close(y);
}

}  // namespace
}  // namespace elasticrun
