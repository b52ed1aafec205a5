// The rendezvous server's bounds, each against a misbehaving peer on a real socket:
// connections that never authenticate, a worker with too many requests waiting, a rank
// that gave up on a barrier, a worker that stops reading its connection.
#include "common/handshake.h"
#include "server_fixture.h"

#include <poll.h>
#include <sys/socket.h>

#include <atomic>

namespace elasticrun {
namespace {

using namespace std::chrono_literals;

// True if something arrives on `fd` within `ms` (the server's hello, once it accepted).
bool hears_within(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[256];
  return ::read(fd, buf, sizeof buf) > 0;
}

// A worker on a raw socket: connected, authenticated and joined at `host` `slot`, then
// driven frame by frame (`fd` is set to its socket; `rcvbuf`, if set, is applied first).
FdChannel raw_join(std::uint16_t port, const auth::Secret& secret, int& fd, const std::string& host, int slot,
                   int rcvbuf = 0) {
  fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (rcvbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  FdChannel ch(fd, fd);
  auto deadline = Clock::now() + std::chrono::seconds(5);
  handshake::Client hs(secret, "worker");
  auto hello = ch.read(deadline);
  EXPECT_TRUE(hello);
  if (!hello) return ch;
  EXPECT_TRUE(ch.write(msg::to_frame(hs.answer(msg::parse<msg::Hello>(*hello))), deadline));
  auto ok = ch.read(deadline);
  EXPECT_TRUE(ok && hs.verify(msg::parse<msg::AuthOk>(*ok)));
  EXPECT_TRUE(ch.write(msg::to_frame(msg::Join{host, static_cast<std::uint32_t>(slot),
                                               static_cast<std::uint32_t>(::getpid()), 1}),
                       deadline));
  auto joined = ch.read(deadline);
  EXPECT_TRUE(joined && joined->type == msg::kJoinOk);
  return ch;
}

class HandshakeCapTest : public RendezvousTest {
 protected:
  HandshakeCapTest() { limits_.max_handshakes = 3; }
};

// At the cap the server stops accepting: the next connection waits in the listen queue
// (no hello) until one of those that never authenticate is cut off at the handshake
// timeout (500 ms); a real worker that comes meanwhile still joins.
TEST_F(HandshakeCapTest, PeersThatNeverAuthenticateHoldAcceptingOnlyUntilTheirTimeout) {
  // The idle peers' timeouts start when the server accepts them, after t0: whatever the
  // connects take on a busy machine, the fourth cannot be accepted before t0 + 500 ms.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) {
    idle.push_back(raw_connect());
    EXPECT_TRUE(hears_within(idle.back(), 1000)) << "connection " << i << " under the cap gets its hello";
  }
  int waiting = raw_connect();  // the kernel completes the TCP handshake: it is in the listen queue
  const auto quiet = 400ms - std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  if (quiet > 0ms)
    EXPECT_FALSE(hears_within(waiting, static_cast<int>(quiet.count())))
        << "a fourth connection was accepted with three in their handshake";
  auto worker = std::async(std::launch::async, [&] { return join("h0", 0); });
  EXPECT_TRUE(hears_within(waiting, 3000)) << "accepting did not resume after the idle peers' timeout";
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 500ms);
  auto w = worker.get();
  EXPECT_EQ(w->joined().rank, 0);
  for (int fd : idle) ::close(fd);
  ::close(waiting);
  // Every handshake ended: the server accepts at once again.
  int later = raw_connect();
  EXPECT_TRUE(hears_within(later, 1000));
  ::close(later);
}

class WaitingCapTest : public RendezvousTest {
 protected:
  WaitingCapTest() { limits_.max_waiting = 4; }
};

// Requests written in order on one connection are handled in order: a raw worker
// makes the count on the server deterministic.
TEST_F(WaitingCapTest, OneRequestMoreThanTheLimitIsRefusedAndTheCountDrops) {
  int fd = -1;
  FdChannel ch = raw_join(server_->port(), secret_, fd, "h0", 0);
  auto deadline = Clock::now() + 10s;
  auto send = [&](const auto& m) { ASSERT_TRUE(ch.write(msg::to_frame(m), deadline)); };
  auto answer = [&](std::uint64_t req) -> Frame {
    auto f = ch.read(deadline);
    EXPECT_TRUE(f) << "no answer to request " << req;
    if (!f) return {};
    wire::Decoder d(f->payload);
    EXPECT_EQ(d.u64(), req);
    return *f;
  };
  auto error_text = [](const Frame& f) {
    wire::Decoder d(f.payload);
    return f.type == msg::kError ? msg::Error::decode(d).message : std::string("(not an error)");
  };
  for (std::uint64_t req = 1; req <= 4; ++req) send(msg::KvGet{req, "k" + std::to_string(req), 20000});
  send(msg::KvGet{5, "k5", 20000});
  EXPECT_NE(error_text(answer(5)).find("too many requests waiting"), std::string::npos);
  send(msg::Barrier{6, "b", 20000});
  EXPECT_NE(error_text(answer(6)).find("too many requests waiting"), std::string::npos);
  send(msg::Rejoin{7, 9});
  EXPECT_NE(error_text(answer(7)).find("too many requests waiting"), std::string::npos);
  // Another worker's requests are its own.
  auto setter = join("h0", 1);
  EXPECT_THROW(setter->get("other", Clock::now() + 100ms), TimeoutError);
  for (int i = 1; i <= 4; ++i) setter->set("k" + std::to_string(i), {static_cast<std::uint8_t>(i)});
  for (std::uint64_t req = 1; req <= 4; ++req) EXPECT_EQ(answer(req).type, msg::kKvValue);
  // Answered, they no longer count: a get waits again (and times out there).
  send(msg::KvGet{8, "k8", 100});
  EXPECT_NE(error_text(answer(8)).find("timed out"), std::string::npos);
  ::close(fd);
}

// A rank whose barrier timed out is answered an error by the server and no longer counts
// as arrived: the other two ranks must not pass that barrier without it.
TEST_F(RendezvousTest, ARankThatTimedOutAtABarrierNoLongerCountsAsArrived) {
  auto r0 = join("h0", 0), r1 = join("h0", 1), r2 = join("h1", 0);
  try {
    r0->barrier("b", Clock::now() + 200ms);
    FAIL() << "a barrier with one rank of three passed";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("timed out at barrier 'b'"), std::string::npos) << e.what();
  }
  auto a = std::async(std::launch::async, [&] { r1->barrier("b", Clock::now() + 700ms); });
  auto b = std::async(std::launch::async, [&] { r2->barrier("b", Clock::now() + 700ms); });
  EXPECT_THROW(a.get(), TimeoutError) << "ranks 1 and 2 passed a barrier rank 0 had left";
  EXPECT_THROW(b.get(), TimeoutError);
  // All three together pass it.
  auto x = std::async(std::launch::async, [&] { r1->barrier("b", Clock::now() + 5s); });
  auto y = std::async(std::launch::async, [&] { r2->barrier("b", Clock::now() + 5s); });
  r0->barrier("b", Clock::now() + 5s);
  x.get();
  y.get();
}

class SendQueueCapTest : public RendezvousTest {
 protected:
  SendQueueCapTest() { limits_.max_send_queue = 2 << 20; }
};

// A joined worker that asks for a 1 MiB value 64 times and never reads the answers is cut
// off at 2 MiB queued for it, and reported lost; the others are served on.
TEST_F(SendQueueCapTest, AWorkerThatDoesNotReadIsCutOff) {
  auto other = join("h0", 0);
  other->set("big", collective::Bytes(1 << 20, 7));
  int fd = -1;
  FdChannel ch = raw_join(server_->port(), secret_, fd, "h1", 0, 16 << 10);
  auto deadline = Clock::now() + 5s;
  for (std::uint64_t req = 1; req <= 64; ++req) {
    // Our own writes may fail once the server has cut us off.
    if (!ch.write(msg::to_frame(msg::KvGet{req, "big", 5000}), deadline)) break;
  }
  bool lost = false;
  for (auto end = Clock::now() + 5s; !lost && Clock::now() < end; std::this_thread::sleep_for(20ms))
    lost = on_io([&] { return std::find(lost_ranks_.begin(), lost_ranks_.end(), 2) != lost_ranks_.end(); });
  EXPECT_TRUE(lost) << "a worker with 64 MiB of answers unread was not cut off";
  ::close(fd);
  EXPECT_EQ(other->get("big", Clock::now() + 2s).size(), std::size_t{1} << 20);
}

}  // namespace
}  // namespace elasticrun

namespace elasticrun {
namespace {

// Copies bytes both ways between `a` and `b` until either side ends.
void pump(int a, int b) {
  char buf[65536];
  while (true) {
    pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    if (::poll(p, 2, 10000) <= 0) return;
    for (int i = 0; i < 2; ++i) {
      if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = ::read(p[i].fd, buf, sizeof buf);
      if (n <= 0 || ::write(p[1 - i].fd, buf, static_cast<std::size_t>(n)) != n) return;
    }
  }
}

// A connection reset before the server's hello (its listen queue overflowed under a crowd
// of workers connecting at once) is made again: a proxy in front of the server resets the
// first two connections it takes, then passes the third through. The worker joins.
TEST_F(RendezvousTest, AConnectionResetBeforeTheHelloIsMadeAgain) {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(lfd, 16), 0);
  ASSERT_EQ(::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  std::atomic<int> accepted{0};
  std::thread proxy([&] {
    while (true) {
      int c = ::accept(lfd, nullptr, nullptr);
      if (c < 0) return;
      if (++accepted <= 2) {
        linger reset{1, 0};
        ::setsockopt(c, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
        ::close(c);
        continue;
      }
      int s = raw_connect();
      pump(c, s);
      ::close(s);
      ::close(c);
      return;
    }
  });
  std::string via = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  try {
    auto w = std::make_unique<RendezvousClient>(via, secret_, "h0", 0, 1, Clock::now() + std::chrono::seconds(5));
    EXPECT_EQ(w->joined().rank, 0);
    EXPECT_EQ(accepted.load(), 3);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "the worker did not connect again: " << e.what();
  }
  ::shutdown(lfd, SHUT_RDWR);
  proxy.join();
  ::close(lfd);
}

}  // namespace
}  // namespace elasticrun
